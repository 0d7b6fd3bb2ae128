"""Data-parallel ranks end to end: two simulators each run 4 data-parallel ranks behind
one port (`epp sim --data-parallel-size 4`, vLLM's `--data-parallel-size` with one API
server), with rank-labelled metrics and KV events carrying their rank; `epp serve`
picks the endpoint, then `data-parallel-rank-picker` picks the rank and names it in
`x-data-parallel-rank`, through a real Envoy. Distinct prompts spread over every rank;
a repeated prompt stays on its rank (where its KV blocks are)."""

from __future__ import annotations

import asyncio
import collections
import json
from pathlib import Path

import aiohttp

from epp.harness.localstack import LocalStack
from epp.harness.procs import free_port
from epp.headers import DATA_PARALLEL_RANK, SIM_DP_RANK, SIM_SERVER
from tests.e2e.client import sim_prefix
from tests.e2e.conftest import SIM_ARGS
from tests.e2e.test_prefix_routing import TIMEOUT, question, system_prompt, wait_pool_ready

RANKS = 4


def dp_config(path: Path, zmq_endpoint: str) -> Path:
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
    blockSizeTokens: 16
- type: precise-prefix-cache-scorer
- type: queue-scorer
- type: max-score-picker
- type: data-parallel-rank-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: precise-prefix-cache-scorer
    weight: 2
  - pluginRef: queue-scorer
    weight: 1
  - pluginRef: max-score-picker
"""
    )
    return path


async def post(
    http: aiohttp.ClientSession, url: str, prompt: str, max_tokens: int = 2, **headers: str
) -> tuple[str, str]:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens}
    async with http.post(url + "/v1/completions", json=body, headers=headers) as r:
        text = await r.text()
        assert r.status == 200, text[:300]
        rank = r.headers.get(SIM_DP_RANK)
        assert rank is not None, "the simulator did not run with data-parallel ranks"
        return sim_prefix(r.headers.get(SIM_SERVER)) or "", rank


async def test_ranks_share_the_load_and_a_repeated_prompt_keeps_its_rank(tmp_path):
    zmq_endpoint = f"tcp://127.0.0.1:{free_port()}"
    events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": zmq_endpoint}
    sim_args = [*SIM_ARGS, "--data-parallel-size", str(RANKS)]
    sim_args += ["--kv-events-config", json.dumps(events)]
    config = dp_config(tmp_path / "dp.yaml", zmq_endpoint)
    with LocalStack(n_sims=2, sim_args=sim_args, epp_args=["--config", str(config)]) as st:
        async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
            await wait_pool_ready(http, st)

            # a client cannot pin a rank itself: the EPP strips the header it did not set
            # (it sets its own), so 8 requests asking for rank 3 do not all land there
            pinned = [
                await post(
                    http, st.url, system_prompt(f"pin-{i}", 300), **{DATA_PARALLEL_RANK: "3"}
                )
                for i in range(8)
            ]
            assert {rank for _, rank in pinned} != {"3"}

            # distinct prompts at once: every rank of every server takes a share
            spread = await asyncio.gather(
                *(post(http, st.url, system_prompt(f"spread-{i}", 400), 40) for i in range(32))
            )
            per_rank = collections.Counter(spread)
            per_server = collections.Counter(server for server, _ in spread)
            for server, n in per_server.items():
                ranks = {rank: c for (s, rank), c in per_rank.items() if s == server}
                assert len(ranks) == min(RANKS, n), (server, ranks)
                assert max(ranks.values()) <= -(-n // RANKS) + 1, (server, ranks)

            # repeats: each prompt keeps its (server, rank); the prompts use several
            prompts = [system_prompt(f"sticky-{k}", 600) for k in range(6)]
            homes: dict[int, set[tuple[str, str]]] = collections.defaultdict(set)
            for i in range(5):
                for k, prompt in enumerate(prompts):
                    homes[k].add(await post(http, st.url, prompt + question(i)))
            assert all(len(h) == 1 for h in homes.values()), homes
            assert len({h for hs in homes.values() for h in hs}) >= 3, homes
