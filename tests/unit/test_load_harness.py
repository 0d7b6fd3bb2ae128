"""The pure parts of `make load` and `make soak`: reading locust's final statistics, the
verdict of a pass, and the soak's flatness figures."""

from __future__ import annotations

import json

import pytest

from epp.harness.load import LoadSummary, StatRow, percentile, read_final_stats
from epp.harness.soak import Sample, metric_value, slope_per_10min, verdict


def test_percentile_follows_locusts_rule():
    # 10 requests: 6 at 100 ms, 3 at 200 ms, 1 at 900 ms.
    times = {100: 6, 200: 3, 900: 1}
    # median: target int(10 * 0.5) = 5; from the top 900 (1 seen, 9 left > 5), 200 (4
    # seen, 6 left > 5), 100 (10 seen, 0 left <= 5) -> 100
    assert percentile(times, 10, 0.5) == 100
    # p90: target 9; 900 (1 seen) leaves 9 <= 9 -> 900
    assert percentile(times, 10, 0.9) == 900
    # p80: target 8; 900 leaves 9 > 8; 200 leaves 6 <= 8 -> 200
    assert percentile(times, 10, 0.8) == 200
    assert percentile({}, 0, 0.5) == 0


def entry(method: str, name: str, n: int, fails: int, times: dict, t0: float, t1: float):
    return {
        "method": method,
        "name": name,
        "num_requests": n,
        "num_failures": fails,
        "response_times": {str(k): v for k, v in times.items()},  # JSON keys are strings
        "start_time": t0,
        "last_request_timestamp": t1,
    }


def test_final_stats_are_read_with_rates_over_the_whole_run(tmp_path):
    path = tmp_path / "final.json"
    path.write_text(
        json.dumps(
            [
                entry("POST", "chat", 20, 0, {300: 20}, 100.0, 110.0),
                entry("METRIC", "TTFT", 20, 0, {50: 11, 80: 9}, 101.0, 110.0),
                # one request only: its rate is over the run, not its own instant
                entry("POST", "long-prompt", 1, 1, {900: 1}, 105.0, 105.0),
            ]
        )
    )
    rows = {(r.type, r.name): r for r in read_final_stats(path)}
    assert rows["POST", "chat"].rps == 2.0  # 20 requests over 100 s .. 110 s
    assert rows["POST", "long-prompt"].rps == 0.1
    # median: target int(20 * 0.5) = 10; the 9 at 80 ms leave 11 > 10, then 50 ms
    assert rows["METRIC", "TTFT"].median_ms == 50
    # p95: target 19; the 9 at 80 ms leave 11 <= 19 -> 80 ms
    assert rows["METRIC", "TTFT"].p95_ms == 80
    summary = LoadSummary(rows=list(rows.values()))
    assert summary.requests == 21  # POST rows only: METRIC samples are not requests
    assert summary.failures == 1
    assert summary.problems() == ["1 failures (see locust_failures.csv)"]


def test_a_run_without_requests_or_ttft_is_not_a_pass():
    assert set(LoadSummary().problems()) == {"no request was made", "no TTFT recorded"}
    row = StatRow("POST", "stream", 3, 0, 1.0, 1.0, 1.0, 1.0)
    assert LoadSummary(rows=[row], locust_exit=1).problems() == [
        "no TTFT recorded",
        "locust exited 1",
    ]


def test_metric_value_reads_an_unlabelled_sample_only():
    text = (
        "# HELP epp_event_loop_tasks x\n"
        "epp_event_loop_tasks 42.0\n"
        'epp_event_loop_tasks_other{a="b"} 7.0\n'
    )
    assert metric_value(text, "epp_event_loop_tasks") == 42.0
    assert metric_value(text, "inference_extension_prefix_indexer_size") is None


def test_slope_is_scaled_to_ten_minutes():
    # +1 MB every 60 s is +10 MB per 10 minutes
    assert slope_per_10min([0, 60, 120, 180], [100, 101, 102, 103]) == pytest.approx(10.0)
    assert slope_per_10min([0, 60], [5, 5]) == 0.0
    assert slope_per_10min([0], [5]) == 0.0


def sample(t: float, rss: float) -> Sample:
    return Sample(t, rss, 20, 30.0, 1000.0, 0, 0)


def test_verdict_compares_the_first_and_last_fifth_after_warmup():
    # warm-up (t < 100) at 50 MB is ignored; then 10 samples: 100 MB, rising to 109 MB
    samples = [sample(t, 50.0) for t in (0, 50)] + [
        sample(100 + 10 * i, 100.0 + i) for i in range(10)
    ]
    v = verdict(samples, warmup_s=100)
    # fifths of 10 samples are 2 samples: (100 + 101) / 2 and (108 + 109) / 2
    assert v["rss_mb"]["first_fifth_mean"] == 100.5
    assert v["rss_mb"]["last_fifth_mean"] == 108.5
    assert v["rss_mb"]["slope_per_10min"] == pytest.approx(60.0)  # 1 MB per 10 s, 60 per 600 s
    assert v["open_fds"]["slope_per_10min"] == 0.0
