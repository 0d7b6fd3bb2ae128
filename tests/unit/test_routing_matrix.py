"""bench/routing_matrix.py's objective rules: when a stage is sustained, each setup's knee,
and the prefix-win verdict, on hand-made rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import routing_matrix

PATH = Path(__file__).resolve().parents[2] / "bench" / "routing_matrix.py"


@pytest.fixture(scope="module")
def m():
    return routing_matrix


def row(setup, rate, tok_s, p90, first=0.02, second=0.02, errors=0, scenario="s"):
    # 50 output tokens per request, offered = rate: serving all of it is rate × 50 tok/s.
    return {
        "scenario": scenario,
        "setup": setup,
        "rate": rate,
        "offered": rate,
        "requests": 100,
        "output_tokens": 50,
        "tok_s": tok_s,
        "ttft_p90": p90,
        "ttft_p99": p90,
        "errors": errors,
        "ttft_p90_first": first,
        "ttft_p90_second": second,
    }


def test_a_stage_is_sustained_when_served_in_full_without_a_growing_queue(m):
    assert m.sustained(row("rr", 20, 1000, 0.02)) == (True, "ok")  # 1,000 = 20 × 50
    # 940 of 1,000 tokens/s = 94 % < 95 %.
    assert m.sustained(row("rr", 20, 940, 0.02))[0] is False
    # 2 errors in 100 requests > 1 %.
    assert m.sustained(row("rr", 20, 1000, 0.02, errors=2))[0] is False
    # Second half 0.4 s vs first 0.1 s: 4x and +300 ms → a queue is building.
    ok, why = m.sustained(row("rr", 20, 1000, 0.4, first=0.1, second=0.4))
    assert not ok and "grew 4.0x" in why
    # 20 → 45 ms is 2.25x but only +25 ms: under the 50 ms floor, noise.
    assert m.sustained(row("rr", 20, 1000, 0.045, first=0.02, second=0.045))[0] is True


def test_knee_is_the_highest_rate_with_every_lower_one_sustained(m):
    rows = [
        row("rr", 25, 1250, 0.1),
        row("rr", 50, 2500, 0.2),
        row("rr", 75, 3000, 1.3, first=0.3, second=1.3),  # 3,000 < 0.95 × 3,750
    ]
    assert m.knee(rows, "s", "rr") == (50, False)
    assert m.knee(rows[:2], "s", "rr") == (50, True)  # its top stage: at least 50
    assert m.knee([row("rr", 25, 100, 5.0)], "s", "rr") == (None, False)


def test_prefix_win_by_ttft_at_round_robins_knee(m):
    rows = [
        row("rr", 25, 1250, 0.10),
        row("rr", 50, 2500, 0.30),
        row("rr", 75, 3000, 1.30, first=0.3, second=1.3),
        row("epp-sticky", 25, 1250, 0.05),
        row("epp-sticky", 50, 2500, 0.029),  # 0.029 / 0.30 = 0.097 ≤ 0.1
        row("epp-sticky", 75, 3750, 0.07),
    ]
    text = m.prefix_win(rows, "s")
    # rr's knee 50; sticky sustains 75 (its top: "≥"); tok/s 3,750 / 2,500 = 1.50.
    assert "rr knee 50, epp-sticky knee ≥ 75" in text and "≥ 1.50x" in text
    assert "0.10x" in text and text.endswith("WIN")
    rows[4] = row("epp-sticky", 50, 2500, 0.06)  # 0.2x: no 10x, and 1.5x < 2x tok/s
    assert m.prefix_win(rows, "s").endswith("no win")


def test_prefix_win_by_throughput_at_each_knee(m):
    rows = [
        row("rr", 10, 500, 0.1),
        row("rr", 20, 700, 2.0, first=0.5, second=2.0),
        row("rr", 30, 800, 4.0, first=1.0, second=4.0),
        row("epp-sticky", 10, 500, 0.09),
        row("epp-sticky", 20, 1000, 0.1),
        row("epp-sticky", 30, 1000, 0.2),  # 1,000 < 0.95 × 1,500: knee 20
    ]
    # rr's knee 10 (500 tok/s), sticky's 20 (1,000 tok/s): 2.00x → a win.
    text = m.prefix_win(rows, "s")
    assert "rr knee 10, epp-sticky knee 20 req/s" in text and "2.00x" in text
    assert text.endswith("WIN")
