"""Request traces: Mooncake JSONL and Azure CSV lines -> arrivals; per-interval load;
(a generated bursty trace and rate scaling are in `tracegen.py`).

PURE: functions take lines (any iterable of str, e.g. an open file) and return data;
`epp.planner.tracefile.load_trace(path)` is the one function that opens a file.

Formats (../shared/traces/README.md):
- Mooncake JSONL (FAST'25 release; Dynamo's warm-up format, reference
  dynamo-planner.md §2.6): one object per line, `timestamp` in **milliseconds**,
  `input_length`, `output_length`, optional `hash_ids` (512-token prefix blocks).
- Azure LLM inference CSV (2023): header `TIMESTAMP,ContextTokens,GeneratedTokens`,
  ISO datetimes with 7 fractional digits.
Times become seconds from the first request. A bad line is a `TraceError` naming its
line number, the field and what was expected; an empty trace is an error too.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


class TraceError(ValueError):
    """A trace that cannot be read; the message names the line and the field."""


@dataclass(frozen=True, slots=True)
class Arrival:
    t_s: float  # seconds from the trace's start
    isl: int
    osl: int
    hash_ids: tuple[int, ...] = ()  # prefix blocks (Mooncake); empty when unknown


@dataclass(frozen=True, slots=True)
class IntervalLoad:
    """Requests arriving in `[start_s, start_s + interval)`; means are NaN when empty."""

    start_s: float
    count: int
    mean_isl: float
    mean_osl: float


def parse_trace(lines: Iterable[str]) -> list[Arrival]:
    """Mooncake or Azure, told apart by the first non-blank line."""
    it = iter(lines)
    for number, line in enumerate(it, 1):
        text = line.strip()
        if not text:
            continue
        rest = itertools.chain([line], it)
        if text.startswith("{"):
            return parse_mooncake(rest, first_line=number)
        if text.split(",")[0].strip().upper() == "TIMESTAMP":
            return parse_azure(rest, first_line=number)
        raise TraceError(
            f"line {number}: unknown trace format: expected Mooncake JSONL "
            '({"timestamp": ms, "input_length": ..., "output_length": ...}) or an Azure CSV '
            f"with header {','.join(AZURE_COLUMNS)}; got {text[:60]!r}"
        )
    raise TraceError("the trace is empty: no requests")


def parse_mooncake(lines: Iterable[str], *, first_line: int = 1) -> list[Arrival]:
    rows: list[tuple[float, int, int, tuple[int, ...]]] = []
    for number, line in enumerate(lines, first_line):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise TraceError(f"line {number}: not a JSON object ({e.msg})") from None
        if not isinstance(obj, dict):
            raise TraceError(f"line {number}: expected a JSON object, got {type(obj).__name__}")
        ts = _number(obj, "timestamp", number)
        isl = _count(obj.get("input_length"), "input_length", number)
        osl = _count(obj.get("output_length"), "output_length", number)
        rows.append((ts / 1000.0, isl, osl, _hash_ids(obj.get("hash_ids", []), number)))
    return _arrivals(rows)


def parse_azure(lines: Iterable[str], *, first_line: int = 1) -> list[Arrival]:
    reader = csv.reader(lines)
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise TraceError("the trace is empty: no requests") from None
    missing = [c for c in AZURE_COLUMNS if c not in header]
    if missing:
        raise TraceError(
            f"line {first_line}: Azure CSV header lacks {', '.join(missing)}; "
            f"expected {','.join(AZURE_COLUMNS)}, got {','.join(header)}"
        )
    i_ts, i_isl, i_osl = (header.index(c) for c in AZURE_COLUMNS)
    rows: list[tuple[datetime, int, int]] = []
    for row in reader:
        number = first_line + reader.line_num - 1
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) < len(header):
            raise TraceError(f"line {number}: expected {len(header)} fields, got {len(row)}")
        try:
            when = datetime.fromisoformat(row[i_ts].strip())
        except ValueError:
            raise TraceError(
                f"line {number}: TIMESTAMP must be a date and time like "
                f"2023-11-16 18:15:46.6805900, got {row[i_ts]!r}"
            ) from None
        isl = _count(row[i_isl].strip(), "ContextTokens", number)
        osl = _count(row[i_osl].strip(), "GeneratedTokens", number)
        rows.append((when, isl, osl))
    if not rows:
        raise TraceError("the trace is empty: no requests")
    t0 = rows[0][0]
    try:
        seconds = [((w - t0).total_seconds(), i, o, ()) for w, i, o in rows]
    except TypeError:
        raise TraceError("TIMESTAMP mixes times with and without a time zone") from None
    return _arrivals(seconds)


def _arrivals(rows: list[tuple[float, int, int, tuple[int, ...]]]) -> list[Arrival]:
    if not rows:
        raise TraceError("the trace is empty: no requests")
    t0 = min(r[0] for r in rows)
    out = [Arrival(t - t0, isl, osl, ids) for t, isl, osl, ids in rows]
    out.sort(key=lambda a: a.t_s)  # stable: ties keep file order
    return out


def _number(obj: dict, field: str, number: int) -> float:
    v = obj.get(field)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise TraceError(f"line {number}: {field} must be a non-negative number, got {v!r}")
    return float(v)


def _count(v: object, field: str, number: int) -> int:
    if isinstance(v, str) and v.isascii() and v.isdigit():
        return int(v)
    if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
        return v
    raise TraceError(f"line {number}: {field} must be a non-negative integer, got {v!r}")


def _hash_ids(v: object, number: int) -> tuple[int, ...]:
    if isinstance(v, list) and all(isinstance(h, int) and not isinstance(h, bool) for h in v):
        return tuple(v)
    raise TraceError(f"line {number}: hash_ids must be a list of integers, got {v!r}")


def bucket(arrivals: Sequence[Arrival], interval_s: float) -> list[IntervalLoad]:
    """Per-interval request count and mean ISL/OSL from t = 0 to the last arrival.

    Every interval is kept, empty ones included (count 0, NaN means): a quiet minute in
    the middle of traffic is a fact the predictors must see (Dynamo #10670; SLA-v1's
    `extract_metrics_from_mooncake` dropped empty buckets, reference §2.6)."""
    if not (interval_s > 0 and math.isfinite(interval_s)):
        raise ValueError(f"interval_s must be a positive number of seconds, got {interval_s}")
    if not arrivals:
        return []
    n = math.floor(max(a.t_s for a in arrivals) / interval_s) + 1
    counts = [0] * n
    isl = [0] * n
    osl = [0] * n
    for a in arrivals:
        k = math.floor(a.t_s / interval_s)
        counts[k] += 1
        isl[k] += a.isl
        osl[k] += a.osl
    return [
        IntervalLoad(
            start_s=k * interval_s,
            count=counts[k],
            mean_isl=isl[k] / counts[k] if counts[k] else math.nan,
            mean_osl=osl[k] / counts[k] if counts[k] else math.nan,
        )
        for k in range(n)
    ]
