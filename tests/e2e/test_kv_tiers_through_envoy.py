"""KV-cache tiers end to end: simulators with a CPU offload tier publish vLLM-shaped KV
events (a GPU eviction is a `BlockStored` with medium CPU and no tokens, then a
`BlockRemoved` on GPU), `epp serve` with the precise prefix producer weighs each cached
block by its tier (`kvCacheBackendConfigs`, llm-d-router's defaults gpu 1.0, cpu 0.8),
and requests go through a real Envoy: a prefix on one server's GPU beats the same prefix
on another's CPU tier, and a CPU-tier hit still beats no hit."""

from __future__ import annotations

import json
import time
from pathlib import Path

import aiohttp

from epp.harness.localstack import LocalStack
from epp.harness.procs import free_port
from tests.e2e.client import sim_prefix
from tests.e2e.conftest import SIM_ARGS
from tests.e2e.test_prefix_routing import (
    TIMEOUT,
    metric_sum,
    post_ok,
    question,
    system_prompt,
    wait_pool_ready,
)
from tests.eventually import eventually

BLOCK = 16
GPU_BLOCKS = 64  # small, so a few other prompts push a prefix off the GPU


def tiers_config(path: Path, zmq_endpoint: str) -> Path:
    path.write_text(
        f"""\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: precise-prefix-cache-producer
  parameters:
    mode: bind
    endpoint: {zmq_endpoint}
    tokenizer: simple
    blockSizeTokens: {BLOCK}
    speculativeIndexing: false   # only KV events place a prefix
    kvCacheBackendConfigs:
    - {{name: gpu, weight: 1.0}}
    - {{name: cpu, weight: 0.8}}
- type: precise-prefix-cache-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: precise-prefix-cache-scorer
    weight: 1
  - pluginRef: max-score-picker
"""
    )
    return path


async def test_a_gpu_hit_beats_a_cpu_tier_hit_which_beats_none(tmp_path):
    zmq_endpoint = f"tcp://127.0.0.1:{free_port()}"
    events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": zmq_endpoint}
    sim_args = [*SIM_ARGS, "--block-size", str(BLOCK), "--num-gpu-blocks", str(GPU_BLOCKS)]
    sim_args += ["--kv-offload-blocks", "1024", "--kv-events-config", json.dumps(events)]
    config = tiers_config(tmp_path / "tiers.yaml", zmq_endpoint)
    with LocalStack(n_sims=3, sim_args=sim_args, epp_args=["--config", str(config)]) as st:
        async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
            await wait_pool_ready(http, st)
            epp = st.epp_metrics_url

            async def count(kind: str) -> float:
                return await metric_sum(http, epp, "epp_kv_events_total", f'type="{kind}"')

            async def settled(before: float, kind: str) -> None:
                async def more() -> bool:
                    return await count(kind) > before

                await eventually(more, f"{kind} events to reach the EPP", 15)

            # every simulator's event link live first (ZMQ's slow joiner drops early events)
            for sim in st.sims:
                deadline = time.monotonic() + 20
                for attempt in range(100):
                    before = await count("BlockStored")
                    await post_ok(http, sim.url, system_prompt(f"link-{sim.name}-{attempt}", 300))
                    try:
                        await settled(before, "BlockStored")
                        break
                    except AssertionError:
                        assert time.monotonic() < deadline, f"no KV events from {sim.name}"

            cold, warm, other = st.sims
            shared = system_prompt("tiers-shared", 600)  # ~10 blocks
            only_cpu = system_prompt("tiers-only-cpu", 600)
            # `cold` computes both prefixes, then other prompts push them off its GPU:
            # they move to its CPU tier (BlockStored medium CPU, BlockRemoved GPU)
            await post_ok(http, cold.url, shared + question(0))
            await post_ok(http, cold.url, only_cpu + question(0))
            removed = await count("BlockRemoved")
            for i in range(12):
                await post_ok(http, cold.url, system_prompt(f"tiers-filler-{i}", 600))
            await settled(removed, "BlockRemoved")
            # `warm` computes the shared prefix on its GPU
            stored = await count("BlockStored")
            await post_ok(http, warm.url, shared + question(0))
            await settled(stored, "BlockStored")
            del other

            # through Envoy: the GPU copy wins over the CPU-tier copy ...
            to_shared = [await post_ok(http, st.url, shared + question(i)) for i in range(1, 6)]
            assert {sim_prefix(r.server) for r in to_shared} == {warm.name}
            # ... and a prefix held only on a CPU tier still draws its requests there
            to_cpu = [await post_ok(http, st.url, only_cpu + question(i)) for i in range(1, 6)]
            assert {sim_prefix(r.server) for r in to_cpu} == {cold.name}
