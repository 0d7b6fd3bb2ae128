"""The eviction rules (epp/flowcontrol/eviction.py) against llm-d-router's: which requests,
how many per decision, and the pacing gate; and the dropped reason of every refusal."""

import pytest

from epp.errors import EppError, unavailable
from epp.flowcontrol.eviction import Evictor, Running, confirmation_grace
from epp.limits import BodyBudget


def item(priority: int, at: float, log: list[str], name: str, stoppable: bool = True) -> Running:
    def stop() -> bool:
        log.append(name)
        return stoppable

    return Running(priority, at, name, stop)


def test_victims_lowest_priority_then_newest_first_and_only_below_the_demand():
    ev, log = Evictor(), []
    for p, at, name in [(-1, 1.0, "a"), (-2, 2.0, "b"), (-1, 3.0, "c"), (-2, 0.5, "d")]:
        ev.track(item(p, at, log, name))
    assert [r.request_id for r in ev.victims(0)] == ["b", "d", "c", "a"]
    assert [r.request_id for r in ev.victims(-1)] == ["b", "d"]  # strictly below the demand


def test_one_decision_evicts_the_deficit_over_the_mean_share_capped_at_two():
    ev, log = Evictor(grace=0.01), []
    for i in range(8):
        ev.track(item(-1, float(i), log, f"r{i}"))
    # saturation 1.0 at ceiling 1.0 (8 in flight): deficit 0 → at least one
    assert [r.request_id for r in ev.reclaim(1.0, 1.0, 100, 8, now=10.0)] == ["r7"]
    assert log == ["r7"] and ev.evictable == 7
    assert not ev.gate_open(10.0)  # unconfirmed: stop-and-wait
    ev.ended(ev_item := next(iter(ev._outstanding)), now=10.002)
    assert ev_item.request_id == "r7"
    assert not ev.gate_open(10.005)  # cooling for the grace
    assert ev.gate_open(10.02) and ev.pending == 0.0
    # saturation 1.5 over ceiling 1.0 with 8 in flight (0.1875 each): 3 wanted, 2 allowed
    assert [r.request_id for r in ev.reclaim(1.5, 1.0, 100, 8, now=11.0)] == ["r6", "r5"]


def test_a_request_that_cannot_stop_is_skipped_and_not_counted():
    ev, log = Evictor(), []
    ev.track(item(-1, 1.0, log, "old"))
    ev.track(item(-1, 2.0, log, "over", stoppable=False))
    assert [r.request_id for r in ev.reclaim(1.0, 1.0, 0, 2, now=5.0)] == ["old"]
    assert log == ["over", "old"] and ev.evictable == 0


def test_an_unconfirmed_eviction_times_out_so_the_gate_reopens():
    ev, log = Evictor(grace=0.5, confirmation_timeout=10.0), []
    ev.track(item(-1, 1.0, log, "stuck"))
    assert ev.reclaim(1.0, 1.0, 0, 1, now=2.0)
    assert not ev.gate_open(11.9)
    assert ev.next_change() == pytest.approx(12.0)
    assert not ev.gate_open(12.0)  # timed out → cooling for the grace
    assert ev.gate_open(12.5)


def test_ended_is_idempotent_and_untracks():
    ev, log = Evictor(), []
    r = item(-1, 1.0, log, "x")
    ev.track(r)
    ev.ended(r, 2.0)
    ev.ended(r, 3.0)
    assert ev.evictable == 0 and ev.reclaim(1.0, 1.0, 0, 1, now=4.0) == []


def test_no_eviction_below_the_ceiling_or_with_nothing_in_flight():
    ev, log = Evictor(), []
    ev.track(item(-1, 1.0, log, "x"))
    assert ev.reclaim(0.9, 1.0, 0, 4, now=1.0) == []
    assert ev.reclaim(1.0, 1.0, 0, 0, now=1.0) == []
    assert log == []


def test_grace_follows_the_detector():
    class Concurrency:
        type_name = "concurrency-detector"

    class Params:
        metrics_staleness_threshold = 0.2

    class Utilization:
        type_name = "utilization-detector"
        params = Params()

    assert confirmation_grace(Concurrency(), 0.05) == pytest.approx(0.01)
    assert confirmation_grace(Utilization(), 0.05) == pytest.approx(0.05 + 0.2 + 0.25)


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (EppError(429, "saturated", "too_many_requests"), "rejected-saturated"),
        (unavailable("no endpoints"), "rejected-no-endpoints"),
        (EppError(503, "waited", "queue_timeout"), "rejected-ttl-expired"),
        (EppError(503, "draining", "whatever"), "rejected-no-endpoints"),
        (EppError(429, "x", "evicted", reason="evicted-priority"), "evicted-priority"),
        (EppError(400, "bad", "bad_request"), ""),
    ],
)
def test_every_429_and_503_has_a_dropped_reason(error, reason):
    assert error.dropped_reason == reason


def test_the_body_budget_refusal_names_its_reason():
    budget = BodyBudget(10)
    with pytest.raises(EppError) as e:
        budget.take(11)
    assert e.value.status == 503 and e.value.dropped_reason == "rejected-body-buffer-full"


def test_the_immediate_response_carries_the_reason_header():
    from epp.extproc.messages import immediate_response

    resp = immediate_response(EppError(503, "waited", "queue_timeout"))
    headers = {
        h.header.key: h.header.raw_value.decode()
        for h in resp.immediate_response.headers.set_headers
    }
    assert headers["x-llm-d-request-dropped-reason"] == "rejected-ttl-expired"
    plain = immediate_response(EppError(400, "bad", "bad_request"))
    keys = {h.header.key for h in plain.immediate_response.headers.set_headers}
    assert "x-llm-d-request-dropped-reason" not in keys
