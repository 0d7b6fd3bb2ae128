"""Issue 15 items 2, 3 and 5: rate-scaled traces, start-up sweeps, the judged metrics
on scripted runs, the Pareto plot. Real replays of the `tiny` preset (no mocks)."""

from __future__ import annotations

import json
import math
import random

import pytest

from epp.cli import main
from epp.planner.core.types import Role
from epp.planner.offline.outcome import Sla, scale_down_lags, summarize
from epp.planner.offline.pool import PoolShape
from epp.planner.offline.replay import Action, Lifetime, Run, Served, replay
from epp.planner.offline.static import StaticPolicy
from epp.planner.offline.traces import Arrival
from epp.sim import presets

A = Role.AGGREGATED
TINY = presets.config_for("tiny")


def served(rid: int, at: float, ttft_ms: float = 10.0, itl_ms: float = 1.0) -> Served:
    return Served(rid, at, ttft_ms, itl_ms, at + 1.0, 20, 4, 0, "r")


def life(name: str, start: float, released: float, gpus: int = 1) -> Lifetime:
    return Lifetime(name, A, gpus, start, start, math.inf, released)


def scripted(served_: tuple[Served, ...], lifetimes: tuple[Lifetime, ...], end: float, **kw):
    last = max(s.arrival for s in served_)
    return Run("x", served_, (), kw.get("lost", 0), kw.get("actions", ()), (), lifetimes,
               end, last, 0)  # fmt: skip


# -- item 3: the metrics on scripted runs -------------------------------------------------


def test_scale_down_lag_is_the_time_from_a_bursts_end_to_the_fewest_gpus():
    # GPUs held: 1 from 0 s (replica a), 2 from 10 s (b starts), 1 again from 400 s
    # (b released): the run's fewest is 1.
    # Burst 1 ends at 100 s (next arrival 500 s, a 400 s gap): the pool is back at 1 GPU
    # at 400 s -> lag 400 - 100 = 300 s.
    # Burst 2 ends at 510 s (next 900 s); c holds a GPU from 505 s to the end, so the
    # pool never returns to 1 before 900 s -> the gap's length, 900 - 510 = 390 s.
    # 900 s is the trace's last arrival: not a burst end.
    arrivals = (served(0, 5.0), served(1, 100.0), served(2, 500.0), served(3, 510.0),
                served(4, 900.0))  # fmt: skip
    lts = (life("a", 0.0, 1000.0), life("b", 10.0, 400.0), life("c", 505.0, 1000.0))
    run = scripted(arrivals, lts, 1000.0)
    assert scale_down_lags(run, gap_s=120.0) == [300.0, 390.0]
    s = summarize(run, Sla(100, 10), 60.0)
    assert s.bursts == 2 and s.to_min_pool_s == pytest.approx((300 + 390) / 2)
    assert s.as_json()["to_min_pool_s"] == 345.0


def test_a_static_pool_is_always_at_its_minimum_and_a_trace_without_gaps_has_no_bursts():
    arrivals = (served(0, 5.0), served(1, 100.0), served(2, 500.0))
    run = scripted(arrivals, (life("a", 0.0, 600.0), life("b", 0.0, 600.0)), 600.0)
    # 5 -> 100 s is a 95 s gap (< 120 s: the same burst); 100 -> 500 s ends a burst, and
    # the pool holds its 2 GPUs throughout, its fewest: lag 0
    assert scale_down_lags(run, 120.0) == [0.0]
    dense = scripted((served(0, 5.0), served(1, 60.0)), (life("a", 0.0, 100.0),), 100.0)
    s = summarize(dense, Sla(100, 10), 60.0)
    assert s.bursts == 0 and math.isnan(s.to_min_pool_s)
    assert s.as_json()["to_min_pool_s"] is None


def test_the_worst_five_minutes_is_the_window_with_the_most_misses():
    # One request per 60 s interval for 15 min; those arriving in minutes 6 and 7 miss
    # the TTFT SLA (500 ms > 100 ms). 5-interval windows: the worst holds both misses,
    # 3/5 = 60 % met, first at the window starting at minute 3 (minutes 3..7).
    arrivals = tuple(served(k, 60.0 * k + 1, ttft_ms=500.0 if k in (6, 7) else 10.0)
                     for k in range(15))  # fmt: skip
    run = scripted(arrivals, (life("a", 0.0, 900.0),), 900.0)
    s = summarize(run, Sla(100, 10), 60.0)
    assert s.worst_window == pytest.approx(3 / 5)
    assert s.worst_window_start == 180.0
    assert s.sla_requests == pytest.approx(13 / 15)
    # intervals: 2 of 15 miss (one request each: its p90 is its own TTFT)
    assert s.sla_intervals == pytest.approx(13 / 15)


def test_lost_requests_count_against_the_request_share():
    # 40 requests; the script scales to zero at its first decision and never returns:
    # what arrives after it waits until the run gives up, and is lost.
    arrivals = [Arrival(0.5 + i, 40, 4) for i in range(40)]

    class ToZero:
        name, interval_s, sample_interval_s = "to-zero", 10.0, 1.0

        def step(self, now, obs):
            from epp.planner.core.types import Decision

            return Decision(at=now, targets={A: 0}, reason="zero")

    run = replay(arrivals, ToZero(), PoolShape(TINY, startup_s=5.0), initial=1, max_tail_s=30.0)
    s = summarize(run, Sla(1000, 100), 10.0)
    assert run.lost > 0 and s.lost == run.lost
    assert s.requests + s.lost == 40
    # every served request met the loose SLA; the lost ones did not
    assert s.sla_requests == pytest.approx(s.requests / 40)


def test_reversals_are_direction_changes_within_ten_minutes_of_the_last_change():
    # up (60 s), down at 600 s (540 s later: a reversal), down at 700 s (same way),
    # up at 1301 s (601 s after the last change: not one), down at 1310 s (a reversal).
    moves = ((60.0, 1, 2), (600.0, 2, 1), (700.0, 1, 0), (1301.0, 0, 1), (1310.0, 1, 0))
    acts = tuple(Action(t, A, b, a, "") for t, b, a in moves)
    run = scripted((served(0, 5.0),), (life("a", 0.0, 1400.0),), 1400.0, actions=acts)
    s = summarize(run, Sla(100, 10), 60.0)
    assert (s.actions, s.reversals) == (5, 2)


# -- item 2 and 5: the command ------------------------------------------------------------


def tiny_trace(tmp_path, n: int = 120, seed: int = 8):
    rng = random.Random(seed)
    lines, t = [], 0.0
    for _ in range(n):
        t += rng.expovariate(20.0)
        lines.append(json.dumps({"timestamp": t * 1000, "input_length": rng.randint(20, 300),
                                 "output_length": rng.randint(2, 30)}))  # fmt: skip
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    return trace


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["plan", "replay", "--quiet", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_rate_scale_1_reproduces_the_unscaled_replay_exactly(tmp_path, capsys):
    trace = tiny_trace(tmp_path)
    base = ("--trace", str(trace), "--preset", "tiny", "--interval", "5", "--compare")
    plain, scaled = tmp_path / "plain.json", tmp_path / "scaled.json"
    assert run_cli(capsys, *base, "--json", str(plain))[0] == 0
    assert run_cli(capsys, *base, "--rate-scale", "1", "--json", str(scaled))[0] == 0
    a, b = json.loads(plain.read_text()), json.loads(scaled.read_text())
    assert a == b
    assert {p["name"] for p in a["policies"]} >= {"static-peak", "epp"}


def test_rate_scale_2_doubles_the_requests(tmp_path, capsys):
    trace = tiny_trace(tmp_path)
    out = tmp_path / "x2.json"
    args = ("--trace", str(trace), "--preset", "tiny", "--interval", "5", "--policy",
            "static-mean", "--rate-scale", "2", "--json", str(out))  # fmt: skip
    assert run_cli(capsys, *args)[0] == 0
    doc = json.loads(out.read_text())
    assert doc["requests"] == 240 and doc["rate_scale"] == 2.0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--rate-scale", "-1"), "--rate-scale must be a positive number"),
        (("--rate-scale", "nan"), "--rate-scale must be a positive number"),
        (("--sweep-startup", "10,x"), "--sweep-startup '10,x'"),
        (("--sweep-startup", "10,-5"), "non-negative seconds"),
        (("--sweep-startup", ""), "non-negative seconds"),
        (("--sweep-startup", "10,10"), "repeated"),
    ],
)
def test_bad_scale_or_sweep_is_one_line_and_exit_2(tmp_path, capsys, args, message):
    trace = tiny_trace(tmp_path, n=5)
    code, _, err = run_cli(capsys, "--trace", str(trace), "--preset", "tiny", *args)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("epp plan replay: error: ")
    assert message in err and "Traceback" not in err


def test_a_startup_sweep_compares_at_each_delay_and_plots_the_pareto_view(tmp_path, capsys):
    trace = tiny_trace(tmp_path)
    out, pareto, plot = tmp_path / "sweep.json", tmp_path / "pareto.png", tmp_path / "t.png"
    code, stdout, _ = run_cli(
        capsys, "--trace", str(trace), "--preset", "tiny", "--interval", "5", "--compare",
        "--sweep-startup", "0,30", "--json", str(out), "--pareto", str(pareto),
        "--plot", str(plot),
    )  # fmt: skip
    assert code == 0
    doc = json.loads(out.read_text())
    runs = doc["startup_sweep"]
    assert [r["startup_s"] for r in runs] == [0.0, 30.0]
    assert "== start-up 30 s ==" in stdout
    for r in runs:
        by = {p["name"]: p for p in r["policies"]}
        assert by["static-peak"]["gpu_hours_vs_static_peak"] == 1.0
        assert by["oracle"]["gpu_hours_vs_oracle"] == 1.0
        for p in r["policies"]:
            assert p["gpu_hours_vs_static_peak"] == pytest.approx(
                p["gpu_hours"] / by["static-peak"]["gpu_hours"], abs=1e-3
            )
            assert p["gpu_hours_vs_oracle"] == pytest.approx(
                p["gpu_hours"] / by["oracle"]["gpu_hours"], abs=1e-3
            )
    # the static pools start ready and never scale, the oracle starts at once: the same
    # at every delay (replayed once)
    fixed = [[p for p in r["policies"] if p["name"] in ("static-peak", "static-mean", "oracle")]
             for r in runs]  # fmt: skip
    assert len(fixed[0]) == 3 and fixed[0] == fixed[1]
    assert pareto.read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "t-startup0.png").exists() and (tmp_path / "t-startup30.png").exists()


def test_static_pool_replay_is_unchanged_by_the_start_up_delay():
    # the premise of reusing static results across a sweep, checked on a real replay
    rng = random.Random(2)
    arrivals, t = [], 0.0
    for _ in range(80):
        t += rng.expovariate(10.0)
        arrivals.append(Arrival(t, rng.randint(20, 200), rng.randint(2, 30)))
    runs = [
        replay(arrivals, StaticPolicy("s", 2, 5.0), PoolShape(TINY, startup_s=s), initial=2)
        for s in (0.0, 300.0)
    ]
    assert runs[0].served == runs[1].served and runs[0].lifetimes == runs[1].lifetimes


def test_the_pareto_title_names_the_per_request_sla():
    from epp.planner.offline.outcome import Sla
    from epp.planner.plots import pareto_title

    title = pareto_title("azure x3", Sla(420, 16))
    assert "per request TTFT <= 420 ms, ITL <= 16 ms" in title and "p90" not in title


def test_the_fleet_table_names_the_oracles_bar(tmp_path):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "planner_fleet.py"
    spec = importlib.util.spec_from_file_location("planner_fleet", path)
    fleet = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fleet)

    def row(name: str, gpu_hours: float) -> dict:
        return {"name": name, "gpu_hours": gpu_hours, "sla_requests": 0.99,
                "sla_intervals": 1.0, "worst_5min_requests": 0.97, "actions": 0,
                "reversals": 0, "lost": 0, "intervals_over_budget": 0,
                "to_min_pool_s": None}  # fmt: skip

    def doc(policies: list[dict], **extra) -> dict:
        return {"trace": "t.csv", "rate_scale": 3.0, "requests": 10, "last_arrival_s": 600.0,
                "policies": policies, "sla": {"ttft_ms": 420, "itl_ms": 16, "rule": "requests"},
                "startup_s": 100.0, "static_peak_replicas": 7, "static_mean_replicas": 3,
                "budget_gpus": 14} | extra  # fmt: skip

    new = tmp_path / "new.json"
    new.write_text(json.dumps(doc([row("static-peak", 6.8), row("oracle", 5.0)],
                                  oracle_target="0.99")))  # fmt: skip
    old = tmp_path / "old.json"  # a file from before --oracle-target: the p90 oracle
    old.write_text(json.dumps(doc([row("oracle", 3.7)])))
    ((key, by_startup),) = fleet.merge([new]).items()
    assert "oracle sized at >= 99% of each interval's requests within both" in fleet.table(
        key, by_startup
    )
    ((key, by_startup),) = fleet.merge([old]).items()
    assert "oracle sized at p90 TTFT and ITL within in each interval" in fleet.table(
        key, by_startup
    )
    assert "oracle sized" not in fleet.table(key, {100.0: {"run": doc([]), "policies": {}}})
    spread = tmp_path / "run.json"
    spread.write_text(json.dumps(doc([row("oracle", 4.0)], oracle_target="run:0.99")))
    ((key, by_startup),) = fleet.merge([spread]).items()
    assert "oracle sized at >= 99% of the run's requests within both" in fleet.table(
        key, by_startup
    )
