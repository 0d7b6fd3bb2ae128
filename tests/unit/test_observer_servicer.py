"""The servicer's side of the observer mode, driven through `ExtProcServicer.Process` with
the exact message sequences Envoy 1.40 sends (see epp/extproc/observer.py): a stream whose
first message has `observability_mode` is an observer stream and gets no answer; the
sweep timer gives back a parked request whose observer never comes."""

import asyncio

from epp.extproc.handoff import RouteTable
from epp.extproc.server import ExtProcServicer
from tests.unit.test_observer_stream import observed, request_headers_with, setup
from tests.unit.test_stream import BASE_HEADERS, body_msg, headers_msg
from tests.unit.test_stream_response import BODY, response_body, response_headers, token


async def run(servicer, messages):
    async def feed():
        for msg in messages:
            yield msg

    return [resp async for resp in servicer.Process(feed(), context=None)]


async def test_routing_then_observer_stream_release_and_the_observer_gets_no_answer():
    ds, director, observer, _, _, records = setup()
    routes = RouteTable()  # the real clock: the sweep below never fires within this test
    servicer = ExtProcServicer(director, observer=observer, routes=routes)
    out = await run(servicer, [headers_msg(BASE_HEADERS), body_msg(BODY, True)])
    assert len(out) == 2 and len(routes) == 1  # headers answer + the body; leg parked
    assert ds.inflight("e0")[0] == 1
    stream = [
        request_headers_with(f"{routes.nonce}.1"),
        observed(response_headers()),
        observed(response_body(token("a"), False)),
        observed(response_body(b"", True)),
    ]
    assert await run(servicer, stream) == []
    assert ds.inflight("e0") == (0, 0) and len(records) == 1 and records[0].ok
    assert servicer.open_streams == 0
    servicer._sweep_timer.cancel()


async def test_an_unclaimed_request_is_given_back_by_the_sweep_timer():
    ds, director, observer, _, _, records = setup()
    routes = RouteTable(join_timeout=0.01)
    servicer = ExtProcServicer(director, observer=observer, routes=routes)
    await run(servicer, [headers_msg(BASE_HEADERS), body_msg(BODY, True)])
    assert servicer._sweep_timer is not None  # armed by the parked leg
    for _ in range(1000):  # the timer fires 10 ms later; bounded wait, not a timing test
        if not len(routes):
            break
        await asyncio.sleep(0.01)
    assert ds.inflight("e0") == (0, 0) and routes.expired == 1
    assert (records[0].ok, records[0].status) == (False, 0)
    assert servicer._sweep_timer is None  # nothing left: no timer


async def test_an_observer_stream_to_an_epp_not_in_observer_mode_is_drained_unanswered():
    ds, director, observer, _, _, _ = setup()
    servicer = ExtProcServicer(director, observer=observer)
    stream = [request_headers_with("x.1"), observed(response_headers())]
    assert await run(servicer, stream) == []
    assert ds.inflight("e0") == (0, 0) and servicer.open_streams == 0
