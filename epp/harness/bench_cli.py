"""`epp bench NAME [its flags]`: run a benchmark suite of bench/ (`epp bench --list`).

The suites live in the source checkout's bench/ package (`bench.SUITES` registers each
once); they start this checkout's processes and read its config/ and deploy/, so `epp
bench` runs from a checkout. A suite runs as its own script would (`python -m bench.X`):
its flags are its own (`epp bench routing --help`).
"""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]


def suites() -> dict:
    """`bench.SUITES`, with the checkout on the path; SystemExit naming the fix if this
    `epp` was installed without one."""
    if not (CHECKOUT / "bench" / "__init__.py").exists():
        raise SystemExit(
            "epp bench: the benchmarks are in the source checkout's bench/; run epp from a "
            "checkout (pip install -e .)"
        )
    if str(CHECKOUT) not in sys.path:
        sys.path.insert(0, str(CHECKOUT))
    from bench import SUITES

    return SUITES


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--list", action="store_true", help="list every suite and what it needs")
    p.add_argument("benchmark", nargs="?", metavar="NAME", help="the suite (see --list)")
    p.add_argument("bench_args", nargs=argparse.REMAINDER, help="its own flags")


def build_args(argv: list[str]) -> argparse.Namespace:
    """`epp bench`'s own parse of `argv` (tests, and callers without epp's CLI)."""
    p = argparse.ArgumentParser(prog="epp bench")
    add_arguments(p)
    return p.parse_args(argv)


def listing() -> str:
    rows = []
    for name, suite in sorted(suites().items()):
        line = f"{name:<20} {suite.summary()}  [bench/{suite.module}.py]"
        rows.append(line + (f"\n{'':<20} needs: {suite.needs}" if suite.needs else ""))
    return "\n".join(rows)


def run(args: argparse.Namespace) -> int:
    if args.list:
        print(listing())
        return 0
    table = suites()
    if args.benchmark is None:
        print("epp bench: name a suite (epp bench --list shows them)", file=sys.stderr)
        return 2
    if args.benchmark not in table:
        known = ", ".join(sorted(table))
        print(f"epp bench: unknown suite {args.benchmark!r}; one of: {known}", file=sys.stderr)
        return 2
    suite = table[args.benchmark]
    sys.argv = [f"epp bench {args.benchmark}", *args.bench_args]
    try:
        runpy.run_module(f"bench.{suite.module}", run_name="__main__", alter_sys=True)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0
