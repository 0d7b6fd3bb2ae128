"""slo-tier-scorer on hand-made endpoint snapshots and predictions; config/slo-tiers.yaml
through the scheduler (no targets, or no endpoint able to meet them: the default's pick)."""

import json
import random
from pathlib import Path

import pytest

from epp.config.loader import load_config_file, load_default_config
from epp.records import RequestRecord
from epp.request import new_request, parse_body
from epp.scheduling.registry import Handle
from epp.scheduling.types import CycleState, ProfileResult, SchedulingResult
from plugins.latency.info import LATENCY_PREDICTION_KEY, LatencyPrediction, LatencyPredictionInfo
from plugins.latency.tiers import SpeedBook
from tests.helpers import plugin, snap

ROOT = Path(__file__).resolve().parents[2]
FAST, SLOW = snap("fast"), snap("slow")
CHAT = (200.0, 25.0)  # TTFT / TPOT targets of a chat
LONG = (2000.0, None)


def request(words: int, targets, rid: str = "r"):
    ttft, tpot = targets
    headers = {"x-request-id": rid, "x-slo-ttft-ms": f"{ttft:g}"}
    if tpot is not None:
        headers["x-slo-tpot-ms"] = f"{tpot:g}"
    body = json.dumps({"model": "m", "prompt": "word " * words}).encode()
    return parse_body(new_request(headers, "/v1/completions", "POST"), body)


def state(req, preds: dict[str, tuple[float, float]]) -> CycleState:
    s = CycleState()
    ttft = float(req.headers["x-slo-ttft-ms"])
    tpot = req.headers.get("x-slo-tpot-ms")
    p = {k: LatencyPrediction(a, b, True) for k, (a, b) in preds.items()}
    s.write(LATENCY_PREDICTION_KEY, LatencyPredictionInfo(p, ttft, tpot and float(tpot)))
    return s


def route(scorer, req, endpoint) -> None:
    scorer.pre_request(req, SchedulingResult({"p": ProfileResult([endpoint])}, "p"))


def record(endpoint, ttft_ms: float, itl_ms: float) -> RequestRecord:
    return RequestRecord(0.0, 100, 20, ttft_ms, itl_ms, 1.0, endpoint=endpoint.name)


def learn_speeds(scorer, slow_factor: float = 2.0) -> None:
    """Finished requests: `slow` decodes and prefills `slow_factor` times slower."""
    req = request(100, LONG, rid="done")
    for _ in range(8):
        scorer.post_response(req, record(FAST, 50.0, 10.0), FAST)
        scorer.post_response(req, record(SLOW, 50.0 * slow_factor, 10.0 * slow_factor), SLOW)


# Predictions: the chat's TPOT target holds on the fast endpoint only; the long prompt's
# TTFT target holds on both.
PREDS = {"fast": (100.0, 12.0), "slow": (180.0, 24.0)}


def test_a_tight_request_avoids_the_endpoint_a_loose_one_is_sent_to():
    scorer = plugin("slo-tier-scorer", {"steerMinTokens": 0})
    learn_speeds(scorer)
    assert scorer.speeds.relative("slow") == pytest.approx(0.5)
    chat = request(40, CHAT, rid="chat")
    assert scorer.score(state(chat, PREDS), chat, [FAST, SLOW]) == [1.0, 0.0]  # 24 × 1.25 > 25
    long = request(1500, LONG, rid="long")
    fast, slow = scorer.score(state(long, PREDS), long, [FAST, SLOW])
    assert slow == 1.0 and 0.5 < fast < slow  # steered to the slower endpoint


def test_loose_requests_leave_the_endpoints_where_tight_ones_are_in_flight():
    scorer = plugin("slo-tier-scorer", {"tightWeight": 1, "steerMinTokens": 0})
    a, b = snap("a"), snap("b")
    preds = {"a": (100.0, 12.0), "b": (100.0, 12.0), "c": (100.0, 40.0)}
    chat = request(40, CHAT, rid="chat")
    scorer.score(state(chat, preds), chat, [a, b, snap("c")])  # tight: c cannot meet it
    route(scorer, chat, a)
    long = request(1500, LONG, rid="long")
    sa, sb = scorer.score(state(long, preds), long, [a, b])
    assert sb == 1.0 and sa == pytest.approx(0.75)  # need 1 × (1 + 1) against 1
    scorer.post_response(chat, record(a, 50.0, 10.0), a)  # finished: the tie comes back
    assert scorer.score(state(long, preds), long, [a, b]) == [1.0, 1.0]


def test_ties_are_left_to_the_other_scorers():
    scorer = plugin("slo-tier-scorer", {"steerMinTokens": 0})
    long = request(1500, LONG)
    a, b = snap("a"), snap("b")
    preds = {"a": (100.0, 12.0), "b": (100.0, 12.0)}
    assert scorer.score(state(long, preds), long, [a, b]) == [1.0, 1.0]


def test_an_endpoint_over_its_token_cap_takes_no_more_steered_requests():
    scorer = plugin("slo-tier-scorer", {"capShare": 1.0, "steerMinTokens": 0})
    learn_speeds(scorer)  # slow is a third of the pool's speed: 1 / (1 + 0.5)
    long = request(1500, LONG)
    under = [snap("fast", inflight_tokens=2000), snap("slow", inflight_tokens=1000)]
    assert scorer.score(state(long, PREDS), long, under)[1] == 1.0
    over = [snap("fast", inflight_tokens=2000), snap("slow", inflight_tokens=1001)]
    assert scorer.score(state(long, PREDS), long, over) == [1.0, 0.5]


def test_short_loose_prompts_are_not_steered():
    scorer = plugin("slo-tier-scorer", {"steerMinTokens": 512})
    learn_speeds(scorer)
    short = request(40, (2000.0, None))
    assert scorer.score(state(short, PREDS), short, [FAST, SLOW]) == [1.0, 1.0]


def test_the_margin_makes_a_just_meeting_endpoint_infeasible():
    chat = request(40, CHAT)
    preds = {"fast": (100.0, 12.0), "slow": (100.0, 22.0)}  # slow meets 25 ms, not with 1.25
    assert plugin("slo-tier-scorer", {"margin": 1.0}).score(
        state(chat, preds), chat, [FAST, SLOW]
    ) == [1.0, 1.0]
    assert plugin("slo-tier-scorer").score(state(chat, preds), chat, [FAST, SLOW]) == [1.0, 0.0]


def test_deep_overload_and_no_targets_are_neutral_and_leave_no_ledger_entry():
    scorer = plugin("slo-tier-scorer")
    chat = request(40, CHAT, rid="chat")
    nowhere = {"fast": (900.0, 90.0), "slow": (900.0, 90.0)}
    assert scorer.score(state(chat, nowhere), chat, [FAST, SLOW]) == [0.5, 0.5]
    route(scorer, chat, FAST)
    assert scorer.ledger.entries == {}
    bare = parse_body(new_request({}, "/v1/completions", "POST"), b'{"model":"m","prompt":"x"}')
    assert scorer.score(CycleState(), bare, [FAST, SLOW]) == [0.5, 0.5]


def test_speed_book_ignores_bad_samples_and_forgets_removed_endpoints():
    book = SpeedBook(4)
    assert book.relative("x") == 1.0  # unknown: counts as the fastest
    book.observe("a", 10.0, float("nan"))
    book.observe("b", 30.0, 0.0)
    assert book.relative("b") == pytest.approx(1 / 3) and book.relative("a") == 1.0
    book.retain({"b"})
    assert book.relative("b") == 1.0


def _request(headers: dict[str, str], words: int):
    body = b'{"model":"m","prompt":"' + b"x " * words + b'"}'
    return parse_body(new_request(headers, "/v1/completions", "POST"), body)


@pytest.mark.parametrize(
    "headers",
    [{}, {"x-slo-ttft-ms": "0.001", "x-slo-tpot-ms": "0.001"}],
    ids=["no-targets", "nobody-can-meet"],
)
def test_config_routes_as_the_default_without_targets_or_in_deep_overload(headers):
    tiers = load_config_file(ROOT / "config" / "slo-tiers.yaml", Handle(rng=random.Random(0)))
    default = load_default_config(Handle(rng=random.Random(0)))
    rng = random.Random(5)
    for _ in range(50):
        eps = [
            snap(n, inflight_tokens=rng.randrange(5000), inflight_prefill_tokens=rng.randrange(900))
            for n in ("a", "b", "c")
        ]
        req = _request(headers, words=rng.randrange(10, 300))
        got = tiers.scheduler.schedule(req, eps).targets[0].name
        assert got == default.scheduler.schedule(req, eps).targets[0].name
