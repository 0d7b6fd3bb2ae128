"""The planner's decision core and its offline judge stay pure: no network, processes,
threads, clocks or logging, so the replay and the live loop run the very same decisions.

Every module under epp/planner/core/ and epp/planner/offline/ is pure, with no exceptions:
I/O belongs in live/, profiler/'s drivers or the thin CLI modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

PLANNER = Path(__file__).resolve().parents[2] / "epp" / "planner"
PURE_FOLDERS = ("core", "offline")
FORBIDDEN = {
    "aiohttp",
    "asyncio",
    "grpc",
    "http",
    "kubernetes",
    "logging",
    "requests",
    "socket",
    "subprocess",
    "threading",
    "time",
    "urllib",
    "zmq",
}


def pure_modules() -> list[Path]:
    return [p for folder in PURE_FOLDERS for p in sorted((PLANNER / folder).rglob("*.py"))]


def offences(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            names = ["open()"] if node.func.id == "open" else []
        else:
            continue
        found += [f"{path.name}:{node.lineno} {n}" for n in names if n.split(".")[0] in FORBIDDEN]
        found += [f"{path.name}:{node.lineno} open()" for n in names if n == "open()"]
    return found


def test_pure_planner_modules_do_no_io():
    modules = pure_modules()
    assert any(p.name == "types.py" for p in modules)
    bad = [o for p in modules for o in offences(p)]
    assert bad == [], "I/O in a pure planner module (move it to live/ or the CLI): " + str(bad)


def test_the_check_catches_an_offence(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import time\nfrom asyncio import sleep\nx = open('f')\n")
    assert offences(probe) == ["probe.py:1 time", "probe.py:2 asyncio", "probe.py:3 open()"]
