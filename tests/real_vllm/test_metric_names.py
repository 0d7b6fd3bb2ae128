"""The simulator's metrics are a superset of a real vLLM's, for every family the EPP reads.

Compared: family names, types and label keys (label *values* such as `engine` differ by
nature). The families are those of the vLLM engine map the scraper uses
(`epp.datalayer.metric_maps.VLLM`), plus the prefix-cache counters the hit comparison
in test_prefix_cache_parity.py reads.
"""

from __future__ import annotations

import argparse

import aiohttp
import pytest

from epp.datalayer.metric_maps import VLLM
from epp.sim.cli import add_arguments, config_from_args
from epp.sim.server import SimServer
from tests.real_vllm.conftest import BLOCK_SIZE, LORA_NAME, MODEL_NAME
from tests.real_vllm.helpers import TIMEOUT, families, get_text, post

pytestmark = pytest.mark.real_vllm

PREFIX_COUNTERS = ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits")
# Families of the map that vLLM 0.32 no longer has: the fallback for older releases.
OLD_NAMES = {"vllm:gpu_cache_usage_perc"}
LORA_FAMILY = "vllm:lora_requests_info"


def sim_config(*flags: str):
    """A simulator config built through its CLI flags (the stable interface)."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return config_from_args(parser.parse_args(list(flags)))


async def test_sim_metrics_cover_the_real_ones_the_epp_reads(vllm_pool):
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        # vLLM publishes LoRA series once an adapter request has been scheduled.
        lora_server = next(s for s in vllm_pool.servers if LORA_NAME in s.models)
        r = await post(
            http,
            f"{lora_server.url}/v1/completions",
            {"model": LORA_NAME, "prompt": "hi", "max_tokens": 1},
        )
        assert r.status == 200, r.body[:300]
        real = {}
        for s in vllm_pool.servers:
            for name, fam in families(await get_text(http, f"{s.url}/metrics")).items():
                if name in real:  # union of label keys over both servers
                    fam = type(fam)(name, fam.type, fam.label_keys | real[name].label_keys, ())
                real[name] = fam
        config = sim_config(
            "--model", MODEL_NAME,
            "--block-size", str(BLOCK_SIZE),
            "--enable-prefix-caching",
            "--lora-modules", "adapter-a",
            "--max-loras", "2",
        )  # fmt: skip
        async with SimServer("sim-0", config) as sim:
            # A LoRA request makes the sim publish its LoRA series, as vLLM does on start.
            await http.post(
                f"{sim.url}/v1/completions",
                json={"model": "adapter-a", "prompt": "hi", "max_tokens": 1},
            )
            simulated = families(await get_text(http, f"{sim.url}/metrics"))

    wanted = sorted((VLLM.families - OLD_NAMES) | set(PREFIX_COUNTERS))
    assert LORA_FAMILY in wanted
    assert real.get(LORA_FAMILY) and real[LORA_FAMILY].label_keys, "no LoRA series on vLLM"
    # The comparison must not be empty by accident: a real server has all of these.
    missing_real = [f for f in wanted if f not in real]
    assert not missing_real, (
        f"the real vLLM lacks families the EPP reads: {missing_real}; "
        f"it has {sorted(f for f in real if f.startswith('vllm:'))}"
    )
    assert not (OLD_NAMES & set(real)), "vLLM 0.32 still reports the old KV usage name"

    problems = []
    for name in wanted:
        r = real[name]
        s = simulated.get(name)
        if s is None:
            problems.append(f"{name}: missing from the simulator")
            continue
        if s.type != r.type:
            problems.append(f"{name}: type {s.type} in the simulator, {r.type} in vLLM")
        lacking = sorted(r.label_keys - s.label_keys)
        if lacking:
            problems.append(f"{name}: simulator lacks label(s) {lacking}")
    assert not problems, "simulator vs real vLLM 0.32:\n  " + "\n  ".join(problems)
