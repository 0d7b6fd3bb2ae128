"""Two `epp serve` replicas behind one real Envoy (active-active): Envoy spreads the
requests over both, and the precise prefix index stays the same in both because each
subscribes to every simulator's KV events (`mode: connect`: each simulator binds its own
`tcp://*:PORT`, as vLLM does for an endpoint with `*`, and every EPP dials every one).

A prefix's first request lands on some server X; once BOTH replicas have applied its
BlockStored events (speculative indexing off: nothing else can make the prefix stick),
every follow-up goes to X, whichever replica Envoy hands it to, and both replicas
handled some of them.

Speculative entries shared (`speculativeSyncBind` / `speculativeSyncPeers`,
plugins/prefix/spec_sync.py): with no KV events at all, only speculative entries can make a
prefix stick; a group's first request lands on X through one replica, and a concurrent burst
of its follow-ups through BOTH replicas lands on X only if the other replica learned X
from its peer."""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from pathlib import Path

import aiohttp
import pytest

from epp.harness.localstack import start_epps_behind_envoy
from epp.harness.procs import HttpReady, ProcessGroup, free_port, free_port_range
from tests.e2e.conftest import SIM_ARGS
from tests.e2e.test_prefix_routing import (
    BLOCK_SIZE,
    TIMEOUT,
    metric_sum,
    post_ok,
    question,
    system_prompt,
)
from tests.eventually import eventually

pytestmark = pytest.mark.e2e

CONFIG = f"""\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: precise-prefix-cache-producer
  parameters:
    mode: connect               # dial every server's publisher (its epp.kv-events-port label)
    tokenizer: simple
    blockSizeTokens: {BLOCK_SIZE}
    speculativeIndexing: false  # only KV events can make a prefix stick
- type: precise-prefix-cache-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: precise-prefix-cache-scorer
  - pluginRef: max-score-picker
"""


def start_sims(pg: ProcessGroup, n: int) -> tuple[list[str], list[str]]:
    """`n` simulators, each publishing KV events on its own bound port; their URLs and the
    EPP's --endpoint flags (with the publisher port as a label)."""
    urls, flags = [], []
    for i in range(n):
        port, kv_port = free_port(), free_port()
        kv = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{kv_port}"}
        argv = ["-m", "epp.cli", "sim", "--port", str(port), "--name-prefix", f"sim-{i}"]
        argv += [*SIM_ARGS, "--block-size", str(BLOCK_SIZE), "--kv-events-config", json.dumps(kv)]
        url = f"http://127.0.0.1:{port}"
        pg.start(f"sim-{i}", [sys.executable, *argv], ready=HttpReady(url + "/health"), timeout=60)
        urls.append(url)
        flags.append(f"--endpoint=sim-{i}=127.0.0.1:{port};epp.kv-events-port={kv_port}")
    return urls, flags


async def test_two_replicas_share_the_precise_prefix_index(tmp_path: Path):
    config = tmp_path / "precise-connect.yaml"
    config.write_text(CONFIG)
    with ProcessGroup(tmp_path / "run") as pg:
        _, flags = start_sims(pg, 3)
        envoy, metrics = start_epps_behind_envoy(pg, [*flags, "--config", str(config)], n_epps=2)
        epps = [f"http://127.0.0.1:{m}" for m in metrics]
        async with aiohttp.ClientSession(timeout=TIMEOUT) as http:

            async def stored(epp: str) -> float:
                return await metric_sum(http, epp, "epp_kv_events_total", 'type="BlockStored"')

            async def attempts(epp: str) -> float:
                return await metric_sum(http, epp, "inference_extension_scheduler_attempts_total")

            async def pool_ready() -> bool:
                for epp in epps:
                    async with http.get(epp + "/debug/endpoints") as r:
                        rows = await r.json()
                    if len(rows) != 3 or not all(row["healthy"] for row in rows):
                        return False
                return True

            await eventually(pool_ready, "both EPPs to see the three simulators healthy", 30)
            prefix = system_prompt("replicas")
            before = [await stored(e) for e in epps]
            first = await post_ok(http, envoy.url, prefix + question(0))

            async def both_indexed() -> bool:
                return all([await stored(e) > b for e, b in zip(epps, before, strict=True)])

            await eventually(both_indexed, "BlockStored events to reach BOTH replicas", 15)
            handled0 = [await attempts(e) for e in epps]
            follow = [await post_ok(http, envoy.url, prefix + question(i)) for i in range(1, 11)]
            handled = [await attempts(e) - h for e, h in zip(epps, handled0, strict=True)]

    where = Counter(r.server for r in follow)
    assert where == Counter({first.server: 10}), where  # same index in both replicas
    assert sum(handled) == 10 and min(handled) >= 1, handled  # both replicas routed some


SYNC_CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: precise-prefix-cache-producer
  parameters:
    mode: bind
    endpoint: tcp://127.0.0.1:*   # no server publishes: no KV events in this test
    tokenizer: simple
    blockSizeTokens: {block}
    speculativeIndexing: true
    speculativeTTL: 120s          # outlives the test: only the peers' sharing is tested
    speculativeSyncBind: tcp://127.0.0.1:{bind}
    speculativeSyncPeers: [{peers}]
- type: precise-prefix-cache-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: precise-prefix-cache-scorer
  - pluginRef: max-score-picker
"""


async def test_two_replicas_share_speculative_entries(tmp_path: Path):
    n_sims, groups, burst = 4, 3, 8
    sync_ports = [free_port(), free_port()]
    peers = ", ".join(f'"tcp://127.0.0.1:{p}"' for p in sync_ports)  # each lists itself too
    configs = []
    for i, port in enumerate(sync_ports):
        configs.append(tmp_path / f"sync-{i}.yaml")
        configs[-1].write_text(SYNC_CONFIG.format(block=BLOCK_SIZE, bind=port, peers=peers))
    with ProcessGroup(tmp_path / "run") as pg:
        base = free_port_range(n_sims)
        argv = [sys.executable, "-m", "epp.cli", "sim", "--replicas", str(n_sims)]
        argv += ["--port", str(base), "--name-prefix", "sim", *SIM_ARGS]
        argv += ["--block-size", str(BLOCK_SIZE)]
        last = f"http://127.0.0.1:{base + n_sims - 1}/health"
        pg.start("sims", argv, ready=HttpReady(last), timeout=60)
        flags = [f"--endpoint=sim-{i}=127.0.0.1:{base + i}" for i in range(n_sims)]
        envoy, metrics = start_epps_behind_envoy(
            pg, flags, n_epps=2, per_epp_args=[["--config", str(c)] for c in configs]
        )
        epps = [f"http://127.0.0.1:{m}" for m in metrics]
        async with aiohttp.ClientSession(timeout=TIMEOUT) as http:

            async def applied() -> float:
                """The fewest entries either replica has applied from its peer."""
                name = "epp_prefix_spec_sync_messages_total"
                return min([await metric_sum(http, e, name, 'outcome="applied"') for e in epps])

            async def attempts(epp: str) -> float:
                return await metric_sum(http, epp, "inference_extension_scheduler_attempts_total")

            async def pool_ready() -> bool:
                for epp in epps:
                    async with http.get(epp + "/debug/endpoints") as r:
                        rows = await r.json()
                    if len(rows) != n_sims or not all(row["healthy"] for row in rows):
                        return False
                return True

            await eventually(pool_ready, "both EPPs to see the simulators healthy", 30)

            # A replica's SUB connects asynchronously: the first entries could be published
            # before the peer is connected (PUB drops them). Warm both directions with
            # requests of an unrelated prefix (Envoy alternates the replicas) until each
            # replica has applied one entry from the other.
            async def channel_up() -> bool:
                await post_ok(http, envoy.url, system_prompt("warm-up") + question(0))
                return await applied() >= 1

            await eventually(channel_up, "each replica to apply its peer's speculative entry", 30)
            handled0 = [await attempts(e) for e in epps]
            placed: dict[str, Counter] = {}
            for g in range(groups):
                prefix = system_prompt(f"sync-{g}")
                first = await post_ok(http, envoy.url, prefix + question(0))
                follow = await asyncio.gather(
                    *(post_ok(http, envoy.url, prefix + question(i)) for i in range(1, burst + 1))
                )
                placed[first.server] = placed.get(first.server, Counter())
                placed[first.server].update(r.server for r in follow)
            handled = [await attempts(e) - h for e, h in zip(epps, handled0, strict=True)]

    # Every burst lands on its group's first server: the replica that did not route the
    # first request can only know it from its peer (no KV events; otherwise it would draw
    # one of 4 servers for the group, and all 3 groups right by chance is (1/4)^3 = 1.6 %).
    for server, where in placed.items():
        assert set(where) == {server}, placed
    # Both replicas routed part of the 3 x (1 + 8) = 27 requests (Envoy round-robins).
    assert sum(handled) == groups * (1 + burst) and min(handled) >= 1, handled
