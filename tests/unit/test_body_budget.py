"""The body budget's shares (epp/body_budget.py): no client holds more than its share,
small requests always find room, every byte comes back; and the minimum body rate
refuses a trickle long before the body timeout (the real servicer loop, no timing
asserted beyond "it came before the body timeout")."""

from __future__ import annotations

import asyncio
import json

import pytest

from epp.body_budget import BodyBudget, BodyShares
from epp.errors import EppError
from epp.extproc import messages as m
from epp.extproc.server import ExtProcServicer, StreamLimits
from epp.extproc.stream import RequestStream
from tests.unit.test_observer_stream import setup
from tests.unit.test_stream import BASE_HEADERS, body_msg, headers_msg, make_director

MiB = 1 << 20


def budget(**kw) -> BodyBudget:
    return BodyBudget(256 * MiB, BodyShares(**kw))


def test_defaults_are_fractions_of_the_budget():
    b = budget()
    assert (b.per_connection, b.per_source, b.reserve) == (32 * MiB, 64 * MiB, 32 * MiB)


def test_one_source_cannot_hold_more_than_its_share_and_others_still_can():
    b = budget()
    held = []
    for i in range(32):  # the probe: 32 connections, one address, 8 MiB each
        t = b.ticket("10.0.0.9", f"c{i}", declared=8 * MiB + 1)
        try:
            b.take(8 * MiB, t)
            held.append(t)
        except EppError as e:
            assert (e.status, e.code) == (429, "client_body_buffer_full")
            assert "--max-buffered-bytes-per-source" in e.message
    assert len(held) == 8 and b.by_source == {"10.0.0.9": 64 * MiB}
    other = b.ticket("10.0.0.10", "d0", declared=8 * MiB)
    b.take(8 * MiB, other)  # another client is not refused
    for t in [*held, other]:
        b.release(t)
    assert (b.held, b.held_large, b.by_source, b.by_connection) == (0, 0, {}, {})


def test_one_connection_cannot_hold_more_than_its_share():
    b = budget(per_connection=10 * MiB)
    first = b.ticket("a", "conn", 0)
    b.take(6 * MiB, first)
    second = b.ticket("a", "conn", 0)
    with pytest.raises(EppError) as e:
        b.take(6 * MiB, second)
    assert e.value.status == 429 and "--max-buffered-bytes-per-connection" in e.value.message
    assert second.held == 0 and b.held == 6 * MiB  # a refused chunk takes nothing


def test_large_bodies_from_many_addresses_leave_the_reserve_to_small_ones():
    b = budget()
    large = []
    for i in range(32):  # the same attack from 32 addresses: no per-client share helps
        t = b.ticket(f"10.0.1.{i}", f"c{i}", declared=8 * MiB + 1)
        try:
            b.take(8 * MiB, t)
            large.append(t)
        except EppError as e:
            assert (e.status, e.code) == (503, "body_buffer_full")
            assert "--small-body-reserve-bytes" in e.message
    assert len(large) == 28 and b.held_large == 224 * MiB
    small = [b.ticket(f"10.0.2.{i}", f"s{i}", declared=4096) for i in range(100)]
    for t in small:
        b.take(4096, t)  # every ordinary request finds room
    assert b.held == 224 * MiB + 100 * 4096


def test_a_body_that_grows_past_small_moves_to_the_large_share():
    shares = BodyShares(
        per_connection=9 * MiB, per_source=9 * MiB, small_reserve=4 * MiB, small_body=MiB
    )
    b = BodyBudget(10 * MiB, shares)
    filler = b.ticket("x", "1", declared=6 * MiB)
    b.take(6 * MiB, filler)  # the large share is full
    sneaky = b.ticket("y", "2", declared=0)  # no content-length: small until it is not
    b.take(MiB, sneaky)
    with pytest.raises(EppError) as e:
        b.take(1, sneaky)  # now large: its bytes would move into a full large share
    assert e.value.status == 503
    assert (sneaky.large, b.held_large, b.held) == (False, 6 * MiB, 7 * MiB)
    b.release(filler)
    b.take(1, sneaky)
    assert (sneaky.large, b.held_large) == (True, MiB + 1)
    b.release(sneaky)
    assert (b.held, b.held_large) == (0, 0)


def test_a_reserve_as_large_as_the_budget_is_refused():
    with pytest.raises(ValueError, match="small_reserve"):
        BodyBudget(MiB, BodyShares(small_reserve=MiB))


def test_client_of_prefers_envoys_attributes_and_falls_back_to_the_last_xff_entry():
    msg = headers_msg(BASE_HEADERS)
    fields = msg.attributes[m.EXT_PROC_ATTRIBUTES].fields
    fields[m.SOURCE_ADDRESS_ATTR].string_value = "10.1.2.3:5555"
    fields[m.CONNECTION_ID_ATTR].number_value = 17
    assert m.client_of(msg, {"x-forwarded-for": "6.6.6.6"}) == ("10.1.2.3", "17")
    bare = headers_msg(BASE_HEADERS)
    assert m.client_of(bare, {"x-forwarded-for": "6.6.6.6, 10.9.9.9"}) == ("10.9.9.9", None)
    assert m.client_of(bare, {"x-forwarded-for": "[2001:db8::1]:80"})[0] == "2001:db8::1"
    assert m.client_of(bare, {}) == (None, None)


def test_a_stream_charges_its_client_and_gives_everything_back():
    director, _ = make_director()
    b = BodyBudget(1000, BodyShares(per_source=500, small_reserve=0))

    def stream(addr: str) -> RequestStream:
        s = RequestStream(director, 1 << 20, budget=b)
        h = headers_msg(BASE_HEADERS)
        h.attributes[m.EXT_PROC_ATTRIBUTES].fields[m.SOURCE_ADDRESS_ATTR].string_value = addr
        s.handle(h)
        return s

    a1, a2, other = stream("1.1.1.1:1"), stream("1.1.1.1:2"), stream("2.2.2.2:1")
    assert a1.handle(body_msg(b" " * 400, False)) == []
    (resp,) = a2.handle(body_msg(b" " * 200, False))
    assert resp.immediate_response.status.code == 429
    assert json.loads(resp.immediate_response.body)["error"]["code"] == "client_body_buffer_full"
    assert other.handle(body_msg(b" " * 200, False)) == []
    for s in (a1, a2, other):
        s.close()
    assert (b.held, b.by_source) == (0, {})


def rate_servicer(min_rate: float, grace: float, body_timeout: float = 600.0):
    ds, director, *_ = setup()
    shares = BodyShares(min_rate=min_rate, rate_grace=grace)
    return ExtProcServicer(director, StreamLimits(body_timeout=body_timeout, shares=shares)), ds


async def test_a_body_slower_than_the_minimum_rate_gets_408_long_before_the_body_timeout():
    async def trickle():
        yield headers_msg(BASE_HEADERS)
        for _ in range(10_000):  # 1 byte every 10 ms: ~100 B/s against 10 KB/s
            yield body_msg(b" ", False)
            await asyncio.sleep(0.01)

    svc, ds = rate_servicer(min_rate=10_000, grace=0.05)
    loop = asyncio.get_running_loop()
    start = loop.time()
    out = [r async for r in svc.Process(trickle(), context=None)]
    assert loop.time() - start < 600  # the body timeout did not answer
    (resp,) = out
    assert resp.immediate_response.status.code == 408
    err = json.loads(resp.immediate_response.body)["error"]
    assert err["code"] == "request_body_too_slow" and "--min-body-rate" in err["message"]
    assert svc.budget.held == 0 and ds.inflight("e0") == (0, 0)


async def test_a_body_faster_than_the_minimum_rate_is_routed_even_past_the_grace():
    async def steady():
        yield headers_msg(BASE_HEADERS)
        body = b'{"model": "m", "prompt": "' + b"x" * 3000 + b'"}'
        for i in range(0, len(body), 1000):
            await asyncio.sleep(0.02)  # 1000 B per 20 ms: ~50 KB/s against 1 KB/s
            yield body_msg(body[i : i + 1000], i + 1000 >= len(body))

    svc, _ = rate_servicer(min_rate=1_000, grace=0.1)
    out = [r async for r in svc.Process(steady(), context=None)]
    assert out[0].WhichOneof("response") == "request_headers"


async def test_freed_large_bodies_are_trimmed_and_a_trim_due_soon_is_deferred_not_dropped():
    from epp.memtrim import Trimmer

    t = Trimmer(min_freed=100, min_interval=0.05)
    t.freed_bytes(150)
    assert t.trims == 1  # enough freed, none for a while: at once
    t.freed_bytes(150)
    assert t.trims == 1  # too soon: deferred to the end of the interval
    for _ in range(200):
        if t.trims == 2:
            break
        await asyncio.sleep(0.01)
    assert t.trims == 2 and t.freed == 0
