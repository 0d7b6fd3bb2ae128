"""Flow control end to end: Envoy → `epp serve --config config/flow-control.yaml` → `epp sim`.

Under overload the EPP holds standard requests in its queue, refuses sheddable ones with
429 at once, serves a critical request ahead of the queue, and a client that gives up
while queued leaves the queue (Envoy resets the ext_proc stream)."""

import asyncio
import re
from pathlib import Path

import aiohttp
import pytest

from epp.harness.localstack import LocalStack
from tests.e2e.client import send
from tests.e2e.conftest import SIM_ARGS

pytestmark = pytest.mark.e2e

OBJECTIVE = "x-gateway-inference-objective"
CRITICAL = {OBJECTIVE: "critical"}
STANDARD = {OBJECTIVE: "standard"}
SHEDDABLE = {OBJECTIVE: "batch"}
SHORT = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
LONG = {"model": "tiny", "prompt": "a long job", "max_tokens": 60}  # ~0.5 s of decode each
SHIPPED = Path(__file__).resolve().parents[2] / "config" / "flow-control.yaml"


def flow_args(d: Path) -> list[str]:
    """`epp serve` arguments: objectives, and the shipped config with the detector's limit
    set to the sims' 2 slots each (SIM_ARGS --max-num-seqs 2): 2 servers take 4 requests,
    the rest wait in the EPP."""
    objectives = d / "objectives.yaml"
    objectives.write_text(
        "objectives:\n- {name: critical, priority: 100}\n- {name: standard, priority: 0}\n"
        "- {name: batch, priority: -1}\n"
    )
    text = SHIPPED.read_text()
    assert "maxConcurrency: 16" in text
    cfg = d / "flow-control.yaml"
    cfg.write_text(text.replace("maxConcurrency: 16", "maxConcurrency: 2"))
    return ["--objectives", str(objectives), "--config", str(cfg)]


@pytest.fixture(scope="module")
def flow_stack(tmp_path_factory):
    args = flow_args(tmp_path_factory.mktemp("fc"))
    with LocalStack(n_sims=2, sim_args=SIM_ARGS, epp_args=args) as st:
        yield st


async def metric(session, url: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels` on the EPP's /metrics."""
    async with session.get(url + "/metrics") as r:
        text = await r.text()
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"{name}(?:{{(.*)}})? (\S+)$", line)
        if m and all(f'{k}="{v}"' in (m.group(1) or "") for k, v in labels.items()):
            total += float(m.group(2))
    return total


async def test_overload_holds_standard_sheds_batch_and_serves_critical(flow_stack):
    url, murl = flow_stack.url, flow_stack.epp_metrics_url
    timeout = aiohttp.ClientTimeout(total=120)
    queue_size = "inference_extension_flow_control_queue_size"
    cancelled = "inference_extension_flow_control_request_queue_duration_seconds_count"
    async with aiohttp.ClientSession(timeout=timeout) as s:
        assert (await send(s, url, SHORT, headers=SHEDDABLE)).status == 200  # idle pool
        before = await metric(s, murl, cancelled, outcome="EvictedContextCancelled")
        # 24 long standard requests on 4 slots: 4 run, 20 wait in the EPP.
        load = [asyncio.create_task(send(s, url, LONG, headers=STANDARD)) for _ in range(24)]
        for _ in range(600):
            if await metric(s, murl, queue_size) >= 10:
                break
            await asyncio.sleep(0.05)
        queued = await metric(s, murl, queue_size)
        shed = await send(s, url, SHORT, headers=SHEDDABLE)
        critical = asyncio.create_task(send(s, url, SHORT, headers=CRITICAL))
        # A client that gives up while its request waits: its ext_proc stream ends.
        quitter = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.5))
        async with quitter:
            with pytest.raises(TimeoutError):
                await send(quitter, url, LONG, headers=STANDARD)
        critical_reply = await critical
        done = await asyncio.gather(*load)
        left = await metric(s, murl, queue_size)
        after = await metric(s, murl, cancelled, outcome="EvictedContextCancelled")
    assert queued >= 10, "the standard load never waited in the EPP"
    assert shed.status == 429
    err = shed.json()["error"]
    assert err["type"] == "rate_limit_error" and "sheddable" in err["message"]
    assert critical_reply.status == 200
    assert [r.status for r in done] == [200] * 24
    assert left == 0
    assert after == before + 1  # the quitter left the queue when its client went away


async def test_buffered_body_mode_queues_requests_and_honours_their_ttl_header(tmp_path):
    """Envoy's `request_body_mode: BUFFERED` (the whole body in one message; the EPP answers
    the headers at once, before it has the body) with flow control: requests held in the
    EPP's queue are routed with their bodies once slots free, and one whose
    `x-llm-d-inference-ttl` runs out first gets the EPP's 503 through Envoy."""
    slow = {"model": "tiny", "prompt": "a long job", "max_tokens": 200}  # ~1.6 s each
    with LocalStack(
        n_sims=2, sim_args=SIM_ARGS, epp_args=flow_args(tmp_path), request_body_mode="BUFFERED"
    ) as st:
        url, murl = st.url, st.epp_metrics_url
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s:
            # 4 run (2 slots x 2 servers), 4 wait in the EPP
            load = [asyncio.create_task(send(s, url, slow, headers=STANDARD)) for _ in range(8)]
            for _ in range(600):
                if await metric(s, murl, "inference_extension_flow_control_queue_size") >= 4:
                    break
                await asyncio.sleep(0.05)
            # behind 4 queued requests of ~1.6 s each: 50 ms cannot be enough
            impatient = await send(
                s, url, SHORT, headers=STANDARD | {"x-llm-d-inference-ttl": "50ms"}
            )
            done = await asyncio.gather(*load)
    assert impatient.status == 503, impatient.body
    err = impatient.json()["error"]
    assert "waited 0.05s" in err["message"] and "x-llm-d-inference-ttl header" in err["message"]
    assert [r.status for r in done] == [200] * 8
    assert all(r.json()["usage"]["completion_tokens"] == 200 for r in done)  # bodies kept
