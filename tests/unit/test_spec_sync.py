"""Speculative prefix entries shared between EPP replicas (plugins/prefix/spec_sync.py):
two real precise producers, each with its own PUB socket on loopback and a SUB dialing
both, as two `epp serve` replicas would; plus the codec and the config's checks.

ZMQ drops what a PUB sends before a SUB's connection is up ("slow joiner"): the tests
route a warm-up request until the peer has applied one, instead of sleeping a guessed time.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from epp.config.errors import ConfigError
from epp.config.loader import load_config_text
from epp.config.params import parse_params
from epp.harness.procs import free_port
from epp.scheduling.registry import PLUGIN_TYPES, Handle
from plugins.prefix import spec_sync
from tests.eventually import eventually
from tests.helpers import completion
from tests.unit.test_prefix_precise import EPS, POOL, PROMPT, Clock, match, pick, scores


def sync_producer(bind_port: int, peers: list[int], clock: Clock, **extra: object):
    spec = PLUGIN_TYPES.lookup("precise-prefix-cache-producer")
    assert spec is not None
    params = {
        "endpoint": "tcp://127.0.0.1:*",  # KV events: nobody publishes here
        "blockSizeTokens": 4,
        "speculativeSyncBind": f"tcp://127.0.0.1:{bind_port}",
        "speculativeSyncPeers": [f"tcp://127.0.0.1:{p}" for p in peers],
        **extra,
    }
    handle = Handle(rng=random.Random(0), clock=clock, pool=lambda: list(POOL))
    return spec.build("precise", parse_params(spec.params, params), handle)


async def test_a_peer_applies_what_the_other_replica_routed_and_drops_its_own():
    clock = Clock()
    ports = [free_port(), free_port()]
    a = sync_producer(ports[0], ports, clock)  # each lists itself, as a headless Service does
    b = sync_producer(ports[1], ports, clock)
    await a.start()
    await b.start()
    try:
        assert a.sync.connections() == {f"tcp://127.0.0.1:{p}" for p in ports}
        warm = completion("warm up " * 8, model="m")

        def b_applied() -> bool:
            return b.sync.stats["applied"] >= 1

        async with asyncio.timeout(10):
            while not b_applied():
                pick(a, warm, {"default": [EPS[2]]})
                await asyncio.sleep(0.02)
        applied0, own0 = b.sync.stats["applied"], a.sync.stats["own"]
        assert own0 >= 1  # A heard its own messages (it lists itself) and dropped them

        # A routes the prompt to "b": A scores it at once; B does once the message lands.
        pick(a, completion(PROMPT, model="m"), {"default": [EPS[1]]})
        assert scores(match(a)) == [0.0, 1.0, 0.0]
        await eventually(lambda: b.sync.stats["applied"] > applied0, "B to apply A's entry")
        assert scores(match(b)) == [0.0, 1.0, 0.0]
        assert b.sync.stats["dropped"] == 0
        # The entry lives the sender's TTL (2 s default) on B's clock: gone after it.
        clock.now += 2.1
        assert scores(match(b)) == [0.0, 0.0, 0.0]
    finally:
        await a.stop()
        await b.stop()
    assert a.sync is None and b.sync is None
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("spec-sync:")]


def test_entries_for_endpoints_not_in_this_replicas_pool_are_skipped():
    clock = Clock()
    prod = sync_producer(free_port(), [free_port()], clock)  # never started: no sockets
    prod.prune()  # the pool as the Handle gives it: a, b, c
    prod._on_peer_entry("elsewhere", [1, 2, 3], 2.0)
    prod._on_peer_entry("a", [1, 2, 3], 2.0)
    assert prod.index.endpoints == ["a"]


def test_codec_round_trips_and_refuses_garbage():
    hashes = [0, 1, 2**64 - 1, 12345678901234567890]
    payload = spec_sync.encode(b"s" * 16, "pod-1", hashes, 2.0)
    assert spec_sync.decode(payload) == (b"s" * 16, "pod-1", hashes, 2.0)
    sync = spec_sync.SpecSync("tcp://127.0.0.1:1", ["tcp://127.0.0.1:1"], lambda *a: None)
    bad = [
        [b"spec", b"\xc1"],  # not msgpack
        [b"spec", spec_sync.msgpack.packb([2, b"s", "e", 1.0, b""])],  # another version
        [b"spec", spec_sync.msgpack.packb([1, b"s", "e", 1.0, b"123"])],  # not uint64s
        [b"spec", spec_sync.msgpack.packb([1, b"s", "e", -1.0, b""])],  # ttl out of range
        [b"other", payload],
    ]
    assert [sync.handle_frames(f) for f in bad] == [False] * 5
    assert sync.stats["dropped"] == 5
    assert sync.handle_frames([b"spec", payload]) is True
    assert sync.handle_frames([b"spec", spec_sync.encode(sync.sender, "a", [1], 1.0)]) is False
    assert (sync.stats["applied"], sync.stats["own"]) == (1, 1)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ("{speculativeSyncBind: 'tcp://*:5558'}", "go together"),
        ("{speculativeSyncPeers: ['tcp://epp:5558']}", "go together"),
        (
            "{speculativeSyncBind: 'tcp://*:5558', speculativeSyncPeers: ['epp:5558']}",
            r"speculativeSyncPeers: 'epp:5558' is not tcp://HOST:PORT",
        ),
        (
            "{speculativeSyncBind: '*:5558', speculativeSyncPeers: ['tcp://epp:5558']}",
            r"speculativeSyncBind: '\*:5558' is not tcp://ADDRESS:PORT",
        ),
        (
            "{speculativeSyncBind: 'tcp://*:5558', speculativeSyncPeers: ['tcp://e:1'], "
            "speculativeIndexing: false}",
            "needs speculativeIndexing: true",
        ),
    ],
)
def test_config_errors_name_the_parameter_and_the_fix(params: str, message: str):
    with pytest.raises(ConfigError, match=message):
        load_config_text(
            f"plugins:\n- type: precise-prefix-cache-producer\n  parameters: {params}\n"
        )


def test_a_headless_service_name_is_accepted():
    cfg = load_config_text(
        "plugins:\n- type: precise-prefix-cache-producer\n  parameters:\n"
        "    speculativeSyncBind: tcp://*:5558\n"
        '    speculativeSyncPeers: ["tcp://epp-sync.default.svc.cluster.local:5558"]\n'
    )
    (prod,) = cfg.scheduler.producers
    assert prod.params.speculative_sync_peers == ["tcp://epp-sync.default.svc.cluster.local:5558"]
