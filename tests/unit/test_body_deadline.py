"""The body deadline (`_BodyDeadline`, one timer per stream, its begin / fired / end
inlined in `ExtProcServicer.Process`) behaves as the `asyncio.timeout_at` around each
message wait that it replaced. Driven through the real servicer loop with Envoy's
message sequences; real asyncio, no timing asserted: the tests only wait for the
deadline to pass."""

from __future__ import annotations

import asyncio
import time

import pytest

from epp.extproc.server import ExtProcServicer, StreamLimits
from epp.headers import DESTINATION_ENDPOINT
from tests.unit.test_observer_stream import setup
from tests.unit.test_stream import BASE_HEADERS, BODY, body_msg, headers_msg


def servicer(body_timeout: float) -> tuple[ExtProcServicer, object]:
    ds, director, *_ = setup()
    return ExtProcServicer(director, StreamLimits(body_timeout=body_timeout)), ds


async def _answers(svc: ExtProcServicer, feed) -> list:
    return [resp async for resp in svc.Process(feed, context=None)]


def _is_408(resp) -> bool:
    return resp.HasField("immediate_response") and resp.immediate_response.status.code == 408


async def test_a_wait_past_the_deadline_answers_408_and_the_task_is_not_left_cancelled():
    async def feed():
        yield headers_msg(BASE_HEADERS)
        await asyncio.Future()  # the body never comes

    svc, ds = servicer(0.01)
    out = await _answers(svc, feed())
    assert len(out) == 1 and _is_408(out[0])
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0  # uncancelled: the 408 went out
    assert svc.open_streams == 0 and ds.inflight("e0") == (0, 0)


async def test_a_wait_that_starts_after_the_deadline_answers_408():
    async def feed():
        yield headers_msg(BASE_HEADERS)
        time.sleep(0.02)  # past it while the loop is busy (no timer callback can run)
        yield body_msg(BODY[:5], False)
        await asyncio.Future()

    svc, _ = servicer(0.01)
    out = await _answers(svc, feed())
    assert len(out) == 1 and _is_408(out[0])


async def test_messages_before_the_deadline_pass_and_routing_disarms_it():
    async def feed():
        yield headers_msg(BASE_HEADERS)
        for i in range(0, len(BODY) - 1, 4):  # several chunks, one timer for all of them
            yield body_msg(BODY[i : i + 4], False)
        yield body_msg(b"", True)
        await asyncio.sleep(0.1)  # routed, then well past the deadline: nothing fires

    svc, ds = servicer(0.05)
    out = await _answers(svc, feed())
    assert not any(_is_408(r) for r in out)
    assert out[0].HasField("request_headers") and out[-1].HasField("request_body")
    routed = {h.header.key for h in out[0].request_headers.response.header_mutation.set_headers}
    assert DESTINATION_ENDPOINT in routed
    assert ds.inflight("e0") == (0, 0)  # given back when the stream ended


async def test_someone_elses_cancel_is_not_turned_into_a_timeout():
    got = []

    async def feed():
        yield headers_msg(BASE_HEADERS)
        await asyncio.Future()

    async def consume(svc):
        async for resp in svc.Process(feed(), context=None):
            got.append(resp)

    svc, _ = servicer(30.0)
    task = asyncio.ensure_future(consume(svc))
    for _ in range(100):  # until the servicer waits for the body
        await asyncio.sleep(0)
        if svc.open_streams:
            break
    task.cancel()  # Envoy reset the stream
    with pytest.raises(asyncio.CancelledError):
        await task
    assert got == [] and svc.open_streams == 0
