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
PARTS = {"routing_matrix", "routing_trace", "routing_vr", "routing_real", "routing_agent"}
PARTS |= {"slo_configs"}
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


def test_every_bench_module_with_a_main_is_registered():
    # minimal_extproc is the bare server `overhead` starts as its own process, not a suite.
    mains = {p.stem for p in (ROOT / "bench").glob("*.py") if runnable(p)} - {"minimal_extproc"}
    assert mains == {s.module for s in SUITES.values()}


def test_the_package_ships_bench():
    """What setuptools packages from pyproject's `packages.find` includes bench, so `epp
    bench NAME` runs from an install."""
    import tomllib

    from setuptools import find_packages

    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    shipped = find_packages(str(ROOT), include=find["packages"]["find"]["include"])
    assert "bench" in shipped and "epp" in shipped


def test_list_names_every_suite_and_what_it_needs():
    out = subprocess.run(
        [sys.executable, "-m", "epp.cli", "bench", "--list"],
        capture_output=True, text=True, timeout=60, check=True, cwd=ROOT,
    ).stdout  # fmt: skip
    listed = [line.split()[0] for line in out.splitlines() if not line.startswith(" ")]
    assert listed == sorted(SUITES)
    assert "needs: valgrind for --instructions" in out
    assert "needs the source checkout: deploy/envoy/" in out


def test_a_suite_runs_with_its_own_flags(capsys):
    args = bench_cli.build_args(["planner-step", "--help"])
    assert bench_cli.run(args) == 0
    assert "policy.step" in capsys.readouterr().out


def test_an_unknown_suite_names_the_known_ones(capsys):
    assert bench_cli.run(bench_cli.build_args(["nope"])) == 2
    err = capsys.readouterr().err
    assert "unknown suite 'nope'" in err and "routing" in err


def test_a_checkout_suite_refuses_to_run_from_an_install(monkeypatch, capsys):
    monkeypatch.setattr(bench_cli, "in_checkout", lambda: False)
    assert bench_cli.run(bench_cli.build_args(["body-flood", "--help"])) == 2
    err = capsys.readouterr().err
    assert "reads deploy/envoy/ from a source checkout" in err
    assert bench_cli.run(bench_cli.build_args(["planner-step", "--help"])) == 2
    assert bench_cli.run(bench_cli.build_args(["scheduler", "--help"])) == 0
