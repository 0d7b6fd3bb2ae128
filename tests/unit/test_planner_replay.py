"""The replay: a trace through a policy and a pool of virtual-time simulated servers.

Small traces on the `tiny` preset (steps of a few ms), scripted policies whose
decisions are known in advance, and numbers worked out by hand in the comments.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from dataclasses import dataclass

import pytest

from epp.cli import main
from epp.planner.core.types import Decision, Observation, Role
from epp.planner.offline import compare as cmp
from epp.planner.offline.outcome import Sla, summarize
from epp.planner.offline.pool import PoolShape, State
from epp.planner.offline.replay import Action, MissLimit, Run, replay
from epp.planner.offline.static import NoPoolMeetsSla, Sizer, StaticPolicy, nice_up, peak_segments
from epp.planner.offline.traces import Arrival
from epp.sim import presets

TINY = presets.config_for("tiny")
A = Role.AGGREGATED


def shape(startup_s: float = 10.0) -> PoolShape:
    return PoolShape(TINY, startup_s=startup_s)


def poisson(n: int, rate: float, seed: int, *, start: float = 0.0, isl=(20, 200), osl=(2, 40)):
    rng = random.Random(seed)
    t, out = start, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(Arrival(t, rng.randint(*isl), rng.randint(*osl)))
    return out


@dataclass
class Script:
    """A policy that asks for `targets[k]` replicas at its k-th decision (the last one
    after that), and remembers what it observed."""

    targets: list[int]
    interval_s: float = 10.0
    sample_interval_s: float = 1.0
    name: str = "script"

    def __post_init__(self) -> None:
        self.seen: list[Observation] = []

    def step(self, now: float, obs: Observation) -> Decision:
        self.seen.append(obs)
        k = min(len(self.seen), len(self.targets)) - 1
        return Decision(at=now, targets={A: self.targets[k]}, reason=f"step {k}")


# -- the pool's lifecycle ------------------------------------------------------------------


def test_a_new_replica_serves_only_after_its_start_up_delay_and_holds_gpus_from_the_decision():
    # One replica, then 2 from the first decision at t=10 s; start-up 10 s, so the
    # second serves from t=20 s. Requests every 0.5 s from t=0.25 to 39.75 s.
    arrivals = [Arrival(0.25 + 0.5 * i, 50, 5) for i in range(80)]
    run = replay(arrivals, Script([2]), shape(10.0), initial=1)
    by = {s.rid: s.replica for s in run.served}
    second = {rid for rid, name in by.items() if name == "aggregated-1"}
    assert second, "the new replica never served"
    assert min(arrivals[rid].t_s for rid in second) >= 20.0
    assert run.actions == (Action(10.0, A, 1, 2, "step 0"),)
    lt = {lt.name: lt for lt in run.lifetimes}["aggregated-1"]
    assert (lt.started_at, lt.ready_at) == (10.0, 20.0)
    assert lt.state_at(15.0) is State.STARTING and lt.state_at(25.0) is State.READY
    # GPU-seconds: replica 0 from 0 to the end, replica 1 from 10 s (starting counts).
    s = summarize(run, Sla(1000, 100), 10.0)
    assert s.gpu_hours == pytest.approx((run.end + (run.end - 10.0)) / 3600)
    assert s.lost == 0 and s.requests == 80


def test_a_drained_replica_finishes_its_requests_then_frees_its_gpus():
    # Two replicas, then one at t=10 s: one is drained. Long outputs (400 tokens of
    # ~2.1 ms = ~0.8 s) keep requests in flight at the decision.
    arrivals = [Arrival(0.1 * i, 30, 400) for i in range(1, 150)]
    run = replay(arrivals, Script([1]), shape(), initial=2)
    drained = [lt for lt in run.lifetimes if lt.drain_from == 10.0]
    assert len(drained) == 1
    name = drained[0].name
    mine = [s for s in run.served if s.replica == name]
    assert all(s.arrival < 10.0 for s in mine)  # no new request after the drain began
    assert max(s.finish for s in mine) > 10.0  # it had work in flight, and finished it
    assert drained[0].released_at == pytest.approx(max(s.finish for s in mine))
    assert run.lost == 0 and len(run.served) == len(arrivals)


def test_shrinking_cancels_a_starting_replica_before_draining_a_ready_one():
    # 1 -> 3 at t=10 s (two start, ready at 110 s), then 2 at t=20 s: one of the
    # starting ones is cancelled (the newest), no ready replica drains.
    arrivals = poisson(100, 4.0, seed=1)
    run = replay(arrivals, Script([3, 2]), shape(100.0), initial=1)
    lts = {lt.name: lt for lt in run.lifetimes}
    assert lts["aggregated-2"].released_at == 20.0  # cancelled at the second decision
    assert lts["aggregated-2"].ready_at > 20.0  # never served
    assert lts["aggregated-1"].released_at > 20.0
    assert all(lt.drain_from == math.inf for lt in lts.values())


def test_requests_wait_in_the_epp_while_no_replica_is_ready_and_none_is_lost():
    # 1 -> 0 at t=10 s (drained), back to 1 at t=20 s, ready at 25 s (start-up 5 s).
    # Requests arriving in [10, 25) wait; each one's TTFT includes its wait.
    arrivals = [Arrival(0.5 + i, 40, 4) for i in range(40)]
    run = replay(arrivals, Script([0, 1]), shape(5.0), initial=1)
    assert run.lost == 0 and len(run.served) == 40
    held = [s for s in run.served if 10.0 <= s.arrival < 25.0]
    assert held
    for s in held:
        assert s.ttft_ms >= (25.0 - s.arrival) * 1000 - 1e-6
    # While nothing was ready, the window saw the held requests as the pool's queue.
    assert run.decisions[1].at == 20.0


def test_a_policy_never_bringing_replicas_back_loses_the_held_requests_and_says_so():
    arrivals = [Arrival(0.5 + i, 40, 4) for i in range(30)]
    run = replay(arrivals, Script([0]), shape(), initial=1, max_tail_s=60.0)
    assert run.lost == sum(1 for a in arrivals if a.t_s >= 10.0)  # 20 held at the end
    s = summarize(run, Sla(1000, 100), 10.0)
    assert s.lost == 20
    assert s.sla_requests == pytest.approx(10 / 30)  # lost ones count as missing


def test_the_window_sees_what_the_pool_did():
    arrivals = poisson(200, 10.0, seed=2)
    policy = Script([1])
    run = replay(arrivals, policy, shape(), initial=1)
    first = policy.seen[0]
    assert (first.start, first.end) == (0.0, 10.0)
    assert first.arrivals == sum(1 for a in arrivals if a.t_s < 10.0)
    assert first.replicas[A].ready == 1
    assert first.role(A).samples == 10  # one sample a second
    total = sum(o.completions for o in policy.seen)
    assert total <= len(run.served)


def test_replay_is_deterministic_for_a_seed():
    arrivals = poisson(300, 20.0, seed=3)
    a = replay(arrivals, Script([3, 1, 2]), shape(), initial=2, seed=7)
    b = replay(arrivals, Script([3, 1, 2]), shape(), initial=2, seed=7)
    assert a.served == b.served
    assert a.lifetimes == b.lifetimes and a.actions == b.actions


def test_a_request_longer_than_the_model_is_rejected_by_the_server_not_lost():
    arrivals = [Arrival(0.1, 1000, 100), Arrival(0.2, 50, 5)]  # tiny's context: 1024
    run = replay(arrivals, StaticPolicy("s", 1, 10.0), shape(), initial=1)
    assert run.rejected == (0,) and run.lost == 0
    assert [s.rid for s in run.served] == [1]


# -- the verdict ---------------------------------------------------------------------------


def test_reversals_and_actions_on_a_scripted_run():
    # Up at 10 s, down at 20 s (reversal), down at 700 s (same way), up at 1400 s
    # (opposite, but 700 s after the last change: not within 10 minutes).
    acts = (
        Action(10.0, A, 1, 2, ""),
        Action(20.0, A, 2, 1, ""),
        Action(700.0, A, 1, 0, ""),
        Action(1400.0, A, 0, 1, ""),
    )
    run = Run("x", (), (), 0, acts, (), (), 1500.0, 1400.0, 0)
    s = summarize(run, Sla(100, 10), 60.0)
    assert (s.actions, s.reversals) == (4, 1)


def test_the_summary_counts_the_decisions_that_said_start_up_bound():
    # Decisions at 10, 20, 30 s; the second and third carry the SLA mode's diagnostic
    # (1.0: missed while replicas started), the first says 0.0: two counted.
    def said(at: float, bound: float) -> Decision:
        return Decision(at=at, targets={A: 1}, reason="", diagnostics={"startup_bound": bound})

    decisions = (said(10.0, 0.0), said(20.0, 1.0), said(30.0, 1.0))
    run = Run("x", (), (), 0, (), decisions, (), 40.0, 30.0, 0)
    s = summarize(run, Sla(100, 10), 10.0)
    assert s.startup_bound == 2 and s.as_json()["startup_bound_decisions"] == 2


def test_intervals_over_the_gpu_budget_count_starting_replicas():
    # 1 replica, then 3 at t=10 s (two starting until 30 s): 3 GPUs held from 10 s on.
    # Against a budget of 2, every 10 s interval from [10, 20) on is over it.
    arrivals = [Arrival(0.5 + i, 40, 4) for i in range(40)]
    run = replay(arrivals, Script([3]), shape(20.0), initial=1)
    s = summarize(run, Sla(1000, 100), 10.0, budget_gpus=2)
    assert s.peak_gpus == 3
    assert s.over_budget == len(s.rows) - 1  # all but [0, 10)
    assert summarize(run, Sla(1000, 100), 10.0, budget_gpus=3).over_budget == 0


def test_interval_and_request_attainment_by_hand():
    # Two replicas; SLA TTFT 1000 ms: with a 1-second wait injected by scale-to-zero,
    # the requests held do not meet it.
    arrivals = [Arrival(0.5 + i, 40, 4) for i in range(40)]
    run = replay(arrivals, Script([0, 1]), shape(5.0), initial=1)
    sla = Sla(1000.0, 100.0)
    s = summarize(run, sla, 10.0)
    missed = [x for x in run.served if not sla.met(x)]
    # Held from 10 s until the replica is ready at 25 s: arrivals at 10.5..23.5 wait
    # more than a second (14 of them); 24.5 waits 0.5 s and meets it.
    assert len(missed) == 14
    assert s.sla_requests == pytest.approx(26 / 40)
    assert [r.within for r in s.rows] == [True, False, False, True]
    assert s.sla_intervals == pytest.approx(2 / 4)
    assert s.worst_window == pytest.approx(s.sla_requests)  # 5 min > the whole run


# -- static sizing -------------------------------------------------------------------------


def test_the_smallest_static_pool_meets_the_sla_and_one_fewer_does_not():
    # tiny's decode step is 2 ms + 0.1 ms per sequence in the batch: an ITL SLA of
    # 2.25 ms allows batches of about 2, so the busiest 5 s (~200 requests) need several.
    arrivals = poisson(250, 40.0, seed=4)
    sizer = Sizer(arrivals, shape())
    sla = Sla(50.0, 2.25)
    segs = peak_segments(arrivals, 5.0)
    sized = sizer.smallest_for_all(sla, segs)
    assert sized.replicas > 1
    for seg in segs:
        assert sla.within(*sizer.measure(seg, sized.replicas))
    assert not all(sla.within(*sizer.measure(seg, sized.replicas - 1)) for seg in segs)


def test_sizing_for_all_segments_equals_the_largest_search_and_measures_less():
    # The same trace and SLA as above: smallest_for_all searches the first segment and
    # checks each other one at the size found (one measurement when it holds), so it
    # must give the largest of the per-segment searches (each on a fresh Sizer, nothing
    # shared) with fewer measurements than they took together.
    arrivals = poisson(250, 40.0, seed=4)
    sla = Sla(50.0, 2.25)
    segs = peak_segments(arrivals, 5.0)
    alone = [Sizer(arrivals, shape()) for _ in segs]
    each = [z.smallest_pool(sla, seg) for z, seg in zip(alone, segs, strict=True)]
    sizer = Sizer(arrivals, shape())
    together = sizer.smallest_for_all(sla, segs)
    assert together.replicas == max(z.replicas for z in each)
    assert len(sizer._seen) < sum(len(z._seen) for z in alone)
    # a size known to miss is not measured again: the search starts above it
    fresh = Sizer(arrivals, shape())
    z = fresh.smallest_pool(sla, segs[0], fails_at=each[0].replicas - 1)
    assert z.replicas == each[0].replicas
    assert all(n >= each[0].replicas for _, n in fresh._seen)


def test_an_sla_no_pool_meets_is_an_error_naming_the_fix():
    arrivals = poisson(50, 5.0, seed=5)
    with pytest.raises(NoPoolMeetsSla, match="raise --ttft/--itl"):
        Sizer(arrivals, shape()).smallest_pool(
            Sla(0.5, 0.5), peak_segments(arrivals, 5.0)[0], max_replicas=4
        )


def test_round_numbers_for_a_picked_sla():
    assert [nice_up(x) for x in (0.93, 1.0, 11.4, 187.0 * 2, 3.1)] == [1.0, 1.0, 12.0, 400.0, 4.0]


def test_compare_runs_every_policy_on_the_same_setup():
    arrivals = poisson(150, 30.0, seed=6)
    setup = cmp.prepare(arrivals, shape(), 5.0, Sla(50.0, 2.5))
    results = cmp.compare(arrivals, setup, {"load": lambda: Script([1, 2], interval_s=5.0)})
    names = [r.summary.policy for r in results]
    assert names == ["static-peak", "static-mean", "script"]
    peak = results[0].summary
    assert peak.sla_intervals == 1.0 or "still misses" in results[0].note
    assert results[2].initial == setup.mean.replicas


def test_a_miss_limit_stops_a_replay_once_its_misses_pass_it():
    """A pool too small for the trace, with a limit of 5 misses: the run stops soon
    after the sixth, marked stopped, with fewer requests served than arrived; without
    the limit the same pool serves every request."""
    arrivals = poisson(300, 60.0, seed=3)
    sla = Sla(50.0, 2.5)
    policy = StaticPolicy("s", 1, 5.0)
    whole = replay(arrivals, policy, shape(), initial=1)
    assert not whole.stopped and len(whole.served) == len(arrivals)
    missed = sum(1 for x in whole.served if not sla.met(x))
    assert missed > 5  # the pool is too small: the limit is reached
    cut = replay(arrivals, policy, shape(), initial=1, miss_limit=MissLimit(sla.met, 5))
    assert cut.stopped and len(cut.served) < len(arrivals)
    assert sum(1 for x in cut.served if not sla.met(x)) > 5


def test_the_static_peak_search_stops_small_pools_early_and_finds_the_fewest(monkeypatch):
    """The search replays a size only until it has missed more requests than 99 % allows;
    its answer is the fewest replicas whose whole replay keeps 99 % (one fewer does
    not), replayed whole."""
    arrivals = poisson(400, 40.0, seed=11)
    setup = cmp.prepare(arrivals, shape(), 5.0, Sla(50.0, 2.5))
    runs: list[Run] = []

    def recorded(*args, **kwargs) -> Run:
        runs.append(replay(*args, **kwargs))
        return runs[-1]

    monkeypatch.setattr(cmp, "replay", recorded)
    found = cmp.static_peak(arrivals, setup)
    assert any(r.stopped and len(r.served) < len(arrivals) for r in runs)
    assert "stopped once past 1% misses" in found.note  # its progress ended early: why
    monkeypatch.undo()
    n = found.initial
    assert not found.run.stopped and found.summary.sla_requests >= 0.99
    below = cmp.run_policy(arrivals, StaticPolicy("static-peak", n - 1, 5.0), setup, n - 1)
    assert below.summary.sla_requests < 0.99


# -- the command ---------------------------------------------------------------------------


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["plan", "replay", "--quiet", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("content", "args", "message"),
    [
        ("", (), "the trace is empty"),
        ('{"timestamp": 0, "input_length": "x"}\n', (), "line 1"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,10,5\n", (), "line 2"),
        ('{"timestamp": 0, "input_length": 10, "output_length": 5}\n', ("--preset", "nope"),
         "unknown preset 'nope'"),
        ('{"timestamp": 0, "input_length": 10, "output_length": 5}\n',
         ("--preset", "tiny", "--ttft", "0.01", "--itl", "0.01"), "no pool of up to"),
        ('{"timestamp": 0, "input_length": 10, "output_length": 5}\n', ("--time-limit", "soon"),
         "--time-limit"),
        ('{"timestamp": 0, "input_length": 10, "output_length": 5}\n', ("--rate-scale", "0"),
         "--rate-scale must be a positive number"),
        ('{"timestamp": 0, "input_length": 10, "output_length": 5}\n',
         ("--compare", "--policies", "epp,keda"),
         "unknown policy 'keda'; choose from static-peak, static-mean, oracle, keda-queue, "
         "llm-d-slo, load, dynamo, epp"),
        ('{"timestamp": 0, "input_length": 10, "output_length": 5}\n', ("--policies", "epp"),
         "--policies selects what --compare runs"),
        ('{"timestamp": 0, "input_length": 10, "output_length": 5}\n',
         ("--compare", "--policies", " , "), "--policies names no policy"),
        ('{"timestamp": 0, "input_length": 10, "output_length": 5}\n',
         ("--compare", "--oracle-target", "1.5"),
         "--oracle-target '1.5': expected a share of requests in (0, 1], like 0.99"),
        ('{"timestamp": 0, "input_length": 10, "output_length": 5}\n',
         ("--compare", "--oracle-target", "p95"), "--oracle-target 'p95'"),
        ('{"timestamp": 0, "input_length": 10, "output_length": 5}\n',
         ("--compare", "--oracle-target", "0"), "--oracle-target '0'"),
        ('{"timestamp": 0, "input_length": 10, "output_length": 5}\n',
         ("--long-prefill-token-threshold", "-1"), "--long-prefill-token-threshold must be >= 0"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, content, args, message):
    trace = tmp_path / "t.jsonl"
    trace.write_text(content)
    code, _, err = run_cli(capsys, "--trace", str(trace), *args)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("epp plan replay: error: ")
    assert message in err
    assert "Traceback" not in err


def test_a_missing_trace_file_is_one_line_and_exit_2(tmp_path, capsys):
    code, _, err = run_cli(capsys, "--trace", str(tmp_path / "nope.csv"))
    assert code == 2 and "cannot read the trace" in err and err.count("\n") == 1


def test_compare_writes_the_json_the_issue_asks_for(tmp_path, capsys):
    rng = random.Random(8)
    lines, t = [], 0.0
    for _ in range(120):
        t += rng.expovariate(20.0)
        lines.append(json.dumps({"timestamp": t * 1000, "input_length": rng.randint(20, 300),
                                 "output_length": rng.randint(2, 30)}))  # fmt: skip
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    out_json = tmp_path / "out.json"
    code, out, _ = run_cli(
        capsys, "--trace", str(trace), "--preset", "tiny", "--interval", "5", "--compare",
        "--json", str(out_json),
    )  # fmt: skip
    assert code == 0
    doc = json.loads(out_json.read_text())
    names = [p["name"] for p in doc["policies"]]
    assert names[:2] == ["static-peak", "static-mean"]
    assert set(names) == {
        "static-peak", "static-mean", "oracle", "keda-queue", "llm-d-slo", "load", "epp"
    }  # fmt: skip
    # upstream Dynamo's aggregated planner refuses SLA scaling: the table says so
    assert "aggregated planner refuses" in doc["refused"]["dynamo"]
    for p in doc["policies"]:
        assert {"gpu_hours", "sla_intervals", "sla_requests", "actions"} <= set(p)
        assert 0.0 <= p["sla_intervals"] <= 1.0 and 0.0 <= p["sla_requests"] <= 1.0
    assert "static-peak" in out and "GPU-h" in out


def test_policies_selects_what_compare_runs(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    arrivals = poisson(120, 20.0, seed=8)
    trace.write_text(
        "".join(
            json.dumps({"timestamp": a.t_s * 1000, "input_length": a.isl, "output_length": a.osl})
            + "\n"
            for a in arrivals
        )
    )
    out_json = tmp_path / "out.json"
    code, _, _ = run_cli(
        capsys, "--trace", str(trace), "--preset", "tiny", "--interval", "5", "--compare",
        "--policies", "llm-d-slo,static-peak,oracle,keda-queue", "--json", str(out_json),
    )  # fmt: skip
    assert code == 0
    doc = json.loads(out_json.read_text())
    names = [p["name"] for p in doc["policies"]]
    assert names == ["static-peak", "oracle", "keda-queue", "llm-d-slo"]  # ORDER, not argv
    assert doc["oracle_target"] == "0.99"  # each interval's request bar unless told


def test_bursty_writes_a_trace_the_replay_reads(tmp_path, capsys):
    out = tmp_path / "b.jsonl"
    assert main(["plan", "bursty", "-o", str(out), "--duration", "10m", "--rate", "2"]) == 0
    from epp.planner.tracefile import load_trace

    arrivals = load_trace(out)
    assert arrivals and arrivals[-1].t_s < 600
    assert "wrote" in capsys.readouterr().out


def test_a_policy_sizing_prefill_and_decode_is_refused_not_misread():
    class PD(Script):
        def step(self, now: float, obs: Observation) -> Decision:
            return Decision(at=now, targets={Role.PREFILL: 1, Role.DECODE: 1}, reason="P/D")

    with pytest.raises(ValueError, match="P/D is not modelled"):
        replay([Arrival(0.5, 40, 4)] * 1 + [Arrival(15.0, 40, 4)], PD([1]), shape(), initial=1)


@pytest.mark.parametrize("caching", [False, True])
def test_the_lazy_pool_replays_exactly_as_advancing_every_replica(caching):
    # Issue 15 item 3: the pool advances only the engines due before an arrival and
    # reads the rest in closed form. Against the reference that advances every replica
    # at every arrival, on a run that scales up and down every second (starting,
    # cancelled and draining replicas, engines lent back and reused), with shared
    # prefixes when caching is on: the same requests, token times, lifetimes, steps.
    rng = random.Random(5)
    arrivals, t = [], 0.0
    for _ in range(600):
        t += rng.expovariate(60.0)
        group = rng.randrange(5)
        ids = tuple(range(10 * group, 10 * group + rng.randint(1, 4))) if caching else ()
        arrivals.append(Arrival(t, len(ids) * 32 + rng.randint(1, 40), rng.randint(2, 40), ids))
    sim = presets.config_for("tiny", enable_prefix_caching=caching)
    shp = PoolShape(sim, startup_s=1.5, block_tokens=32)
    lazy, eager = (
        replay(arrivals, Script([6, 2, 9, 3, 12, 1], interval_s=1.0), shp, initial=4, seed=2,
               lazy=flag)
        for flag in (True, False)
    )  # fmt: skip
    assert lazy.served == eager.served and len(lazy.served) == 600
    assert lazy.lifetimes == eager.lifetimes and lazy.actions == eager.actions
    assert lazy.steps == eager.steps and lazy.end == eager.end
    assert len(lazy.actions) >= 5 and any(lt.drain_from < math.inf for lt in lazy.lifetimes)


def mooncake_file(path, arrivals):
    """`arrivals` written as the Mooncake JSONL the replay reads."""
    path.write_text(
        "".join(
            json.dumps({"timestamp": a.t_s * 1000, "input_length": a.isl, "output_length": a.osl})
            + "\n"
            for a in arrivals
        )
    )
    return path


def test_a_long_prefill_threshold_keeps_the_decoding_request_within_its_itl():
    # On the 70B preset a 16k-token prompt runs as two ~0.9 s steps at vLLM's default: the
    # request decoding beside it passes a 50 ms mean ITL. Chunked at 250 tokens, each
    # step stays near 40 ms and only the long prompt itself waits longer.
    arrivals = [Arrival(0.0, 50, 30), Arrival(0.1, 16_000, 2)]

    def served(threshold: int):
        sim = presets.config_for("llama-3.1-70b-4xh100", long_prefill_token_threshold=threshold)
        run = replay(arrivals, StaticPolicy("s", 1, 10.0), PoolShape(sim), initial=1)
        return sorted(run.served, key=lambda x: x.arrival)

    (short_off, long_off), (short_on, long_on) = served(0), served(250)
    assert short_off.itl_ms > 50.0 and short_on.itl_ms < 50.0
    assert long_on.ttft_ms > long_off.ttft_ms


def test_a_given_static_peak_is_replayed_once_not_searched(tmp_path, capsys):
    # The search on this trace finds its size by replaying several; --static-peak N
    # replays N alone and says so, and a size below 1 is one line and exit 2.
    trace = mooncake_file(tmp_path / "t.jsonl", poisson(120, 20.0, seed=8))

    def peak(*extra: str) -> tuple[dict, str]:
        out_json = tmp_path / "out.json"
        code, out, _ = run_cli(
            capsys, "--trace", str(trace), "--preset", "tiny", "--interval", "5", "--compare",
            "--policies", "static-peak", "--json", str(out_json), *extra,
        )  # fmt: skip
        assert code == 0
        return next(p for p in json.loads(out_json.read_text())["policies"]), out

    (searched, said), (given, says) = peak(), peak("--static-peak", "3")
    assert searched["initial_replicas"] != 3 and "given" not in said
    assert given["initial_replicas"] == 3 and "3 given (--static-peak), not searched" in says
    code, _, err = run_cli(capsys, "--trace", str(trace), "--compare", "--static-peak", "0")
    assert code == 2 and err.count("\n") == 1
    assert "--static-peak must be an integer >= 1, got 0" in err


def test_a_planner_file_naming_a_removed_option_is_one_line_and_exit_2(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5}\n')
    planner = tmp_path / "p.yaml"
    planner.write_text("mode: sla\nprefill-interference: true\n")
    code, _, err = run_cli(capsys, "--trace", str(trace), "--planner", str(planner))
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert f"{planner}: prefill-interference: removed" in err and "delete the key" in err


def test_a_planner_file_keeps_the_replays_budget_and_replica_gpus_unless_it_sets_them(
    tmp_path,
):
    """A file that tunes one option must not cap the pool at the library's 8 one-GPU
    replicas: the replay's budget (twice static-peak's GPUs) and the preset's GPUs per
    replica hold for every key the file leaves out, and the file's own values win."""
    from types import SimpleNamespace

    from epp.planner import plan_cli
    from epp.planner.core.config import load_planner_file

    setup = SimpleNamespace(
        shape=SimpleNamespace(gpus_per_replica=4, startup_s=100.0),
        peak=SimpleNamespace(replicas=10),
        budget_gpus=80,
        sla=Sla(500.0, 50.0),
    )

    def budget(text: str) -> tuple[int | None, object]:
        path = tmp_path / "p.yaml"
        path.write_text(text)
        args = argparse.Namespace(planner=str(path), interval=None)
        config = plan_cli._config_for("epp", load_planner_file(text), args, setup)
        return plan_cli._budget(args, setup, None), config.budget

    total, b = budget("attainment-target: 0.995\n")
    assert total == 80 and b.max_gpu_budget == 80
    assert b.decode_engine_num_gpu == 4 and b.prefill_engine_num_gpu == 4
    total, b = budget("max-gpu-budget: 12\ndecode-engine-num-gpu: 2\n")
    assert total == 12 and b.max_gpu_budget == 12
    assert b.decode_engine_num_gpu == 2 and b.prefill_engine_num_gpu == 4


def test_the_planners_budget_is_twice_static_peaks_pool_given_or_found(tmp_path, capsys):
    """Not the busiest intervals' size: on a ServeGen fall that was 5 replicas where 9
    keep 99 % of requests, a budget of 10 that left the planners no room above
    static-peak. Given (--static-peak 6 on a 4-GPU preset: 48 GPUs, where this light
    trace's busiest intervals need 1) or found by the comparison's search."""
    trace = mooncake_file(tmp_path / "t.jsonl", poisson(60, 2.0, seed=3))

    def compare(*extra: str) -> dict:
        out_json = tmp_path / "out.json"
        code, _, _ = run_cli(
            capsys, "--trace", str(trace), "--preset", "llama-3.1-70b-4xh100", "--interval",
            "10", "--compare", "--policies", "static-peak,keda-queue", "--json",
            str(out_json), *extra,
        )  # fmt: skip
        assert code == 0
        return json.loads(out_json.read_text())

    given = compare("--static-peak", "6")
    assert given["static_peak_replicas"] == 6 and given["budget_gpus"] == 48
    found = compare()
    assert found["budget_gpus"] == max(8, 2 * found["static_peak_replicas"] * 4)
