"""latency-scorer and slo-headroom-tier-filter on hand-made prediction sets, and
config/slo.yaml end to end through the scheduler."""

from pathlib import Path

import pytest

from epp.config.loader import load_config_file
from epp.scheduling.types import CycleState
from plugins.latency.info import LATENCY_PREDICTION_KEY, LatencyPrediction, LatencyPredictionInfo
from tests.helpers import completion, plugin, snap

EPS = [snap("a"), snap("b"), snap("c")]


def state_with(preds: dict[str, tuple[float, float]], ttft=None, tpot=None) -> CycleState:
    s = CycleState()
    s.write(
        LATENCY_PREDICTION_KEY,
        LatencyPredictionInfo(
            {k: LatencyPrediction(a, b, True) for k, (a, b) in preds.items()}, ttft, tpot
        ),
    )
    return s


def scores(state, params=None, eps=EPS):
    return plugin("latency-scorer", params).score(state, completion(), eps)


def kept(state, params=None, seed=0, eps=EPS):
    return [
        e.name
        for e in plugin("slo-headroom-tier-filter", params, seed).filter(state, completion(), eps)
    ]


# --- latency-scorer ------------------------------------------------------------------


def test_no_slo_prefers_the_lowest_predicted_latency():
    st = state_with({"a": (100, 10), "b": (300, 10), "c": (200, 10)})
    # TPOT flat → only TTFT counts: n = (0, 1, 0.5) → 1 − n
    assert scores(st) == pytest.approx([1.0, 0.0, 0.5])


def test_slo_met_least_headroom_packs_and_missing_scores_zero():
    # SLO TTFT 250: headroom a 150, c 50, b −50 (misses).
    st = state_with({"a": (100, 10), "b": (300, 10), "c": (200, 10)}, ttft=250)
    s = scores(st)
    assert s[1] == 0.0
    # meeting: a (n=1), c (n=0); least → 1 − n mapped to [0.1, 1]: a 0.1, c 1.0
    assert s[0] == pytest.approx(0.1) and s[2] == pytest.approx(1.0)


def test_slo_met_most_headroom_spreads():
    st = state_with({"a": (100, 10), "b": (300, 10), "c": (200, 10)}, ttft=250)
    s = scores(st, {"headroomSelectionStrategy": "most"})
    assert s == pytest.approx([1.0, 0.0, 0.1])


def test_nobody_meets_the_slo_closest_scores_highest():
    # SLO 100: deficits a 0.5, b 2.0, c 1.0 → n = (0, 1, 1/3) → 1 − n
    st = state_with({"a": (150, 10), "b": (300, 10), "c": (200, 10)}, ttft=100)
    assert scores(st) == pytest.approx([1.0, 0.0, 2 / 3])


def test_tpot_slo_counts_too():
    # TTFT fine everywhere (SLO 1000); TPOT SLO 20: b misses (30).
    st = state_with({"a": (100, 10), "b": (100, 30), "c": (100, 15)}, ttft=1000, tpot=20)
    s = scores(st)
    assert s[1] == 0.0 and s[0] > 0.0 and s[2] > 0.0


def test_without_predictions_the_scorer_is_neutral():
    assert scores(CycleState()) == [0.5, 0.5, 0.5]


def test_scorer_params_are_upstream_names():
    with pytest.raises(Exception, match="headroomSelectionStrategy"):
        plugin("latency-scorer", {"headroomSelectionStrategy": "middle"})


# --- slo-headroom-tier-filter ----------------------------------------------------------


def test_filter_keeps_the_meeting_tier():
    st = state_with({"a": (100, 10), "b": (300, 10), "c": (200, 10)}, ttft=250)
    assert kept(st, {"epsilonExploreNeg": 0.0}) == ["a", "c"]


def test_filter_explores_the_missing_tier_with_probability_epsilon():
    st = state_with({"a": (100, 10), "b": (300, 10), "c": (200, 10)}, ttft=250)
    assert kept(st, {"epsilonExploreNeg": 1.0}) == ["b"]
    f = plugin("slo-headroom-tier-filter", {"epsilonExploreNeg": 0.25}, seed=7)
    picks = [len(f.filter(st, completion(), EPS)) for _ in range(2000)]
    explored = picks.count(1) / len(picks)
    assert 0.2 < explored < 0.3  # seeded rng: about a quarter keep only b


def test_filter_without_a_meeting_endpoint_keeps_the_closest():
    # SLO 100: deficits a 0.5, b 2.0, c 0.55 → within 0.1 of 0.5: a and c
    st = state_with({"a": (150, 10), "b": (300, 10), "c": (155, 10)}, ttft=100)
    assert kept(st) == ["a", "c"]
    assert kept(st, {"closestDeficitSlack": 0.0}) == ["a"]


def test_filter_without_slo_or_predictions_keeps_all():
    assert kept(state_with({"a": (1, 1), "b": (9, 9), "c": (5, 5)})) == ["a", "b", "c"]
    assert kept(CycleState()) == ["a", "b", "c"]


# --- config -----------------------------------------------------------------------------


def test_slo_config_routes_a_tight_request_to_the_endpoint_that_meets_it():
    import random

    from epp.request import new_request, parse_body
    from epp.scheduling.registry import Handle

    path = Path(__file__).parents[2] / "config" / "slo.yaml"
    cfg = load_config_file(path, Handle(rng=random.Random(0)))

    req = parse_body(
        new_request({"x-slo-ttft-ms": "50"}, "/v1/completions", "POST"),
        b'{"model":"m","prompt":"' + b"x" * 400 + b'"}',
    )
    # cold start: TTFT = (100 + pending) / 15928 s; busy has 5000 pending → ~320 ms > 50.
    busy = snap("busy", inflight_prefill_tokens=5000)
    idle = snap("idle", queue=3)  # more queue (queue-scorer prefers busy) but meets the SLO
    picks = [cfg.scheduler.schedule(req, [busy, idle]).targets[0].name for _ in range(200)]
    # 1 % of picks explore the missing tier (epsilonExploreNeg); the seeded rng fixes how many.
    assert picks.count("idle") >= 190


# --- a 2x slower server, learnt from observations -----------------------------------------


def _observe(producer, name: str, slow: float, n: int, rng) -> None:
    """n finished requests on `name`, measured by TTFT = slow · (5 + 0.02·uncached +
    0.01·pending prefill) ms and TPOT = slow · (8 + 0.5·running) ms, under random load."""
    from epp.planner.core.window import RequestRecord

    for _ in range(n):
        isl, prefill, running = rng.randrange(10, 2000), rng.randrange(0, 8000), rng.randrange(8)
        e = snap(name, running=running, inflight_prefill_tokens=prefill)
        ttft = slow * (5.0 + 0.02 * isl + 0.01 * prefill)
        rec = RequestRecord(0.0, isl, 16, ttft, slow * (8.0 + 0.5 * running), 1.0, endpoint=name)
        producer.post_response(completion("x" * (4 * isl)), rec, e)  # estimate = isl tokens


def _slo_scheduler(path: Path):
    import random

    from epp.scheduling.registry import Handle

    return load_config_file(path, Handle(rng=random.Random(0)))


def test_slo_config_learns_a_2x_slower_server_in_min_samples_and_prefers_the_fast_one(tmp_path):
    import random

    from epp.config.variants import write_without_predictor
    from epp.request import new_request, parse_body

    path = Path(__file__).parents[2] / "config" / "slo.yaml"
    cfg = _slo_scheduler(path)
    producer = cfg.plugins["predicted-latency-producer"]
    need = producer.params.min_samples  # 32 in config/slo.yaml
    rng = random.Random(3)
    _observe(producer, "fast", 1.0, 200, rng)
    _observe(producer, "slow", 2.0, need - 1, rng)
    req = parse_body(
        new_request({"x-slo-ttft-ms": "1000"}, "/v1/completions", "POST"),
        b'{"model":"m","prompt":"' + b"x" * 400 + b'"}',
    )
    # equal loads: 100 uncached prompt tokens, 1000 pending prefill tokens on both
    eps = [snap("slow", inflight_prefill_tokens=1000), snap("fast", inflight_prefill_tokens=1000)]
    # fast's own law: 5 + 0.02·100 + 0.01·1000 = 17 ms; slow's: 2 · 17 = 34 ms
    producer.refit()
    info = producer.produce(CycleState(), req, eps)
    assert info.predictions["fast"].ttft_ms == pytest.approx(17.0, rel=1e-3)
    # 31 observations of its own: slow still borrows the pool fit (200 fast rows and 31
    # slow ones: between the two laws, not yet 2x)
    assert 17.0 < info.predictions["slow"].ttft_ms < 34.0 * 0.9
    _observe(producer, "slow", 2.0, 1, rng)  # the 32nd: its own fit takes over
    producer.refit()
    info = producer.produce(CycleState(), req, eps)
    assert info.predictions["slow"].ttft_ms == pytest.approx(34.0, rel=1e-3)
    # both meet the 1000 ms SLO, loads are equal: `most` headroom scores fast 1.0, slow 0.1
    picks = [cfg.scheduler.schedule(req, eps).targets[0].name for _ in range(50)]
    assert picks == ["fast"] * 50
    # the same stack without the predictor sees a tie and picks both
    bare = _slo_scheduler(write_without_predictor(path, tmp_path))
    picks = {bare.scheduler.schedule(req, eps).targets[0].name for _ in range(50)}
    assert picks == {"fast", "slow"}


def test_per_endpoint_models_are_bounded_by_the_sample_ring_when_endpoints_churn():
    import random

    p = plugin("predicted-latency-producer", {"maxSamples": 64, "minSamples": 16})
    rng = random.Random(4)
    for i in range(100):  # 100 endpoints come and go, 16 observations each
        _observe(p, f"e{i}", 1.0, 16, rng)
    coef = p.refit()
    # the ring holds the last 64 samples: the last 4 endpoints' 16 each, and only
    # endpoints with >= minSamples in it get a model of their own
    assert len(p.buffer) == 64
    assert set(coef.ttft_by_endpoint) == {"e96", "e97", "e98", "e99"}
    assert set(coef.tpot_by_endpoint) == {"e96", "e97", "e98", "e99"}
