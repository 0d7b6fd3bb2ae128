"""predicted-latency-producer: cold-start formula, learning a known law, bounded memory."""

import math
import random
from dataclasses import replace

import pytest

from epp.planner.core.window import RequestRecord
from epp.scheduling.types import CycleState
from plugins.latency.info import LatencyPredictionInfo
from plugins.latency.model import Sample, SampleBuffer, fit
from plugins.prefix.match_info import PREFIX_MATCH_KEY, PrefixMatchInfo
from tests.helpers import completion, plugin, snap


def produce(producer, endpoints, request=None, state=None) -> LatencyPredictionInfo:
    return producer.produce(state or CycleState(), request or completion("x" * 400), endpoints)


def test_cold_start_is_pending_prefill_over_throughput():
    p = plugin("predicted-latency-producer", {"coldPrefillTokensPerSecond": 1000, "coldTpotMs": 10})
    # prompt 400 chars / 4 = 100 tokens; endpoint b has 900 prefill tokens pending.
    eps = [snap("a", kv=0.0), snap("b", kv=0.5, inflight_prefill_tokens=900)]
    info = produce(p, eps)
    assert info.predictions["a"].ttft_ms == pytest.approx(100.0)  # 1000 ms · 100 / 1000
    assert info.predictions["b"].ttft_ms == pytest.approx(1000.0)  # (100 + 900) / 1000 s
    assert info.predictions["a"].tpot_ms == pytest.approx(10.0)  # 10 · (1 + 0)
    assert info.predictions["b"].tpot_ms == pytest.approx(15.0)  # 10 · (1 + 0.5)
    assert not info.predictions["a"].learned


def test_cold_start_subtracts_the_prefix_cached_tokens():
    p = plugin("predicted-latency-producer", {"coldPrefillTokensPerSecond": 1000})
    state = CycleState()
    # a holds 4 blocks of 16 = 64 of the 100 prompt tokens: 36 left to prefill.
    state.write(PREFIX_MATCH_KEY, PrefixMatchInfo(7, 16, {"a": 4}, {"a": 4}))
    info = produce(p, [snap("a"), snap("b")], state=state)
    assert info.predictions["a"].ttft_ms == pytest.approx(36.0)
    assert info.predictions["b"].ttft_ms == pytest.approx(100.0)


def _law_ttft(uncached, prefill, waiting, kv, slow):
    return slow * (5.0 + 0.02 * uncached + 0.01 * prefill + 30.0 * waiting + 40.0 * kv)


def _law_tpot(running, kv, slow):
    return slow * (8.0 + 0.5 * running + 10.0 * kv)


def _feed(p, rng, n, names_slow):
    """n finished requests on endpoints with random load, measured by the known law."""
    for _ in range(n):
        name, slow = rng.choice(names_slow)
        waiting, running, kv = rng.randrange(0, 8), rng.randrange(0, 32), rng.random()
        prefill, isl, cached = rng.randrange(0, 20000), rng.randrange(10, 4000), 0
        e = replace(
            snap(name, queue=waiting, running=running, kv=kv, inflight_prefill_tokens=prefill),
            inflight_requests=running,
        )
        rec = RequestRecord(
            finished_at=0.0,
            isl=isl,
            osl=100,
            ttft_ms=_law_ttft(isl - cached, prefill, waiting, kv, slow),
            itl_ms=_law_tpot(running, kv, slow),
            duration_s=1.0,
            endpoint=name,
        )
        p.post_response(completion("x" * (4 * isl)), rec, e)  # estimate = isl tokens


def test_learns_a_known_linear_law_per_endpoint():
    p = plugin("predicted-latency-producer")
    _feed(p, random.Random(1), 600, [("fast", 1.0), ("slow", 2.0)])
    coef = p.refit()
    assert set(coef.ttft_by_endpoint) == {"fast", "slow"}
    # A state never seen exactly: 1000 uncached tokens (4000 chars), 5000 pending, 3 waiting.
    e = replace(
        snap("slow", queue=3, running=10, kv=0.4, inflight_prefill_tokens=5000),
        inflight_requests=10,
    )
    info = produce(p, [e, replace(e, endpoint=snap("fast").endpoint)], completion("x" * 4000))
    # slow: 2 · (5 + 20 + 50 + 90 + 16) = 362 ms; fast half that.
    assert info.predictions["slow"].ttft_ms == pytest.approx(362.0, rel=1e-3)
    assert info.predictions["fast"].ttft_ms == pytest.approx(181.0, rel=1e-3)
    # TPOT slow: 2 · (8 + 5 + 4) = 34 ms.
    assert info.predictions["slow"].tpot_ms == pytest.approx(34.0, rel=1e-3)
    assert info.predictions["slow"].learned


def test_an_endpoint_without_enough_samples_borrows_the_pool_fit():
    p = plugin("predicted-latency-producer", {"minSamples": 50})
    _feed(p, random.Random(2), 200, [("a", 1.0)])
    p.refit()
    info = produce(p, [snap("new", queue=1)], completion("x" * 400))
    # the pool fit is a's law: 5 + 0.02·100 + 30·1 = 37 ms
    assert info.predictions["new"].ttft_ms == pytest.approx(37.0, rel=1e-3)
    assert info.predictions["new"].learned


def test_failed_and_unmeasured_responses_are_not_learned():
    p = plugin("predicted-latency-producer")
    e = snap("a")
    bad = RequestRecord(0.0, 10, 0, 50.0, 5.0, 1.0, ok=False, endpoint="a")
    empty = RequestRecord(0.0, 10, 0, math.nan, math.nan, 1.0, endpoint="a")
    p.post_response(completion(), bad, e)
    p.post_response(completion(), empty, e)
    assert len(p.buffer) == 0


def test_buffer_is_bounded_and_the_fit_uses_the_latest_law():
    buf = SampleBuffer(100)
    for i in range(250):
        y = 10.0 if i < 150 else 20.0  # the server got slower: only the recent law counts
        buf.add(Sample("a", (1.0, float(i % 7)), (1.0,), y, math.nan))
    assert len(buf) == 100 and buf.added == 250
    coef = fit(buf.copy(), min_samples=8)
    assert coef.ttft is not None and coef.tpot is None  # no TPOT samples at all
    assert coef.ttft[0] == pytest.approx(20.0, rel=1e-3)
    assert coef.ttft[1] == pytest.approx(0.0, abs=1e-3)


def test_slo_comes_from_headers_else_the_default():
    from epp.request import new_request, parse_body

    p = plugin("predicted-latency-producer", {"defaultTtftSloMs": 500})
    req = parse_body(
        new_request({"x-slo-tpot-ms": "25"}, "/v1/completions", "POST"),
        b'{"model":"m","prompt":"hi"}',
    )
    info = p.produce(CycleState(), req, [snap("a")])
    assert (info.slo_ttft_ms, info.slo_tpot_ms) == (500.0, 25.0)
    bad = parse_body(
        new_request({"x-slo-ttft-ms": "soon"}, "/v1/completions", "POST"),
        b'{"model":"m","prompt":"hi"}',
    )
    info = p.produce(CycleState(), bad, [snap("a")])
    assert (info.slo_ttft_ms, info.slo_tpot_ms) == (500.0, None)


async def test_background_refit_swaps_in_a_model():
    import asyncio

    p = plugin("predicted-latency-producer", {"refitIntervalSeconds": 0.05})
    _feed(p, random.Random(3), 100, [("a", 1.0)])
    await p.start()
    try:
        for _ in range(200):  # the task refits within a few intervals; no timing asserted
            if p.coefficients.ttft is not None:
                break
            await asyncio.sleep(0.05)
    finally:
        await p.stop()
    assert p.coefficients.samples == 100


def test_relative_fit_learns_a_law_whose_values_span_three_orders_of_magnitude():
    # y = 10 + 100·x for x in 0..99: 10 ms to ~10 s. The relative fit weights each row by
    # 1/y; its ridge penalty must shrink with those weights (it once stayed at the
    # unweighted size and flattened the slope, predicting ~100 ms for 10 s).
    samples = [Sample("a", (1.0, float(x)), (1.0,), 10.0 + 100.0 * x, math.nan) for x in range(100)]
    for relative in (True, False):
        coef = fit(samples, min_samples=8, relative=relative)
        assert coef.ttft is not None
        assert coef.ttft[1] == pytest.approx(100.0, rel=1e-3), relative
    # the relative fit also gets the small end right (the absolute one's ridge moves the
    # 10 ms intercept by ~0.5 ms, 5 %, which it does not weigh)
    assert coef_rel(samples)[0] == pytest.approx(10.0, rel=1e-3)


def coef_rel(samples):
    coef = fit(samples, min_samples=8, relative=True).ttft
    assert coef is not None
    return coef


def test_relative_fit_favours_small_relative_errors_over_small_absolute_ones():
    # Two regimes a linear law cannot both fit: short requests at 10 ms (x=0) and long ones
    # at 1000 or 3000 ms (x=1, half each). Absolute least squares takes the mean of each
    # regime: 10 and 2000 ms. Relative least squares weights the long rows by 1/y, so at
    # x=1 it minimises ((p-1000)/1000)² + ((p-3000)/3000)²: 9(p-1000) + (p-3000) = 0,
    # p = 1200 ms (a 20 % and a 60 % miss instead of 100 % and 33 %).
    rows = [Sample("a", (1.0, 0.0), (1.0,), 10.0, math.nan)] * 50
    rows += [Sample("a", (1.0, 1.0), (1.0,), 1000.0, math.nan)] * 25
    rows += [Sample("a", (1.0, 1.0), (1.0,), 3000.0, math.nan)] * 25
    absolute = fit(rows, min_samples=8, relative=False).ttft
    relative = fit(rows, min_samples=8, relative=True).ttft
    assert absolute is not None and relative is not None
    assert sum(absolute) == pytest.approx(2000.0, rel=1e-3)
    assert sum(relative) == pytest.approx(1200.0, rel=1e-3)
    assert relative[0] == pytest.approx(10.0, rel=1e-3)


def test_fit_objective_and_feature_set_are_parameters():
    p = plugin("predicted-latency-producer", {"fitObjective": "absolute", "features": "queue"})
    assert p.features.name == "queue" and not p._relative
    info = produce(p, [snap("a", queue=2, inflight_prefill_tokens=300)])
    # cold start reads the same columns in every set: (100 + 300) / 15928 tok/s
    assert info.predictions["a"].ttft_ms == pytest.approx(1000 * 400 / 15928)
    with pytest.raises(Exception, match="features"):
        plugin("predicted-latency-producer", {"features": "xgboost"})


def test_queue_features_scale_the_wait_by_the_endpoint_history():
    from plugins.latency.features import QUEUE, EndpointHistory

    h = EndpointHistory(alpha=0.5)
    h.observe("a", 100.0, 20.0, 1000.0, running=4)  # first one sets the averages
    h.observe("a", 300.0, math.nan, 2000.0, running=2)  # NaN TPOT leaves 20 ms
    r = h.get("a")
    assert r is not None
    assert (r.ttft_ms, r.tpot_ms, r.duration_ms, r.slots) == (200.0, 20.0, 1500.0, 4)
    e = replace(snap("a", queue=1, running=4, inflight_prefill_tokens=500), inflight_requests=7)
    x = QUEUE.ttft(e, 100, h, 0.0)
    # ahead = max(7 in flight − 4 slots, 1 scraped waiting) = 3; wait = 3 · 1500 / 4 = 1125
    assert x[6] == pytest.approx(1125.0)
    assert x[7] == pytest.approx((100 + 500) * 20.0 / 1000)  # prefill work × recent TPOT
    assert x[8] == 200.0
    h.retain({"b"})  # a left the pool: its own history goes, the pool's average stays
    assert h.get("a") is not None and h.get("a").slots == 4  # the pool-wide fallback
    h2 = EndpointHistory()
    assert h2.get("a") is None
    assert QUEUE.ttft(e, 100, h2, 0.0)[6:] == (0.0, 0.0, 0.0)  # no history yet: terms off


def test_history_keeps_only_the_pool_endpoints_after_a_pool_change():
    from epp.config.params import parse_params
    from epp.datastore import Endpoint
    from epp.scheduling.registry import PLUGIN_TYPES, Handle

    pool = [Endpoint("a", "10.0.0.1", 8000), Endpoint("b", "10.0.0.2", 8000)]
    listeners = []
    handle = Handle(
        pool=lambda: pool, on_pool_change=lambda fn: listeners.append(fn) or (lambda: None)
    )
    spec = PLUGIN_TYPES.lookup("predicted-latency-producer")
    p = spec.build("p", parse_params(spec.params, {"features": "queue"}), handle)
    for name in ("a", "b"):
        rec = RequestRecord(0.0, 10, 4, 50.0, 5.0, 0.2, endpoint=name)
        p.post_response(completion(), rec, snap(name))
    assert p.history._by.keys() == {"a", "b"}
    pool = pool[:1]  # b left the pool
    for fn in listeners:
        fn()
    assert p.history._by.keys() == {"a"}


def test_pending_age_is_the_oldest_waiting_request_age_at_the_pick():
    from plugins.latency.features import BASIC, FEATURE_SETS, EndpointHistory, pending_age_ms

    e = replace(snap("a"), oldest_pending_at=10.0)
    assert pending_age_ms(e, 10.25) == pytest.approx(250.0)
    assert pending_age_ms(e, 9.0) == 0.0  # a clock read before the stamp: never negative
    assert pending_age_ms(snap("a"), 10.25) == 0.0  # nothing waiting for a first byte
    aged = FEATURE_SETS["basic+age"]
    x = aged.ttft(e, 100, EndpointHistory(), 10.25)
    assert x[:-1] == BASIC.ttft(e, 100, EndpointHistory(), 10.25) and x[-1] == 250.0
    assert aged.ttft_names == (*BASIC.ttft_names, "pending_age_ms")
    assert aged.tpot_names == BASIC.tpot_names
    assert FEATURE_SETS["queue+age"].ttft(e, 100, EndpointHistory(), 10.25)[-1] == 250.0


def test_learns_how_far_the_server_is_into_the_step_in_progress():
    """The law of a chat behind a long prefill step: TTFT = 5 + 0.2 · pending prefill
    tokens − 0.9 · age of the oldest pending request (the step's elapsed part). Token
    counts alone cannot tell a step that just started from one about to end; with the
    age learned (from the record's routing time), the two are told apart."""
    from epp.config.params import parse_params
    from epp.scheduling.registry import PLUGIN_TYPES, Handle

    clock = [0.0]
    spec = PLUGIN_TYPES.lookup("predicted-latency-producer")
    params = parse_params(spec.params, {"features": "basic+age"})
    p = spec.build("p", params, Handle(clock=lambda: clock[0]))
    rng = random.Random(4)
    for _ in range(300):
        prefill = rng.randrange(500, 2000)
        age_ms = rng.uniform(0.0, 0.8 * 0.2 * prefill)  # the step is at most 80 % done
        routed = rng.uniform(100.0, 200.0)  # the pick's time on the server's clock
        e = replace(
            snap("a", inflight_prefill_tokens=prefill), oldest_pending_at=routed - age_ms / 1000
        )
        ttft = 5.0 + 0.2 * prefill - 0.9 * age_ms
        duration = ttft / 1000 + 0.5
        rec = RequestRecord(routed + duration, 10, 16, ttft, 10.0, duration, endpoint="a")
        p.post_response(completion("x" * 40), rec, e)
    p.refit()
    clock[0] = 50.0
    just_started = replace(snap("a", inflight_prefill_tokens=1500), oldest_pending_at=50.0)
    nearly_done = replace(just_started, oldest_pending_at=50.0 - 0.25)  # 250 ms in
    info = produce(p, [just_started], completion("x" * 40))
    assert info.predictions["a"].ttft_ms == pytest.approx(305.0, rel=1e-2)  # 5 + 300
    info = produce(p, [nearly_done], completion("x" * 40))
    assert info.predictions["a"].ttft_ms == pytest.approx(80.0, rel=1e-2)  # 305 − 225
