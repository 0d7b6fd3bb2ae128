"""Every benchmark suite is registered once and runnable as `epp bench NAME`."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from bench import SUITES
from epp.harness import bench_cli

ROOT = Path(__file__).resolve().parents[2]
# bench/ modules that are parts of suites, not suites (bench/__init__.py says which).
PARTS = {"routing_matrix", "routing_trace", "routing_vr", "routing_real", "slo_configs"}
PARTS |= {"minimal_extproc", "results", "__init__"}


def runnable(path: Path) -> bool:
    """The module has an `if __name__ == "__main__":` block."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            return True
    return False


def test_every_script_is_a_suite_once():
    modules = [s.module for s in SUITES.values()]
    assert len(modules) == len(set(modules))
    scripts = {p.stem for p in (ROOT / "bench").glob("*.py") if p.stem not in PARTS}
    assert scripts == set(modules)
    assert all(runnable(s.path) for s in SUITES.values())
    assert all(s.summary() for s in SUITES.values())


def test_list_names_every_suite_and_what_it_needs():
    out = subprocess.run(
        [sys.executable, "-m", "epp.cli", "bench", "--list"],
        capture_output=True, text=True, timeout=60, check=True, cwd=ROOT,
    ).stdout  # fmt: skip
    listed = [line.split()[0] for line in out.splitlines() if not line.startswith(" ")]
    assert listed == sorted(SUITES)
    assert "needs: valgrind for --instructions" in out


def test_a_suite_runs_with_its_own_flags(capsys):
    args = bench_cli.build_args(["planner-step", "--help"])
    assert bench_cli.run(args) == 0
    assert "policy.step" in capsys.readouterr().out


def test_an_unknown_suite_names_the_known_ones(capsys):
    assert bench_cli.run(bench_cli.build_args(["nope"])) == 2
    err = capsys.readouterr().err
    assert "unknown suite 'nope'" in err and "routing" in err
