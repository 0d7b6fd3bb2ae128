"""One JSON result schema for every benchmark's headline (docs/data/results/<suite>.json),
which scripts/benchmarks_page.py turns into docs/BENCHMARKS.md.

    {"suite", "title", "command", "git_commit", "machine", "date",
     "columns": [...], "rows": [[...], ...], "notes": markdown}

`Result.measured(...)` fills the commit, machine (and its load) and date from where it
runs, so a suite only states what it measured and how to run it again; `extra` keys (raw
figures a table leaves out) are kept after the schema's fields.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "data" / "results"
FIELDS: dict[str, type] = {
    "suite": str,
    "title": str,
    "command": str,
    "git_commit": str,
    "machine": str,
    "date": str,
    "columns": list,
    "rows": list,
    "notes": str,
}


class ResultError(ValueError):
    pass


@dataclass
class Result:
    suite: str
    title: str
    command: str
    git_commit: str
    machine: str
    date: str
    columns: list[str]
    rows: list[list[object]]
    notes: str = ""
    extra: dict[str, object] = field(default_factory=dict, repr=False)

    @classmethod
    def measured(
        cls, suite: str, title: str, command: str, columns: list[str], rows: list[list[object]],
        notes: str = "", *, load: str = "", **extra: object,
    ) -> Result:  # fmt: skip
        """`load` replaces the load average read now (e.g. `load_span(before, after)`)."""
        return cls(
            suite, title, command, git_commit(), machine(load), today(), columns, rows, notes,
            dict(extra),
        )  # fmt: skip

    def to_json(self) -> dict[str, object]:
        data = {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"
        }
        check(data, f"{self.suite}.json")
        return {**data, **{k: v for k, v in self.extra.items() if k not in data}}

    def write(self, to: Path | str = RESULTS) -> Path:
        """To `to`/<suite>.json, or to `to` itself when it names a .json file."""
        to = Path(to)
        path = to if to.suffix == ".json" else to / f"{self.suite}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=2, ensure_ascii=False) + "\n")
        return path


def check(data: object, name: str) -> dict:
    """`data` in the schema, or ResultError naming the file and the field."""
    if not isinstance(data, dict):
        raise ResultError(f"{name}: must be an object")
    for key, kind in FIELDS.items():
        if not isinstance(data.get(key), kind):
            raise ResultError(f"{name}: field {key!r} must be a {kind.__name__}")
    width = len(data["columns"])
    for i, row in enumerate(data["rows"]):
        if not isinstance(row, list) or len(row) != width:
            raise ResultError(f"{name}: rows[{i}] must be a list of {width} cells")
    return data


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, timeout=10, check=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip()


def machine(load: str = "") -> str:
    """CPUs, architecture, Python and the load average (now, unless `load` says it)."""
    if not load and hasattr(os, "getloadavg"):
        load = f"load average {os.getloadavg()[0]:.1f}"
    tail = f", {load}" if load else ""
    return f"{os.cpu_count()} CPUs, {platform.machine()}, Python {platform.python_version()}{tail}"


def load_span(before: tuple[float, ...], after: tuple[float, ...]) -> str:
    """The 1-minute load average before and after a run (the machine is shared)."""
    return f"load average {before[0]:.1f} before, {after[0]:.1f} after"


def command_line(argv: list[str] | None = None) -> str:
    """How this run was started, to run it again: `python bench/X.py ...` (under `epp
    bench` too: runpy puts the module's file in argv[0])."""
    argv = list(sys.argv if argv is None else argv)
    if argv and Path(argv[0]).is_absolute() and Path(argv[0]).is_relative_to(ROOT):
        argv[0] = str(Path(argv[0]).relative_to(ROOT))
    return " ".join(["python", *argv])


def today() -> str:
    return datetime.datetime.now(datetime.UTC).date().isoformat()
