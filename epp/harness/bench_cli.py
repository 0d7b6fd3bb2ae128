"""`epp bench NAME [its flags]`: run a benchmark suite of bench/ (`epp bench --list`).

The suites live in the `bench` package, which ships with `epp` (`bench.SUITES` registers
each once). Those that read a source checkout's config/, deploy/, tests/ or the traces
beside it say so in `--list`, and refuse to start from an install with the fix named. A
suite runs as its own script would (`python -m bench.X`): its flags are its own (`epp
bench routing --help`).
"""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]


def suites() -> dict:
    """`bench.SUITES`: the installed package's, or the checkout's beside this `epp`."""
    if (CHECKOUT / "bench" / "__init__.py").exists() and str(CHECKOUT) not in sys.path:
        sys.path.insert(0, str(CHECKOUT))
    from bench import SUITES

    return SUITES


def in_checkout() -> bool:
    """Whether the `bench` package sits in a source checkout (config/ and deploy/ beside it)."""
    import bench

    root = Path(bench.__file__).resolve().parents[1]
    return (root / "config").is_dir() and (root / "deploy").is_dir()


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
        if suite.needs:
            line += f"\n{'':<20} needs: {suite.needs}"
        if suite.checkout:
            line += f"\n{'':<20} needs the source checkout: {suite.checkout}"
        rows.append(line)
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
    if suite.checkout and not in_checkout():
        print(
            f"epp bench {args.benchmark}: reads {suite.checkout} from a source checkout; run it "
            "from one (git clone, then pip install -e .)",
            file=sys.stderr,
        )
        return 2
    sys.argv = [f"epp bench {args.benchmark}", *args.bench_args]
    try:
        runpy.run_module(f"bench.{suite.module}", run_name="__main__", alter_sys=True)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0
