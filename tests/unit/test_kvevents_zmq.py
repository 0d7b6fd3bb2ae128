"""Real ZMQ: a PUB socket in the test sends vLLM-format KV events to the precise
producer's subscriber, in bind and connect mode; then the scorer picks the right endpoint.

ZMQ drops what a PUB sends before the subscription reaches it ("slow joiner"), so the
test re-sends its message (with the next sequence number, as vLLM would) until the
index shows it, instead of sleeping a guessed time.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import pytest
import zmq

from epp.config.params import parse_params
from epp.datastore import Endpoint, EndpointMetrics, EndpointSnapshot
from epp.scheduling.registry import PLUGIN_TYPES, Handle
from epp.scheduling.types import CycleState
from epp.tokenizer import SimpleTokenizer
from tests.helpers import completion
from tests.unit.test_kvevents import message, stored_array, stored_map

PROMPT = "alpha beta gamma delta epsilon zeta eta theta"
IDS = SimpleTokenizer().encode(PROMPT)  # 8 tokens: two blocks of 4


class Pool:
    """A Handle's pool that the test can change, with its listeners."""

    def __init__(self, endpoints: list[Endpoint]) -> None:
        self.endpoints = endpoints
        self.listeners: list[Callable[[], None]] = []

    def subscribe(self, fn: Callable[[], None]) -> Callable[[], None]:
        self.listeners.append(fn)
        return lambda: self.listeners.remove(fn) if fn in self.listeners else None

    def set(self, endpoints: list[Endpoint]) -> None:
        self.endpoints = endpoints
        for fn in list(self.listeners):
            fn()


def build(pool: Pool, **params: object):
    spec = PLUGIN_TYPES.lookup("precise-prefix-cache-producer")
    assert spec is not None
    handle = Handle(
        rng=random.Random(0), pool=lambda: list(pool.endpoints), on_pool_change=pool.subscribe
    )
    return spec.build("precise", parse_params(spec.params, params), handle)


async def publish_until(pub: zmq.Socket, topic: str, events: list, done: Callable[[], bool]):
    seq = 0
    async with asyncio.timeout(5):
        while not done():
            pub.send_multipart(message(topic, seq, events))
            seq += 1
            await asyncio.sleep(0.01)


def snapshots(pool: Pool) -> list[EndpointSnapshot]:
    return [EndpointSnapshot(e, EndpointMetrics()) for e in pool.endpoints]


def score(prod, pool: Pool) -> dict[str, float]:
    from tests.helpers import plugin

    state = CycleState()
    snaps = snapshots(pool)
    state.write(prod.produces, prod.produce(state, completion(PROMPT, model="m"), snaps))
    scores = plugin("precise-prefix-cache-scorer").score(state, completion(), snaps)
    return {s.name: v for s, v in zip(snaps, scores, strict=True)}


def assert_all_closed(sub) -> None:
    assert sub.open_tasks() == 0
    assert sub.connections() == {}
    assert sub._ctx is None
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("kv-events:")]


@pytest.fixture
def zctx():
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


async def test_bind_mode_servers_connect_and_the_topic_names_the_endpoint(zctx):
    pool = Pool([Endpoint("a", "127.0.0.1", 8001), Endpoint("b", "127.0.0.1", 8002)])
    prod = build(pool, mode="bind", endpoint="tcp://127.0.0.1:*")
    await prod.start()
    sub = prod.subscriber
    try:
        assert sub.bound_endpoint.startswith("tcp://127.0.0.1:")
        pub = zctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.connect(sub.bound_endpoint)  # as vLLM does with a non-wildcard endpoint
        events = [stored_map([7, 8], None, IDS, 4)]
        await publish_until(pub, "kv@127.0.0.1:8002@m", events, lambda: prod.index.size("b"))
        assert score(prod, pool) == {"a": 0.0, "b": 1.0}
        # A positional message from the other server, sent once the socket is live.
        pub.send_multipart(message("kv@127.0.0.1:8001@m", 0, [stored_array([5], None, IDS[:4], 4)]))
        async with asyncio.timeout(5):
            while not prod.index.size("a"):
                await asyncio.sleep(0.005)
        assert score(prod, pool) == {"a": 0.5, "b": 1.0}
        assert sub.stats["sequence_gaps"] == 0
        pub.close(linger=0)
    finally:
        await prod.stop()
    assert prod.subscriber is None
    assert_all_closed(sub)
    assert pool.listeners == []


async def test_connect_mode_dials_each_endpoint_and_follows_the_pool(zctx):
    pubs = []
    ports = []
    for _ in range(2):
        pub = zctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        ports.append(pub.bind_to_random_port("tcp://127.0.0.1"))
        pubs.append(pub)
    label = "epp.kv-events-port"
    a = Endpoint("a", "127.0.0.1", 8001, {label: str(ports[0])})
    b = Endpoint("b", "127.0.0.1", 8002, {label: str(ports[1])})
    pool = Pool([a, b])
    prod = build(pool, mode="connect")
    await prod.start()
    sub = prod.subscriber
    try:
        assert sub.connections() == {
            "a": f"tcp://127.0.0.1:{ports[0]}",
            "b": f"tcp://127.0.0.1:{ports[1]}",
        }
        # The socket names the endpoint: a topic with another address still lands on "a".
        events = [stored_array([1, 2], None, IDS, 4)]
        await publish_until(pubs[0], "kv@10.9.9.9:1@m", events, lambda: prod.index.size("a"))
        assert score(prod, pool) == {"a": 1.0, "b": 0.0}
        pool.set([a])  # "b" leaves: its socket and task go
        await asyncio.sleep(0)
        assert list(sub.connections()) == ["a"]
        c = Endpoint("c", "127.0.0.1", 8003, {label: str(ports[1])})
        pool.set([a, c])  # a newcomer is dialled
        assert list(sub.connections()) == ["a", "c"]
        events = [stored_map([3], None, IDS[:4], 4)]
        await publish_until(pubs[1], "kv@x@m", events, lambda: prod.index.size("c"))
        assert score(prod, pool) == {"a": 1.0, "c": 0.5}
    finally:
        await prod.stop()
        for pub in pubs:
            pub.close(linger=0)
    assert_all_closed(sub)


async def test_bind_failure_fails_start_and_leaves_nothing_open(zctx):
    holder = zctx.socket(zmq.PUB)
    holder.setsockopt(zmq.LINGER, 0)
    port = holder.bind_to_random_port("tcp://127.0.0.1")
    pool = Pool([])
    prod = build(pool, mode="bind", endpoint=f"tcp://127.0.0.1:{port}")
    with pytest.raises(zmq.ZMQError):
        await prod.start()
    assert prod.subscriber is None
    assert pool.listeners == []
    holder.close(linger=0)
