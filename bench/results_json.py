"""One headline table as `docs/data/results/<suite>.json` (the BENCHMARKS page is built
from these files): suite, title, command, git commit, machine and its load, date,
columns, rows, notes."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def write_results(
    path: str | Path,
    title: str,
    columns: list[str],
    rows: list[list[Any]],
    notes: str,
    load_before: tuple[float, ...],
    load_after: tuple[float, ...],
    **extra: Any,
) -> None:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    out = {
        "suite": Path(path).stem,
        "title": title,
        "command": "python " + " ".join(sys.argv),
        "git_commit": commit,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, shared; load average "
        f"{load_before[0]:.1f} before, {load_after[0]:.1f} after",
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "columns": columns,
        "rows": rows,
        "notes": notes,
        **extra,
    }
    Path(path).write_text(json.dumps(out, indent=2) + "\n")
