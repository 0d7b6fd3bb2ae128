"""config/prefix-aware.yaml end to end: a burst with one shared prefix is spread, not piled.

The weighted blend (config/prefix-weighted.yaml) sent such a burst to whichever server got
the prefix first until its scraped queue grew (llm-d issue #355). "Sticky until saturated"
gates stickiness on the load the EPP itself counts, so 200 simultaneous requests over 4
idle simulators land evenly. Real Envoy, `epp serve` and `epp sim` processes.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import aiohttp
import pytest

from epp.harness.localstack import LocalStack
from tests.e2e.client import burst, sim_prefix
from tests.e2e.test_prefix_routing import system_prompt, wait_pool_ready

pytestmark = pytest.mark.e2e

CONFIG = Path(__file__).resolve().parents[2] / "config" / "prefix-aware.yaml"
# Slow enough that the burst is all in flight together (8 ms per output token × 32 tokens,
# 4 sequences at a time per server: a server clears 4 requests per ~0.26 s).
SIM_ARGS = ["--max-num-seqs", "4", "--decode-ms-per-token", "8"]


async def test_burst_of_200_with_one_prefix_lands_evenly_on_4_idle_servers():
    with LocalStack(n_sims=4, sim_args=SIM_ARGS, epp_args=["--config", str(CONFIG)]) as st:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            await wait_pool_ready(http, st)
        body = {
            "model": "tiny",
            "prompt": system_prompt("shared", chars=8000) + "What is a prefix?",
            "max_tokens": 32,
        }
        replies = await burst(st.url, 200, concurrency=200, body=body)
    assert all(r.status == 200 for r in replies), Counter(r.status for r in replies)
    per_server = Counter(sim_prefix(r.server) for r in replies)
    # Even is 200 / 4 = 50; ±20 % is 40..60 each, on all four servers.
    assert len(per_server) == 4, per_server
    assert all(40 <= n <= 60 for n in per_server.values()), per_server
