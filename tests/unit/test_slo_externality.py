"""slo-externality-scorer on hand-made snapshots: its in-flight ledger and the harm term."""

import json

from epp.request import new_request, parse_body
from epp.scheduling.types import CycleState, ProfileResult, SchedulingResult
from plugins.latency.info import LATENCY_PREDICTION_KEY, LatencyPrediction, LatencyPredictionInfo
from tests.helpers import plugin, snap

A, B = snap("a"), snap("b")
PREDS = {"a": (60.0, 10.0), "b": (60.0, 10.0)}  # both meet every target below


def request(words: int, ttft: float, tpot: float | None = None, rid: str = "r"):
    headers = {"x-request-id": rid, "x-slo-ttft-ms": f"{ttft:g}"}
    if tpot is not None:
        headers["x-slo-tpot-ms"] = f"{tpot:g}"
    body = json.dumps({"model": "m", "prompt": "word " * words}).encode()
    return parse_body(new_request(headers, "/v1/completions", "POST"), body)


def state(req) -> CycleState:
    s = CycleState()
    ttft = float(req.headers["x-slo-ttft-ms"])
    tpot = req.headers.get("x-slo-tpot-ms")
    preds = {k: LatencyPrediction(a, b, True) for k, (a, b) in PREDS.items()}
    s.write(LATENCY_PREDICTION_KEY, LatencyPredictionInfo(preds, ttft, tpot and float(tpot)))
    return s


def route(scorer, req, endpoint) -> None:
    scorer.pre_request(req, SchedulingResult({"p": ProfileResult([endpoint])}, "p"))


def test_a_long_request_avoids_the_endpoint_where_tight_requests_wait():
    scorer = plugin("slo-externality-scorer")
    for i in range(3):
        route(scorer, request(20, 150, 25, rid=f"chat{i}"), A)
    long = request(8000, 2000, rid="long")
    a, b = scorer.score(state(long), long, [A, B])
    assert b == 1.0 and a < b  # meets its target on both: goes where it harms no one
    # a chat's own prefill is short: the tight requests on A barely move it
    chat = request(20, 150, 25, rid="chat9")
    ca, cb = scorer.score(state(chat), chat, [A, B])
    assert cb - ca < 0.05


def test_ties_are_left_to_the_other_scorers_and_finished_requests_leave_the_ledger():
    scorer = plugin("slo-externality-scorer")
    long = request(8000, 2000, rid="long")
    assert scorer.score(state(long), long, [A, B]) == [1.0, 1.0]  # nobody waiting: tie
    chat = request(20, 150, 25, rid="chat0")
    route(scorer, chat, A)
    assert scorer.score(state(long), long, [A, B])[0] < 1.0
    scorer.post_response(chat, None, A)  # type: ignore[arg-type]
    assert scorer.score(state(long), long, [A, B]) == [1.0, 1.0]


def test_loose_requests_in_flight_are_not_protected_and_no_targets_is_neutral():
    scorer = plugin("slo-externality-scorer", {"tightTtftMs": 500})
    route(scorer, request(8000, 2000, rid="other-long"), A)  # loose: not tight
    long = request(8000, 2000, rid="long")
    assert scorer.score(state(long), long, [A, B]) == [1.0, 1.0]
    bare = parse_body(new_request({}, "/v1/completions", "POST"), b'{"model":"m","prompt":"x"}')
    assert scorer.score(CycleState(), bare, [A, B]) == [0.5, 0.5]


def test_the_guard_never_trades_the_requests_own_target_for_the_others():
    # A meets the long request's target but has tight requests in flight; B would miss it
    scorer = plugin("slo-externality-scorer", {"harmWeight": 100})
    for i in range(5):
        route(scorer, request(20, 100, 20, rid=f"chat{i}"), A)
    long = request(8000, 2000, rid="long")
    st = CycleState()
    preds = {"a": LatencyPrediction(500, 10, True), "b": LatencyPrediction(2500, 10, True)}
    st.write(LATENCY_PREDICTION_KEY, LatencyPredictionInfo(preds, 2000.0, None))
    a, b = scorer.score(st, long, [A, B])
    assert 0.5 < a < 1.0 and b < 0.5  # harm lowers A within the safe band, never below B
    unguarded = plugin("slo-externality-scorer", {"harmWeight": 100, "guard": False})
    unguarded.ledger = scorer.ledger
    ua, ub = unguarded.score(st, long, [A, B])
    assert ua < ub  # without the guard the harm can outweigh the request's own miss
