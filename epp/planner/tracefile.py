"""The one place a trace file is opened: request traces and ServeGen client folders."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from epp.planner.offline.traces import Arrival, TraceError, parse_trace

if TYPE_CHECKING:
    from epp.planner.offline.servegen import Pool as ServeGenPool

_CHUNK = re.compile(r"chunk-(\d+)-(trace\.csv|dataset\.json)")


def load_trace(path: str | Path) -> list[Arrival]:
    """Arrivals from a Mooncake JSONL or Azure CSV file; every problem is a TraceError
    naming the file (and the line, for bad content)."""
    try:
        with open(path, encoding="utf-8", newline="") as f:
            return parse_trace(f)
    except OSError as e:
        raise TraceError(f"{path}: cannot read the trace: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not a text file (UTF-8 expected)") from None
    except TraceError as e:
        raise TraceError(f"{path}: {e}") from None


def load_servegen(folder: str | Path) -> ServeGenPool:
    """A ServeGen client folder (`chunk-<i>-trace.csv`, `chunk-<i>-dataset.json`) read
    into a pool; every problem is a ServeGenError naming the folder or file. (scipy is
    imported here, not by every trace read.)"""
    from epp.planner.offline.servegen import ServeGenError, build_pool

    root = Path(folder)
    if not root.is_dir():
        raise ServeGenError(f"{folder}: not a folder of ServeGen client files")
    traces: dict[int, str] = {}
    lengths: dict[int, str] = {}
    try:
        for p in sorted(root.iterdir()):
            m = _CHUNK.fullmatch(p.name)
            if m:
                kind = traces if m.group(2) == "trace.csv" else lengths
                kind[int(m.group(1))] = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ServeGenError(f"{folder}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ServeGenError(f"{folder}: a chunk file is not UTF-8 text") from None
    return build_pool(traces, lengths, label=f"{folder}: ")
