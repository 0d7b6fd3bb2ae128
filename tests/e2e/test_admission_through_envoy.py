"""Shedding end to end: Envoy → `epp serve --objectives` → `epp sim`. Under overload a
sheddable request gets 429 with an OpenAI-style body while critical ones are still served."""

import asyncio

import aiohttp
import pytest

from epp.harness.localstack import LocalStack
from tests.e2e.client import send
from tests.e2e.conftest import SIM_ARGS

pytestmark = pytest.mark.e2e

OBJECTIVE = "x-gateway-inference-objective"
CRITICAL = {OBJECTIVE: "critical"}
SHEDDABLE = {OBJECTIVE: "batch"}
SHORT = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
LONG = {"model": "tiny", "prompt": "a long job", "max_tokens": 60}  # ~0.5 s of decode each


@pytest.fixture(scope="module")
def shed_stack(tmp_path_factory):
    f = tmp_path_factory.mktemp("obj") / "objectives.yaml"
    f.write_text("objectives:\n- {name: critical, priority: 10}\n- {name: batch, priority: -1}\n")
    # 2 servers × 2 slots (SIM_ARGS): 40 long critical requests leave ~18 waiting on each,
    # far above the utilization detector's 5 (saturation = mean(max(q/5, kv/0.8)) ≥ 1).
    # A generous staleness threshold: the loaded machine must not make fresh metrics stale.
    cfg = tmp_path_factory.mktemp("cfg") / "c.yaml"
    cfg.write_text(
        "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"
        "plugins:\n- {type: utilization-detector, parameters: {metricsStalenessThreshold: 5}}\n"
        "- type: queue-scorer\n- type: max-score-picker\n"
        "schedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: queue-scorer\n"
        "  - pluginRef: max-score-picker\n"
        "saturationDetector: {pluginRef: utilization-detector}\n"
    )
    args = ["--objectives", str(f), "--config", str(cfg)]
    with LocalStack(n_sims=2, sim_args=SIM_ARGS, epp_args=args) as st:
        yield st


async def _until(session, url, headers, status, limit=200):
    """Send short requests one after another until one gets `status` (or give up)."""
    for _ in range(limit):
        r = await send(session, url, SHORT, headers=headers)
        if r.status == status:
            return r
        await asyncio.sleep(0.05)
    return None


async def test_sheddable_gets_429_under_overload_and_critical_is_served(shed_stack):
    url = shed_stack.url
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as s:
        # Idle pool: the sheddable request is served.
        assert (await send(s, url, SHORT, headers=SHEDDABLE)).status == 200
        load = [asyncio.create_task(send(s, url, LONG, headers=CRITICAL)) for _ in range(40)]
        # Probes in parallel, not one after another: a probe admitted before the EPP's
        # scrape saw the queues waits behind them, and must not hold back the next probe.
        probes: list[asyncio.Task] = []
        while not all(t.done() for t in load):
            probes.append(asyncio.create_task(send(s, url, SHORT, headers=SHEDDABLE)))
            await asyncio.sleep(0.05)
            if any(p.done() and p.result().status == 429 for p in probes):
                break
        critical_now = await send(s, url, SHORT, headers=CRITICAL)  # during the overload
        done = await asyncio.gather(*load)
        shed = next((r for r in await asyncio.gather(*probes) if r.status == 429), None)
        # Drained: sheddable traffic is admitted again.
        again = await _until(s, url, SHEDDABLE, 200)
    assert shed is not None, "no 429 while 40 long requests queued on 4 slots"
    err = shed.json()["error"]
    assert err["type"] == "rate_limit_error" and "sheddable" in err["message"]
    assert critical_now.status == 200
    assert [r.status for r in done] == [200] * 40
    assert again is not None
