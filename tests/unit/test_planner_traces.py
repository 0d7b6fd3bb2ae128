"""Trace parsing (Mooncake JSONL, Azure CSV), errors naming line and field, bucketing
with empty middles, the bursty generator and rate scaling."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest

from epp.planner.offline.tracegen import bursty, scale_rate
from epp.planner.offline.traces import (
    Arrival,
    TraceError,
    bucket,
    parse_azure,
    parse_mooncake,
    parse_trace,
)
from epp.planner.tracefile import load_trace

# The first minutes of the two public traces (tests/data/traces/README.md says where from).
TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"

MOONCAKE = """\
{"timestamp": 1000, "input_length": 100, "output_length": 10, "hash_ids": [0, 1]}
{"timestamp": 1500, "input_length": 300, "output_length": 30, "hash_ids": [0, 2]}

{"timestamp": 4000, "input_length": 200, "output_length": 20}
"""

AZURE = """\
TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:16:47.0000000,10,1
"""


def test_mooncake_times_are_seconds_from_the_first_request():
    a = parse_mooncake(MOONCAKE.splitlines())
    # 1000 ms is the start; 1500 ms -> 0.5 s; 4000 ms -> 3.0 s. The blank line is skipped.
    assert a == [
        Arrival(0.0, 100, 10, (0, 1)),
        Arrival(0.5, 300, 30, (0, 2)),
        Arrival(3.0, 200, 20, ()),
    ]


def test_azure_times_keep_the_sub_microsecond_rows_apart():
    a = parse_azure(AZURE.splitlines(keepends=True))
    # 18:15:50.995169 - 18:15:46.680590 = 4.314579 s; 18:16:47 - 18:15:46.68059 = 60.31941 s
    assert [x.t_s for x in a] == pytest.approx([0.0, 4.314579, 60.31941])
    assert [(x.isl, x.osl, x.hash_ids) for x in a] == [(374, 44, ()), (396, 109, ()), (10, 1, ())]


def test_format_is_detected_by_content():
    assert len(parse_trace(MOONCAKE.splitlines())) == 3
    assert len(parse_trace(AZURE.splitlines())) == 3
    assert parse_trace(["\n", *AZURE.splitlines()])[1].isl == 396


def test_unsorted_mooncake_is_sorted():
    lines = [
        '{"timestamp": 2000, "input_length": 1, "output_length": 1}',
        '{"timestamp": 0, "input_length": 2, "output_length": 1}',
    ]
    assert [x.isl for x in parse_mooncake(lines)] == [2, 1]


@pytest.mark.parametrize(
    "lines, message",
    [
        ([], "the trace is empty"),
        (["", "  "], "the trace is empty"),
        (["hello"], "line 1: unknown trace format"),
        (['{"timestamp": 0, "input_length": 1, "output_length": 1}', "{oops"], "line 2: not a"),
        (['{"timestamp": 0, "input_length": "x", "output_length": 1}'], "line 1: input_length"),
        (['{"timestamp": 0, "input_length": 5, "output_length": -1}'], "line 1: output_length"),
        (['{"timestamp": "a", "input_length": 5, "output_length": 1}'], "line 1: timestamp"),
        (['{"input_length": 5, "output_length": 1}'], "line 1: timestamp must be"),
        (
            ['{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1, "a"]}'],
            "line 1: hash_ids must be a list of integers",
        ),
        (["[1, 2]"], "line 1: unknown trace format"),
        (["TIMESTAMP,ContextTokens,GeneratedTokens"], "the trace is empty"),
        (["TIMESTAMP,Context,GeneratedTokens", "2023-11-16 18:15:46,1,1"], "lacks ContextTokens"),
        (
            ["TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:15:46,1.5,1"],
            "line 2: ContextTokens must be a non-negative integer, got '1.5'",
        ),
        (
            ["TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:15:46,1,1", "yesterday,1,1"],
            "line 3: TIMESTAMP must be a date and time",
        ),
        (
            ["TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:15:46,1"],
            "line 2: expected 3 fields, got 2",
        ),
    ],
)
def test_bad_traces_name_line_and_field(lines, message):
    with pytest.raises(TraceError, match=message):
        parse_trace(lines)


def test_json_line_that_is_not_an_object():
    with pytest.raises(TraceError, match="line 2: expected a JSON object, got list"):
        parse_mooncake(['{"timestamp": 0, "input_length": 1, "output_length": 1}', "[1]"])


def test_load_trace_names_the_file(tmp_path):
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 1, "output_length": 1}\n{"timestamp": 1}\n')
    with pytest.raises(TraceError, match=r"t\.jsonl: line 2: input_length"):
        load_trace(bad)
    with pytest.raises(TraceError, match="cannot read the trace"):
        load_trace(tmp_path / "missing.csv")
    binary = tmp_path / "b.csv"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(TraceError, match=r"b\.csv: "):
        load_trace(binary)


def test_bucket_keeps_empty_middle_intervals():
    arrivals = [Arrival(1.0, 100, 10), Arrival(5.0, 300, 30), Arrival(25.0, 50, 5)]
    b = bucket(arrivals, 10.0)
    # [0,10): 2 requests, mean ISL (100+300)/2 = 200, OSL 20; [10,20): none; [20,30): 1.
    assert [(x.start_s, x.count) for x in b] == [(0.0, 2), (10.0, 0), (20.0, 1)]
    assert (b[0].mean_isl, b[0].mean_osl) == (200.0, 20.0)
    assert math.isnan(b[1].mean_isl) and math.isnan(b[1].mean_osl)
    assert bucket([], 10.0) == []
    with pytest.raises(ValueError, match="interval_s"):
        bucket(arrivals, 0)


def test_the_public_traces_parse_and_bucket():
    """The first minutes of the real files (Mooncake's FAST'25 synthetic trace, Azure's
    2023 conversation trace): counts and spans as counted from the full files' rows."""
    mooncake = load_trace(TRACES / "mooncake-synthetic-2min.jsonl")
    azure = load_trace(TRACES / "azure-llm-conv-2023-5min.csv")
    assert len(mooncake) == 427 and 119 < mooncake[-1].t_s < 120
    assert len(azure) == 1445 and 4 * 60 < azure[-1].t_s < 5 * 60
    assert all(a.hash_ids for a in mooncake) and not any(a.hash_ids for a in azure)
    # Long prompts: a mean of 13,156 tokens over these two minutes (15,325 over all 17).
    assert sum(a.isl for a in mooncake) / len(mooncake) == pytest.approx(13156, rel=0.01)
    per_minute = bucket(azure, 60.0)
    assert len(per_minute) == 5 and sum(b.count for b in per_minute) == 1445


def test_bursty_has_quiet_minutes_and_bursts_and_is_seeded():
    a = bursty(seed=3, duration_s=3 * 3600, mean_rate=2.0)
    assert a == bursty(seed=3, duration_s=3 * 3600, mean_rate=2.0)
    assert a != bursty(seed=4, duration_s=3 * 3600, mean_rate=2.0)
    per_minute = [b.count for b in bucket(a, 60.0)]
    # Long-run rate: mean_rate by construction, within 30 % over 3 h (a few dozen bursts).
    assert len(a) / (3 * 3600) == pytest.approx(2.0, rel=0.3)
    # Quiet minutes: at least a third of the minutes have no request at all.
    assert sum(1 for c in per_minute if c == 0) > len(per_minute) / 3
    # Bursts: some minute carries >= 4x the mean (2 req/s x 60 s x 4 = 480).
    assert max(per_minute) >= 480
    assert all(1 <= x.isl <= 32768 and 1 <= x.osl <= 4096 for x in a)
    assert all(b.t_s >= a_.t_s for a_, b in itertools.pairwise(a))


def test_bursty_rejects_bad_arguments():
    with pytest.raises(ValueError, match="mean_rate"):
        bursty(seed=0, duration_s=60, mean_rate=0)
    with pytest.raises(ValueError, match="burst_factor must average above 1"):
        bursty(seed=0, duration_s=60, mean_rate=1, burst_factor=(0.5, 1.0))


def test_scale_rate():
    base = [Arrival(10.0, 5, 1, (0, 1)), Arrival(20.0, 6, 1, (0, 2)), Arrival(30.0, 7, 1, ())]
    assert scale_rate(base, 1) == base
    three = scale_rate(base, 3, seed=1, jitter_s=2.0)
    assert len(three) == 9
    # Copy j's ids are shifted by j x (max id + 1) = 3j: reuse (id 0) stays within a copy.
    assert sorted(a.hash_ids for a in three if a.isl in (5, 6)) == sorted(
        [(0, 1), (0, 2), (3, 4), (3, 5), (6, 7), (6, 8)]
    )
    assert all(abs(a.t_s - {5: 10, 6: 20, 7: 30}[a.isl]) <= 2.0 for a in three)
    assert three == scale_rate(base, 3, seed=1, jitter_s=2.0)
    # k = 2.5: two copies each plus a third with probability 1/2 -> between 6 and 9.
    assert 6 <= len(scale_rate(base, 2.5, seed=0)) <= 9
    with pytest.raises(ValueError, match="rate scale must be a positive number"):
        scale_rate(base, 0)
