"""The one place a trace file is opened (I/O; listed in the purity test's IO_MODULES)."""

from __future__ import annotations

from pathlib import Path

from epp.planner.offline.traces import Arrival, TraceError, parse_trace


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
