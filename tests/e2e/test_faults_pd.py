"""The P/D sidecar's prefill leg failing or hanging under load (issue 13 §3), through a
real Envoy, `epp serve --config config/pd-disagg.yaml`, 2 prefill and 2 decode simulators
(each decode one behind an `epp sidecar` with `--prefill-timeout 1`).

The sidecar decodes locally when the prefill server answers 5xx, times out or cannot be
reached (`prefill_fallback`), so no client request is lost: the fault costs latency only.
"""

from __future__ import annotations

import asyncio
import re
import urllib.request
import uuid

import aiohttp
import pytest

from epp.harness.localstack import LocalStack, PDLayout
from tests.e2e.client import Recorder, describe

pytestmark = pytest.mark.e2e

SIM_ARGS = ["--max-num-seqs", "4", "--decode-ms-per-token", "2", "--prefill-ms-per-token", "0.02"]


def fresh_long_body() -> dict:
    """~500 uncached prompt tokens: over the decider's 256, so every request is P/D."""
    prompt = f"{uuid.uuid4()} " + " ".join(f"fact{i} about faults." for i in range(100))
    return {"model": "tiny", "prompt": prompt, "max_tokens": 4}


def sidecar_outcomes(st: LocalStack) -> dict[str, float]:
    out: dict[str, float] = {}
    for sc in st.sidecars:
        text = urllib.request.urlopen(sc.url + "/metrics", timeout=5).read().decode()
        for m in re.finditer(r'^epp_sidecar_requests_total\{[^}]*outcome="([^"]+)"[^}]*\} (\S+)$',
                             text, re.MULTILINE):  # fmt: skip
            out[m[1]] = out.get(m[1], 0.0) + float(m[2])
    return out


async def set_prefill_faults(st: LocalStack, faults: dict) -> None:
    async with aiohttp.ClientSession() as http:
        for sim in st.sims:
            if sim.name.startswith("prefill-"):
                async with http.post(sim.url + "/admin", json=faults) as r:
                    assert r.status == 200


@pytest.fixture(scope="module")
def pd_stack():
    pd = PDLayout(n_prefill=2, n_decode=2, sidecar_args=["--prefill-timeout", "1"])
    with LocalStack(sim_args=SIM_ARGS, pd=pd) as st:
        yield st


@pytest.mark.parametrize(
    "fault",
    [{"fail_rate": 1.0}, {"delay_ms": 600_000.0}],
    ids=["prefill-fails", "prefill-hangs"],
)
async def test_a_failing_or_hanging_prefill_costs_no_request(pd_stack: LocalStack, fault: dict):
    st = pd_stack
    loop = asyncio.get_running_loop()
    base = sidecar_outcomes(st)
    load = Recorder(st.url, 4, fresh_long_body)
    await load.wait_ok(4)
    before = sidecar_outcomes(st)
    assert before.get("prefill_decode", 0) > base.get("prefill_decode", 0)  # the load is P/D
    t_fault = loop.time()
    await set_prefill_faults(st, fault)
    await load.wait_ok(6, after=t_fault)
    during = sidecar_outcomes(st)
    t_clear = loop.time()
    await set_prefill_faults(st, {"fail_rate": 0.0, "delay_ms": 0.0})
    await load.wait_ok(4, after=t_clear)
    outcomes = await load.finish()
    after = sidecar_outcomes(st)

    fallbacks = during.get("prefill_fallback", 0) - before.get("prefill_fallback", 0)
    assert fallbacks >= 6 - 4  # started after the fault, less up to 4 that were past prefill
    assert [o for o in outcomes if not o.ok] == [], describe(outcomes)
    # Once the prefill servers work again, requests are disaggregated again.
    assert after.get("prefill_decode", 0) > during.get("prefill_decode", 0)
    print(
        f"\nP/D {next(iter(fault))}: {len(outcomes)} requests, 0 failed; {fallbacks:.0f} decoded "
        f"locally after the prefill leg failed; {dict(describe(outcomes))}"
    )
