"""`epp bench NAME ...`: run a benchmark from bench/ (not a package: loaded by path).

Only `routing` (bench/routing.py) is wired so far; its flags are its own
(`epp bench routing --help`).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"
BENCHMARKS = {"routing": "routing.py"}


def load(name: str) -> ModuleType:
    return load_path(BENCH_DIR / BENCHMARKS[name], f"epp_bench_{name}")


def load_path(path: Path, module_name: str) -> ModuleType:
    """A bench/ script as a module (bench/ is not a package), loaded once per name."""
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("benchmark", choices=sorted(BENCHMARKS), help="which benchmark")
    p.add_argument("bench_args", nargs=argparse.REMAINDER, help="its own flags")


def run(args: argparse.Namespace) -> int:
    return int(load(args.benchmark).main(list(args.bench_args)) or 0)
