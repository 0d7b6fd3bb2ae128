"""predicted-latency-producer: cold-start formula, learning a known law, bounded memory."""

import math
import random
from dataclasses import replace

import pytest

from epp.planner.window import RequestRecord
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
