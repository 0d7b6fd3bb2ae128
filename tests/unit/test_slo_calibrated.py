"""calibrated-latency-producer and slo-calibrated-scorer on hand-made endpoint snapshots:
the queueing estimate, the learned speeds, the shrunk per-endpoint calibration, and the
placement (a tight request avoids the endpoint a loose one is sent to; ties as documented)."""

import json
import math
import random
from dataclasses import replace
from pathlib import Path

import pytest

from epp.config.loader import load_config_file
from epp.config.params import parse_params
from epp.records import RequestRecord
from epp.request import new_request, parse_body
from epp.scheduling.registry import PLUGIN_TYPES, Handle
from epp.scheduling.types import CycleState, ProfileResult, SchedulingResult
from plugins.latency.calibration import Calibrator, request_class
from plugins.latency.info import LATENCY_PREDICTION_KEY
from plugins.latency.queueing import STEP_WAIT, Speed, SpeedLearner, predict
from tests.helpers import snap
from tests.unit.test_slo_slack import (
    test_requests_without_targets_route_as_the_default_config as route_as_default,
)

ROOT = Path(__file__).parents[2]
NOW = 100.0
SPEED = Speed(prefill_ms_per_token=0.1, tpot_ms=10.0, slots=4)


def busy(name: str, requests: int, prefill: int = 0, output: int = 0, since: float | None = None):
    return replace(
        snap(name, inflight_prefill_tokens=prefill, inflight_tokens=prefill + output),
        inflight_requests=requests,
        oldest_pending_at=since,
    )


def request(words: int, ttft: float | None, tpot: float | None = None, rid: str = "r"):
    headers = {"x-request-id": rid}
    if ttft is not None:
        headers["x-slo-ttft-ms"] = f"{ttft:g}"
    if tpot is not None:
        headers["x-slo-tpot-ms"] = f"{tpot:g}"
    body = json.dumps({"model": "m", "prompt": "word " * words}).encode()
    return parse_body(new_request(headers, "/v1/completions", "POST"), body)


def build(type_name: str, params: dict | None = None, clock=lambda: NOW):
    spec = PLUGIN_TYPES.lookup(type_name)
    assert spec is not None
    handle = Handle(rng=random.Random(0), clock=clock)
    return spec.build(type_name, parse_params(spec.params, params), handle)


def record(endpoint: str, ttft: float, itl: float, isl: int = 100) -> RequestRecord:
    return RequestRecord(NOW + 1.0, isl, 16, ttft, itl, 1.0, endpoint=endpoint)


# --- the queueing estimate ----------------------------------------------------------------


def test_an_idle_server_starts_at_once_and_a_busy_one_after_the_step_it_is_in():
    idle = predict(busy("a", 0), 1000, SPEED, NOW)
    assert idle.ttft_ms == pytest.approx(100.0) and not idle.queued  # 1000 × 0.1 ms
    decoding = predict(busy("a", 2, output=64), 1000, SPEED, NOW)
    assert decoding.ttft_ms == pytest.approx(100.0 + STEP_WAIT * 10.0)


def test_prompt_tokens_ahead_count_less_the_part_already_prefilled():
    # a 3000-token prompt routed 200 ms ago: 300 ms of prefill of which 200 are done
    behind = predict(busy("a", 1, prefill=3000, since=NOW - 0.2), 100, SPEED, NOW)
    assert behind.ttft_ms == pytest.approx(100.0 + 10.0 + STEP_WAIT * 10.0)
    fresh = predict(busy("a", 1, prefill=3000, since=NOW), 100, SPEED, NOW)
    assert fresh.ttft_ms == pytest.approx(300.0 + 10.0 + STEP_WAIT * 10.0)


def test_a_full_batch_adds_the_wait_for_completions():
    # 6 in flight on 4 slots, 32 output tokens each: 3 must finish before this one starts
    full = predict(busy("a", 6, output=6 * 32), 100, SPEED, NOW)
    assert full.queued
    assert full.ttft_ms == pytest.approx(10.0 + STEP_WAIT * 10.0 + 3 * 32 * 10.0 / 4)
    assert full.ttft_ms > predict(busy("a", 3, output=3 * 32), 100, SPEED, NOW).ttft_ms


def test_speeds_are_learned_per_endpoint_and_a_new_one_borrows_the_pool():
    learner = SpeedLearner(SPEED, alpha=0.2)
    for _ in range(60):  # "slow" prefills at 0.3 ms/token and decodes at 30 ms
        learner.observe(busy("slow", 0), 1000, 300.0, 30.0, NOW)
        learner.observe(busy("fast", 0), 1000, 100.0, 10.0, NOW)
    slow, fast = learner.get("slow"), learner.get("fast")
    assert slow.prefill_ms_per_token == pytest.approx(0.3, rel=0.01)
    assert slow.tpot_ms == pytest.approx(30.0, rel=0.01)
    assert fast.prefill_ms_per_token == pytest.approx(0.1, rel=0.01)
    new = learner.get("new")
    assert fast.prefill_ms_per_token < new.prefill_ms_per_token < slow.prefill_ms_per_token
    learner.retain({"fast"})
    assert learner.get("slow") == learner.get("new")  # forgotten: back to the pool's


def test_a_queued_request_does_not_teach_the_prefill_speed():
    learner = SpeedLearner(SPEED, alpha=0.5)
    learner.observe(busy("a", 0), 1000, 100.0, 10.0, NOW)
    before = learner.get("a").prefill_ms_per_token
    learner.observe(busy("a", 9, output=9 * 32), 1000, 5000.0, 10.0, NOW)  # waited for a slot
    assert learner.get("a").prefill_ms_per_token == before


# --- calibration --------------------------------------------------------------------------


def test_few_lucky_samples_cannot_make_an_endpoint_look_better_than_the_pool():
    cal = Calibrator(alpha=0.1, prior_samples=20, z=0.0)
    for _ in range(200):
        cal.observe("a", "tight", "ttft", 100.0, 200.0)  # the pool runs 2x slower than said
    for _ in range(2):
        cal.observe("b", "tight", "ttft", 100.0, 50.0)  # two lucky ones on b
    # shrunk toward the pool's (itself pulled down a little by b's two): far from b's 0.5
    assert cal.factor("b", "tight", "ttft") > 1.2
    assert 1.2 < cal.factor("new", "tight", "ttft") <= cal.factor("a", "tight", "ttft")
    for _ in range(400):
        cal.observe("b", "tight", "ttft", 100.0, 50.0)
    assert cal.factor("b", "tight", "ttft") < 0.8  # enough of its own: b is faster
    assert cal.factor("a", "loose", "ttft") == 1.0  # no sample of the class yet


def test_the_margin_grows_with_the_spread_and_one_stall_is_clamped():
    steady, noisy = Calibrator(0.1, 0, z=1.0), Calibrator(0.1, 0, z=1.0)
    for i in range(100):
        steady.observe("a", "tight", "ttft", 100.0, 100.0)
        noisy.observe("a", "tight", "ttft", 100.0, 50.0 if i % 2 else 200.0)
    assert steady.factor("a", "tight", "ttft") == pytest.approx(1.0)
    assert noisy.factor("a", "tight", "ttft") > 1.5
    stalled = Calibrator(1.0, 0, z=0.0)
    stalled.observe("a", "tight", "ttft", 1.0, 1e9)
    assert stalled.factor("a", "tight", "ttft") == pytest.approx(10.0)
    stalled.observe("a", "tight", "ttft", 1.0, math.nan)  # ignored
    assert stalled.factor("a", "tight", "ttft") == pytest.approx(10.0)


def test_request_classes_follow_the_targets():
    assert request_class(150.0, 25.0, 500.0) == "tight"
    assert request_class(300.0, None, 500.0) == "tight"
    assert request_class(2000.0, None, 500.0) == "loose"
    assert request_class(None, None, 500.0) == "none"


def test_the_producer_learns_that_an_endpoint_is_slower_than_predicted():
    producer = build("calibrated-latency-producer", {"minSamples": 1, "quantileZ": 0})
    a, b = busy("a", 0), busy("b", 0)
    chat = request(40, 150.0, 25.0)
    first = producer.produce(CycleState(), chat, [a, b]).predictions
    assert first["a"].ttft_ms == pytest.approx(first["b"].ttft_ms)
    for _ in range(50):  # both prefill alike; a's tokens come 2x slower than b's
        producer.post_response(chat, record("a", first["a"].ttft_ms, 40.0), a)
        producer.post_response(chat, record("b", first["b"].ttft_ms, 20.0), b)
    later = producer.produce(CycleState(), chat, [a, b]).predictions
    assert later["a"].learned
    assert later["a"].tpot_ms == pytest.approx(2 * later["b"].tpot_ms, rel=0.05)
    failed = replace(record("b", 1.0, 1.0), ok=False)
    producer.post_response(chat, failed, b)  # a failed request teaches nothing
    assert producer.produce(CycleState(), chat, [a, b]).predictions == later


# --- placement ------------------------------------------------------------------------------


def test_a_tight_request_avoids_the_endpoint_a_loose_one_is_sent_to():
    producer = build("calibrated-latency-producer")
    scorer = build("slo-calibrated-scorer")
    # a has nothing in flight; b has two chats decoding (tight, in the scorer's ledger)
    for i in range(2):
        chat = request(20, 150.0, 25.0, rid=f"chat{i}")
        scorer.pre_request(chat, SchedulingResult({"p": ProfileResult([busy("b", 0)])}, "p"))
    a, b = busy("a", 0), busy("b", 2, output=64)
    long = request(3000, 3000.0, rid="long")  # loose: meets its 3 s on both
    st = CycleState()
    st.write(LATENCY_PREDICTION_KEY, producer.produce(st, long, [a, b]))
    sa, sb = scorer.score(st, long, [a, b])
    assert sa > sb  # it goes where no tight request waits behind its prefill
    # now a prefills that long prompt: a chat arriving next would wait ~250 ms there
    a = busy("a", 1, prefill=4000, since=NOW)
    chat = request(20, 150.0, 25.0, rid="chat9")
    st = CycleState()
    st.write(LATENCY_PREDICTION_KEY, producer.produce(st, chat, [a, b]))
    ca, cb = scorer.score(st, chat, [a, b])
    assert cb > 0.5 > ca  # b meets its targets (its tight requests lower it a little), a not


def test_ties_and_requests_without_targets_are_left_to_the_other_scorers():
    producer = build("calibrated-latency-producer")
    scorer = build("slo-calibrated-scorer")
    a, b = busy("a", 0), busy("b", 0)
    long = request(3000, 3000.0)
    st = CycleState()
    st.write(LATENCY_PREDICTION_KEY, producer.produce(st, long, [a, b]))
    assert scorer.score(st, long, [a, b]) == [1.0, 1.0]  # both safe, nobody harmed: a tie
    bare = request(20, None)
    st = CycleState()
    st.write(LATENCY_PREDICTION_KEY, producer.produce(st, bare, [a, b]))
    assert scorer.score(st, bare, [a, b]) == [0.5, 0.5]


def test_when_no_endpoint_meets_the_targets_the_fallback_is_as_configured():
    producer = build("calibrated-latency-producer")
    a, b = busy("a", 1, prefill=9000, since=NOW), busy("b", 1, prefill=5000, since=NOW)
    chat = request(20, 300.0, 25.0)  # misses on both (~600 and ~350 ms), by less on b
    st = CycleState()
    st.write(LATENCY_PREDICTION_KEY, producer.produce(st, chat, [a, b]))
    closest = build("slo-calibrated-scorer", {"whenNoneMeet": "closest"})
    sa, sb = closest.score(st, chat, [a, b])
    assert sb > sa and sb < 0.5
    default = build("slo-calibrated-scorer")  # the default (and the config's)
    assert default.score(st, chat, [a, b]) == [0.5, 0.5]


def graded_info(margin: dict, central: dict, ttft: float = 150.0, tpot: float | None = 25.0):
    """A hand-made prediction: per endpoint (TTFT, TPOT) ms with the margin and central."""
    from plugins.latency.calibrated import CalibratedPredictionInfo
    from plugins.latency.info import LatencyPrediction

    def preds(d: dict) -> dict:
        return {k: LatencyPrediction(t, p, True) for k, (t, p) in d.items()}

    return CalibratedPredictionInfo(preds(margin), ttft, tpot, central=preds(central))


def scores(scorer, info, names=("fast", "slow")) -> dict:
    st = CycleState()
    st.write(LATENCY_PREDICTION_KEY, info)
    eps = [busy(n, 0) for n in names]
    return dict(zip(names, scorer.score(st, request(20, 150.0, 25.0), eps), strict=True))


def test_a_request_every_endpoint_fails_at_the_margin_goes_where_the_central_estimate_meets():
    # With the margin neither meets; slow misses by least there (by 20 %, fast by 100 %),
    # but its TPOT misses at the central estimate too, where fast meets both.
    info = graded_info(
        margin={"fast": (300.0, 30.0), "slow": (160.0, 30.0)},
        central={"fast": (120.0, 20.0), "slow": (60.0, 30.0)},
    )
    graded = scores(build("slo-calibrated-scorer"), info)  # graded: the default
    assert graded["fast"] >= 0.5 > graded["slow"]  # fast is safe at the central estimate
    flat = scores(
        build("slo-calibrated-scorer", {"graded": False, "whenNoneMeet": "closest"}), info
    )
    assert flat["slow"] > flat["fast"]  # ungraded: the margin's smallest miss (the old way)
    # Where some endpoint meets with the margin, the central estimate is not consulted.
    info = graded_info(
        margin={"fast": (140.0, 24.0), "slow": (400.0, 60.0)},
        central={"fast": (300.0, 40.0), "slow": (100.0, 10.0)},
    )
    s = scores(build("slo-calibrated-scorer"), info)
    assert s["fast"] >= 0.5 > s["slow"]


def test_none_feasible_even_at_the_central_estimate_falls_back_as_documented():
    info = graded_info(
        margin={"fast": (600.0, 40.0), "slow": (300.0, 90.0)},
        central={"fast": (250.0, 24.0), "slow": (180.0, 30.0)},
    )
    # closest, on the central estimate: slow misses by 20 %, fast by 67 % (its TPOT met)
    closest = scores(build("slo-calibrated-scorer", {"whenNoneMeet": "closest"}), info)
    assert 0.5 > closest["slow"] > closest["fast"]
    # tpotFirst: fast meets the TPOT target, slow cannot: fast first whatever the TTFT
    first = build("slo-calibrated-scorer", {"whenNoneMeet": "closest", "tpotFirst": True})
    assert 0.5 > scores(first, info)["fast"] > scores(first, info)["slow"]
    # default (the config's): 0.5 everywhere, the other scorers decide
    assert scores(build("slo-calibrated-scorer"), info) == {"fast": 0.5, "slow": 0.5}
    both = build("slo-calibrated-scorer", {"whenNoneMeet": "default", "tpotFirst": True})
    assert scores(both, info) == {"fast": 0.5, "slow": 0.0}


def test_the_producer_gives_the_central_estimate_beside_the_margin():
    producer = build("calibrated-latency-producer", {"minSamples": 1, "quantileZ": 2})
    a = busy("a", 0)
    chat = request(40, 150.0, 25.0)
    first = producer.produce(CycleState(), chat, [a]).predictions
    rng = random.Random(1)
    for _ in range(50):  # noisy: observed = predicted × e^N(0.3, 0.3)
        itl = first["a"].tpot_ms * math.exp(rng.gauss(0.3, 0.3))
        producer.post_response(chat, record("a", first["a"].ttft_ms, itl), a)
    info = producer.produce(CycleState(), chat, [a])
    margin, central = info.predictions["a"].tpot_ms, info.central["a"].tpot_ms
    assert margin > 1.3 * central > 1.3 * first["a"].tpot_ms
    assert info.at_central().predictions["a"] == info.central["a"]


def test_the_config_loads_and_refuses_a_second_latency_producer(tmp_path):
    cfg = load_config_file(ROOT / "config" / "slo-calibrated.yaml", Handle(rng=random.Random(0)))
    assert "slo-calibrated-scorer" in cfg.plugins
    text = (ROOT / "config" / "slo-calibrated.yaml").read_text()
    bad = tmp_path / "two.yaml"
    bad.write_text(
        text.replace(
            "- type: calibrated-latency-producer",
            "- type: predicted-latency-producer\n- type: calibrated-latency-producer",
            1,
        )
    )
    with pytest.raises(Exception, match="latency-prediction"):
        load_config_file(bad, Handle(rng=random.Random(0)))


def test_requests_without_targets_route_as_the_default_config():
    route_as_default("slo-calibrated.yaml")
    route_as_default("default.yaml")  # the built-in default carries the SLO pair


def test_without_a_request_with_targets_the_producer_predicts_and_learns_nothing():
    producer = build("calibrated-latency-producer", {"minSamples": 1})
    a = busy("a", 0)
    plain = request(40, None, None)
    info = producer.produce(CycleState(), plain, [a])
    assert not info.has_slo and info.predictions == {}
    producer.post_response(plain, record("a", 50.0, 40.0), a)
    assert producer.finished == 0  # a pool without targets pays nothing per response
    producer.produce(CycleState(), request(40, 150.0, 25.0), [a])  # the first target
    producer.post_response(plain, record("a", 50.0, 40.0), a)
    assert producer.finished == 1
