"""`epp plan servegen`: ServeGen's generator (alibaba/ServeGen servegen/construct.py
`generate_workload`) on a hand-made client folder, tests/data/servegen-mini:

- client 0: 0.5 req/s Gamma(a=1, scale=2) in [0, 600), nothing in [600, 1200),
  0.25 req/s Weibull(c=0.8, scale=3) in [1200, 1800); lengths change at 1200 s;
- client 1: 1 req/s Gamma(a=0.25, scale=4) in [0, 600), then nothing; its 600 s length
  window has an empty field (skipped, as upstream's loader does);
- client 2: traffic, but no length file: left out, as upstream's loader does.

Window [600, 1200) has no traffic at all. A window carries ceil(rate x 600) - 1
requests: the rescaled gaps sum to the window, so the last arrival lands on its end.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from epp.planner.offline.servegen import ServeGenError, build_pool, generate, mooncake_lines
from epp.planner.offline.traces import parse_mooncake
from epp.planner.tracefile import load_servegen

MINI = Path(__file__).resolve().parents[1] / "data" / "servegen-mini"


@pytest.fixture(scope="module")
def pool():
    return load_servegen(MINI)


def test_clients_without_a_length_file_are_left_out(pool):
    assert [c.cid for c in pool.clients] == [0, 1]
    assert pool.absent == (2,)
    assert pool.end_s == 1800
    # client 1's 600 s window has an empty field: skipped, the 0 s one stays
    assert [ts for ts, _ in pool.clients[1].lengths] == [0]


@pytest.mark.parametrize("scale, counts", [(1.0, (299, 599, 0, 149)), (2.0, (599, 1199, 0, 299))])
def test_exact_counts_per_client_and_window(pool, scale, counts):
    w = generate(pool, 0.0, 1800.0, scale, seed=7)
    c0_first = int(np.sum((w.client == 0) & (w.t_s < 600)))
    c1_first = int(np.sum((w.client == 1) & (w.t_s < 600)))
    quiet = int(np.sum((w.t_s >= 600) & (w.t_s < 1200)))
    c0_last = int(np.sum((w.client == 0) & (w.t_s >= 1200)))
    assert (c0_first, c1_first, quiet, c0_last) == counts
    assert len(w) == sum(counts)
    assert set(w.client.tolist()) == {0, 1}
    assert np.all(np.diff(w.t_s) >= 0) and w.t_s[0] > 0 and w.t_s[-1] < 1800
    assert w.clients == 2


def test_lengths_come_from_the_latest_distribution(pool):
    w = generate(pool, 0.0, 1800.0, 1.0, seed=3)
    early0 = (w.client == 0) & (w.t_s < 600)
    assert set(w.isl[early0].tolist()) == {10, 20}
    # output 0 is drawn (probability 1/4) and written as 1
    assert set(w.osl[early0].tolist()) == {1, 5}
    late = w.t_s >= 1200
    assert set(w.isl[late].tolist()) == {300} and set(w.osl[late].tolist()) == {7}
    one = w.client == 1
    assert set(w.isl[one].tolist()) == {100, 200} and set(w.osl[one].tolist()) == {50}
    # one uniform per request for every field (upstream): the shortest answers (u <= 1/4)
    # come with the short prompt (u <= 1/2), the long prompt with the long answer
    assert np.all(w.isl[early0 & (w.osl == 1)] == 10)
    assert np.all(w.osl[early0 & (w.isl == 20)] == 5)


def test_arrivals_are_upstreams_draws(pool):
    """The first window's draws, in upstream's order: client 0's Gamma gaps, its
    lengths' uniforms, then client 1's Gamma gaps, from one RandomState(seed)."""
    seed = 11
    w = generate(pool, 0.0, 600.0, 1.0, seed=seed)
    rng = np.random.RandomState(seed)
    gaps0 = stats.gamma.rvs(a=1.0, scale=2.0, size=300, random_state=rng)
    rng.random_sample(299)
    gaps1 = stats.gamma.rvs(a=0.25, scale=4.0, size=600, random_state=rng)
    want0 = np.cumsum(gaps0 * (600 / gaps0.sum()))[:-1]
    want1 = np.cumsum(gaps1 * (600 / gaps1.sum()))[:-1]
    np.testing.assert_allclose(w.t_s[w.client == 0], want0, rtol=0, atol=1e-9)
    np.testing.assert_allclose(w.t_s[w.client == 1], want1, rtol=0, atol=1e-9)


def test_a_seed_gives_the_same_trace(pool):
    a = list(mooncake_lines(generate(pool, 0.0, 1800.0, 1.0, seed=5)))
    b = list(mooncake_lines(generate(pool, 0.0, 1800.0, 1.0, seed=5)))
    c = list(mooncake_lines(generate(pool, 0.0, 1800.0, 1.0, seed=6)))
    assert a == b and a != c and len(a) == len(c)


def test_a_span_inside_the_data_is_relative_and_truncated(pool):
    # [300, 1500): half of client 0's first window (150 gaps, 149 kept), half of
    # client 1's (300, 299), and half of client 0's Weibull window (75, 74) at 900 s on
    w = generate(pool, 300.0, 1200.0, 1.0, seed=1)
    assert len(w) == 149 + 299 + 74
    assert np.all(w.t_s[w.isl == 300] >= 900)


def test_the_lines_are_mooncake_the_replay_reads(pool):
    w = generate(pool, 0.0, 1800.0, 1.0, seed=2)
    lines = list(mooncake_lines(w))
    first = json.loads(lines[0])
    assert set(first) == {"timestamp", "input_length", "output_length", "hash_ids", "client"}
    arrivals = parse_mooncake(lines)
    assert len(arrivals) == len(w)
    assert [a.isl for a in arrivals] == w.isl.tolist()
    assert arrivals[-1].t_s == pytest.approx(w.t_s[-1] - w.t_s[0], abs=1e-6)


MM_TRACE = "0,0.1,1.0,Gamma,1.0,10.0\n"
MM_LENGTHS = {
    "0": {
        "text_tokens": "{100: 1.0}",
        "image_tokens": "{1000: 1.0}",
        "audio_tokens": "{0: 1.0}",
        "video_tokens": "{5000: 1.0}",
        "image_count": "{1: 0.5, 2: 0.5}",
        "audio_count": "{0: 1.0}",
        "video_count": "{0: 0.5, 1: 0.5}",
        "output_tokens": "{20: 1.0}",
    }
}


def test_multimodal_requests_add_every_items_tokens():
    pool = build_pool({3: MM_TRACE}, {3: json.dumps(MM_LENGTHS)})
    w = generate(pool, 0.0, 600.0, 1.0, seed=4)
    assert len(w) == 59
    images, videos = w.extra["image_tokens"], w.extra["video_tokens"]
    assert all(len(x) in (1, 2) and set(x) == {1000} for x in images)
    assert w.isl.tolist() == [100 + sum(i) + sum(v) for i, v in zip(images, videos, strict=True)]
    assert w.extra["audio_tokens"] == [[]] * 59
    assert set(w.osl.tolist()) == {20}
    line = json.loads(next(mooncake_lines(w)))
    assert line["image_tokens"] == images[0] and line["input_length"] == w.isl[0]


def test_reasoning_requests_carry_their_reason_ratio():
    lengths = {
        "0": {
            "input_tokens": "{50: 1.0}",
            "output_tokens": "{400: 1.0}",
            "reason_ratio": "{0.0: 0.5, 0.5: 0.0, 1.0: 0.5}",
        }
    }
    pool = build_pool({4: MM_TRACE}, {4: json.dumps(lengths)})
    w = generate(pool, 0.0, 600.0, 1.0, seed=4)
    assert set(w.extra["reason_ratio"]) == {0.0, 1.0}
    assert json.loads(next(mooncake_lines(w)))["reason_ratio"] in (0.0, 1.0)


@pytest.mark.parametrize(
    "start, hours, scale, message",
    [
        (0.0, 1.0, 1.0, "the data ends at hour 0.5"),
        (0.25, 0.5, 1.0, "the data ends at hour 0.5"),
        (0.0, 0.5, 0.0, "scale must be a positive number"),
        (0.0, 0.5, -1.0, "scale must be a positive number"),
    ],
)
def test_bad_spans_and_scales_are_errors(pool, start, hours, scale, message):
    with pytest.raises(ServeGenError, match=message):
        generate(pool, start * 3600, hours * 3600, scale, seed=0)


# -- the command ----------------------------------------------------------------------


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    from epp.cli import main

    code = main(["plan", "servegen", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_command_writes_a_trace_the_replay_reads(tmp_path, capsys):
    out = tmp_path / "day.jsonl"
    code, text, _ = run_cli(capsys, str(MINI), "--hours", "0.5", "--seed", "9", "-o", str(out))
    assert code == 0
    assert "1047 requests" in text and "left out: 2" in text
    assert len(out.read_text().splitlines()) == 1047
    again = tmp_path / "again.jsonl"
    run_cli(capsys, str(MINI), "--hours", "0.5", "--seed", "9", "-o", str(again))
    assert again.read_bytes() == out.read_bytes()


@pytest.mark.parametrize(
    "folder, args, message",
    [
        ("empty", (), "no chunk-<i>-trace.csv files"),
        ("missing", (), "not a folder of ServeGen client files"),
        ("mini", ("--hours", "2"), "the data ends at hour 0.5"),
        ("mini", ("--scale", "0"), "--scale must be a positive number"),
        ("mini", ("--scale", "-2"), "--scale must be a positive number"),
        ("mini", ("--start-hour", "-1"), "--start-hour must be 0 or more"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, folder, args, message):
    (tmp_path / "empty").mkdir()
    where = {"empty": tmp_path / "empty", "missing": tmp_path / "nope", "mini": MINI}[folder]
    code, _, err = run_cli(capsys, str(where), *args, "-o", str(tmp_path / "o.jsonl"))
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("epp plan servegen: error: ")
    assert message in err and "Traceback" not in err
