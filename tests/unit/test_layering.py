"""The package's layers, checked on the source: the request path never imports the
planner, and the product never imports the demo/test harness.

The planner reads what the request side measures (epp/records.py), so it depends on the
request side and not the other way round; only the composition root (`epp serve`'s
modules) and the status page, which shows the planner, may import it. The harness
(epp/harness/) starts processes for the demo, tests and benchmarks; product code that
needs a process primitive uses epp/procs.py, which both share.
"""

from __future__ import annotations

import ast
from pathlib import Path

EPP = Path(__file__).resolve().parents[2] / "epp"

# The composition root (`epp serve` and the modules it was split into), the status page,
# the planner itself, and the harness, which demonstrates it (`epp demo --planner`).
MAY_IMPORT_PLANNER = {
    "serve.py",
    "serve_args.py",
    "serve_options.py",
    "status",
    "planner",
    "harness",
}


def imported(path: Path) -> list[tuple[int, str]]:
    """Every absolute module an import statement names (TYPE_CHECKING ones included:
    a type that crosses a layer is a dependency too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return sorted(found)


def importers(package: str, allowed: set[str]) -> list[str]:
    """`file:line module` for each import of `package` from a module of epp/ whose first
    path part is not in `allowed`."""
    bad = []
    for path in sorted(EPP.rglob("*.py")):
        rel = path.relative_to(EPP)
        if rel.parts[0] in allowed or rel.parts[0] == "_proto_gen":
            continue
        for line, module in imported(path):
            if module == package or module.startswith(package + "."):
                bad.append(f"epp/{rel}:{line} {module}")
    return bad


def test_only_the_composition_root_and_status_import_the_planner():
    assert importers("epp.planner", MAY_IMPORT_PLANNER) == []


def test_only_the_harness_imports_the_harness():
    assert importers("epp.harness", {"harness"}) == []


def test_the_check_sees_an_import(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from epp.planner import x\n"
        "import epp.harness.procs\n"
    )
    assert imported(probe) == [(1, "typing"), (3, "epp.planner"), (4, "epp.harness.procs")]
