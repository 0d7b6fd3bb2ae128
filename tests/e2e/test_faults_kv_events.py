"""KV-event storms, out-of-order and malformed events under load (issue 13 §3), with the
precise prefix config: 3 simulators publish their real KV events to the socket the EPP
binds, Envoy in front, 4 clients sending requests throughout; a rogue publisher connects
to the same socket and sends a storm of valid events for one server (random sequence
numbers, so out of order; stores, removals of unknown blocks, orphans, a cache clear)
mixed with every kind of garbage the decoder knows.

What must hold: no request is lost (events touch no request); each kind of garbage is
counted under its reason; the jumps in sequence numbers are counted; the index stays
within `maxBlocksPerEndpoint` per server whatever the storm sends; and afterwards a new
shared prefix still sticks to the server whose events report it.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import urllib.request
from collections import Counter
from pathlib import Path

import aiohttp
import msgpack
import pytest
import zmq

from epp.harness.localstack import LocalStack
from epp.harness.procs import free_port
from epp.headers import SIM_SERVER
from tests.e2e.client import Recorder, describe, sim_prefix
from tests.e2e.conftest import SIM_ARGS
from tests.eventually import eventually

pytestmark = pytest.mark.e2e

BLOCK = 16
CAP = 500  # maxBlocksPerEndpoint
STORM_MESSAGES = 2_000  # valid ones, 4 blocks each: 8,000 blocks for one server (16 x CAP)
GARBAGE_EVERY = 200  # the garbage set goes out every 200 valid messages
BODY = {"model": "tiny", "prompt": "Say something short.", "max_tokens": 4}


def config(path: Path, zmq_endpoint: str) -> Path:
    path.write_text(
        f"""\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: precise-prefix-cache-producer
  parameters:
    mode: bind
    endpoint: {zmq_endpoint}
    blockSizeTokens: {BLOCK}
    maxBlocksPerEndpoint: {CAP}
    speculativeIndexing: false   # only KV events can make a prefix stick
- type: precise-prefix-cache-scorer
- type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: precise-prefix-cache-scorer
    weight: 3
  - pluginRef: queue-scorer
    weight: 1
  - pluginRef: max-score-picker
"""
    )
    return path


def metrics(st: LocalStack) -> str:
    with urllib.request.urlopen(st.epp_metrics_url + "/metrics", timeout=10) as r:
        return r.read().decode()


def series(text: str, name: str) -> dict[str, float]:
    """label set (as written) → value, for every sample of `name`."""
    pattern = rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$"
    return {m[1] or "": float(m[2]) for m in re.finditer(pattern, text, re.MULTILINE)}


def dropped(text: str) -> Counter:
    return Counter(
        {
            re.search(r'reason="([^"]+)"', k)[1]: int(v)  # type: ignore[index]
            for k, v in series(text, "epp_kv_events_dropped_total").items()
        }
    )


def stored_block(rng: random.Random, parent: int | None = None, n: int = 4) -> dict:
    return {
        "type": "BlockStored",
        "block_hashes": [rng.getrandbits(63) for _ in range(n)],
        "parent_block_hash": parent,
        "token_ids": [rng.randrange(1, 30_000) for _ in range(BLOCK * n)],
        "block_size": BLOCK,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    }


def batch(events: list) -> bytes:
    return msgpack.packb([1.0, events, 0], use_bin_type=True)


def seq(n: int) -> bytes:
    return n.to_bytes(8, "big")


def garbage(topic: bytes) -> list[tuple[str, list[bytes]]]:
    """(the reason the EPP must count it under, frames) for each kind of bad message."""
    return [
        ("bad_frames", [topic, seq(1)]),
        ("bad_seq", [topic, b"\x01" * 7, batch([])]),
        ("bad_msgpack", [topic, seq(2), b"\xc1\xc1 not msgpack"]),
        ("bad_batch", [topic, seq(3), msgpack.packb("just a string")]),
        ("bad_topic", [b"kv@", seq(4), batch([])]),
        ("bad_topic", [b"kv@\xff\xfe", seq(5), batch([])]),
        ("unknown_endpoint", [b"kv@10.9.9.9:1@tiny", seq(6), batch([])]),
        ("unknown_event", [topic, seq(7), batch([{"type": "BlockMoved"}])]),
        ("bad_event", [topic, seq(8), batch([{"type": "BlockStored"}])]),
        ("bad_event", [topic, seq(8), batch([42])]),
        ("orphan_block", [topic, seq(9), batch([stored_block(random.Random(9), parent=123)])]),
    ]


def storm(endpoint: str, topic: bytes, rng: random.Random) -> int:
    """Send the storm from a PUB socket (in a thread); returns messages sent."""
    sock = zmq.Context.instance().socket(zmq.PUB)
    sock.setsockopt(zmq.SNDHWM, 0)  # keep everything: the EPP's receive side is tested
    sock.setsockopt(zmq.LINGER, 2000)
    sock.connect(endpoint)
    try:
        sent = 0
        for i in range(STORM_MESSAGES):
            if i == STORM_MESSAGES // 2:
                events = [{"type": "AllBlocksCleared"}]
            elif i % 10 == 0:  # removals of blocks nobody stored
                events = [{"type": "BlockRemoved", "block_hashes": [rng.getrandbits(63)]}]
            else:
                events = [stored_block(rng)]
            sock.send_multipart([topic, seq(rng.getrandbits(40)), batch(events)])
            sent += 1
            if i % GARBAGE_EVERY == 0:
                for _, frames in garbage(topic):
                    sock.send_multipart(frames)
                    sent += 1
        return sent
    finally:
        sock.close()


async def test_a_kv_event_storm_with_garbage_loses_no_request_and_stays_bounded(tmp_path):
    zmq_endpoint = f"tcp://127.0.0.1:{free_port()}"
    kv = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": zmq_endpoint}
    sim_args = [*SIM_ARGS, "--block-size", str(BLOCK), "--kv-events-config", json.dumps(kv)]
    cfg = config(tmp_path / "precise.yaml", zmq_endpoint)
    with LocalStack(n_sims=3, sim_args=sim_args, epp_args=["--config", str(cfg)]) as st:
        victim = st.sims[0]
        topic = f"kv@{victim.hostport}@tiny".encode()
        # The rogue's socket joins late (ZMQ's slow joiner): garbage until one is counted.
        probe = zmq.Context.instance().socket(zmq.PUB)
        probe.connect(zmq_endpoint)
        try:

            def probe_counted() -> bool:
                probe.send_multipart([topic, seq(0)])
                return dropped(metrics(st))["bad_frames"] > 0

            await eventually(
                probe_counted, "the EPP to count a rogue message", blocking=True, interval=0.1
            )
        finally:
            probe.close(linger=0)
        before = dropped(metrics(st))
        gaps_before = sum(series(metrics(st), "epp_kv_events_sequence_gaps_total").values())

        loop = asyncio.get_running_loop()
        load = Recorder(st.url, 4, BODY)
        await load.wait_ok(4)
        t_storm = loop.time()
        sent = await asyncio.to_thread(storm, zmq_endpoint, topic, random.Random(7))
        # wait for the EPP to work through what it received: its count stops moving
        last = -1.0
        for _ in range(100):
            now = sum(series(metrics(st), "epp_kv_events_total").values())
            if now == last:
                break
            last = now
            await asyncio.sleep(0.3)
        await load.wait_ok(4, after=loop.time())
        outcomes = await load.finish()
        text = metrics(st)
        index_size = series(text, "inference_extension_prefix_indexer_size")[""]
        gaps = sum(series(text, "epp_kv_events_sequence_gaps_total").values()) - gaps_before
        counted = dropped(text) - before

        # Afterwards a new shared prefix still sticks where its events say it is.
        prefix = "Storm survivor system prompt. " + " ".join(f"w{i}" for i in range(300))

        def events() -> float:
            return sum(series(metrics(st), "epp_kv_events_total").values())

        seen = events()
        first = await served_by(st.url, prefix + " q0")
        await eventually(
            lambda: events() > seen, "its BlockStored events to reach the EPP", blocking=True
        )
        follow = [await served_by(st.url, prefix + f" q{i}") for i in range(1, 9)]

    failed = [o for o in outcomes if not o.ok]
    assert failed == [], describe(failed)
    during = [o for o in outcomes if o.start > t_storm]
    assert during
    rounds = STORM_MESSAGES // GARBAGE_EVERY
    expected = Counter(reason for reason, _ in garbage(topic))
    for reason, n in expected.items():
        assert counted[reason] >= 1, (reason, counted)
        assert counted[reason] <= n * rounds, (reason, counted)
    assert gaps > 0  # random sequence numbers: the jumps are seen
    assert index_size <= 3 * CAP  # 8,000 stored blocks for one server, kept to CAP
    assert Counter(follow)[first] >= 7, (first, follow)
    print(
        f"\nKV storm: {sent} messages sent; {len(outcomes)} requests ({len(during)} during the "
        f"storm), 0 failed; dropped {dict(counted)}; {gaps:.0f} sequence gaps; index "
        f"{index_size:.0f} entries (cap {CAP} x 3); follow-ups on the prefix's server: "
        f"{Counter(follow)[first]}/8"
    )


async def served_by(url: str, prompt: str) -> str | None:
    """POST one completion; the endpoint that served it."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 2}
    async with aiohttp.ClientSession() as http, http.post(url + "/v1/completions", json=body) as r:
        assert r.status == 200
        return sim_prefix(r.headers.get(SIM_SERVER))
