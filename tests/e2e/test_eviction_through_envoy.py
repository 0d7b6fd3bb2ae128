"""In-flight eviction end to end: Envoy → `epp serve` (flow control, `enableEviction`) → `epp sim`.

Sheddable requests fill every slot; a critical request then cannot be placed. The EPP
evicts the most recently dispatched sheddable request (llm-d-router's
`eviction-priority-then-time-ordering`): it answers that request's ext_proc stream with
an ImmediateResponse 429 naming the reason, Envoy resets the upstream request, the
simulator aborts it, its slot goes to the critical request. Checked: what the evicted
client sees (a 429 with `x-llm-d-request-dropped-reason: evicted-priority` before its
response started; an SSE error event naming it, then the reset, after), that exactly one
request was evicted, that the simulator counted it aborted, and that every in-flight
count came back to zero.
"""

import asyncio
import json
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
SHEDDABLE = {OBJECTIVE: "batch"}
REASON = "x-llm-d-request-dropped-reason"
SHORT = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
LONG = {"model": "tiny", "prompt": "a long job", "max_tokens": 1000}  # ~8 s of decode
SHIPPED = Path(__file__).resolve().parents[2] / "config" / "flow-control.yaml"


def eviction_args(d: Path, enable: bool = True) -> list[str]:
    """The shipped flow-control config, 2 slots per server, sheddable requests allowed up
    to full saturation (so they can fill the pool), eviction on."""
    objectives = d / "objectives.yaml"
    objectives.write_text(
        "objectives:\n- {name: critical, priority: 100}\n- {name: batch, priority: -1}\n"
    )
    text = SHIPPED.read_text()
    for old, new in (
        ("maxConcurrency: 16", "maxConcurrency: 2"),
        ("sheddableThreshold: 0.75", "sheddableThreshold: 1.0"),
        (
            "  usageLimitPolicyPluginRef:",
            f"  enableEviction: {str(enable).lower()}\n  usageLimitPolicyPluginRef:",
        ),
    ):
        assert old in text
        text = text.replace(old, new)
    cfg = d / "flow-control.yaml"
    cfg.write_text(text)
    return ["--objectives", str(objectives), "--config", str(cfg)]


@pytest.fixture(scope="module")
def evict_stack(tmp_path_factory):
    args = eviction_args(tmp_path_factory.mktemp("evict"))
    with LocalStack(n_sims=2, sim_args=SIM_ARGS, epp_args=args) as st:
        yield st


async def metric(session, url: str, name: str, **labels: str) -> float:
    async with session.get(url + "/metrics") as r:
        text = await r.text()
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"{re.escape(name)}(?:{{(.*)}})? (\S+)$", line)
        if m and all(f'{k}="{v}"' in (m.group(1) or "") for k, v in labels.items()):
            total += float(m.group(2))
    return total


async def running(session, murl: str) -> float:
    return await metric(session, murl, "inference_objective_running_requests")


async def wait_until(cond, what: str, tries: int = 1200) -> None:
    for _ in range(tries):
        if await cond():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def stream_events(
    session, url: str, body: dict, headers: dict
) -> tuple[int, list[bytes], str]:
    """A streamed request: its status, the SSE data lines read, and how it ended."""
    lines: list[bytes] = []
    data = json.dumps({**body, "stream": True}).encode()
    hdrs = {"content-type": "application/json", **headers}
    async with session.post(url + "/v1/completions", data=data, headers=hdrs) as r:
        try:
            async for line in r.content:
                if line.startswith(b"data: "):
                    lines.append(line.strip())
        except aiohttp.ClientPayloadError as e:
            return r.status, lines, f"reset: {e}"
        return r.status, lines, "complete"


async def post(session, url: str, body: dict, headers: dict) -> tuple[int, dict, dict]:
    """A request's status, response headers and JSON body."""
    hdrs = {"content-type": "application/json", **headers}
    async with session.post(url + "/v1/completions", json=body, headers=hdrs) as r:
        return r.status, dict(r.headers), json.loads(await r.read())


async def fill(session, url: str, murl: str, n: int, streamed_last: bool) -> list[asyncio.Task]:
    """`n` long sheddable requests, each running before the next is sent (so the last
    one is the most recently dispatched)."""
    tasks = []
    for i in range(n):
        if streamed_last and i == n - 1:
            coro = stream_events(session, url, LONG, SHEDDABLE)
        else:
            coro = post(session, url, LONG, SHEDDABLE)
        tasks.append(asyncio.create_task(coro))
        await wait_until(lambda i=i: _at_least(session, murl, i + 1), f"{i + 1} running")
    return tasks


async def _at_least(session, murl: str, n: int) -> bool:
    return await running(session, murl) >= n


async def test_eviction_before_the_response_starts_is_a_429_with_the_reason(evict_stack):
    url, murl = evict_stack.url, evict_stack.epp_metrics_url
    sims = [s.url for s in evict_stack.sims]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s:
        refused0 = await metric(s, murl, "epp_requests_refused_total", reason="evicted-priority")
        issued0 = await metric(s, murl, "llm_d_epp_flow_control_revocations_issued_total")
        # 4 slots (2 servers x maxConcurrency 2), 4 non-streamed sheddable requests: their
        # responses start only when they finish, so the victim is still before its response.
        fillers = await fill(s, url, murl, 4, streamed_last=False)
        critical = await send(s, url, SHORT, headers=CRITICAL)
        # The server was told: Envoy reset the evicted upstream request, the simulator
        # aborted it (as vLLM aborts a request whose client left) and freed its slot,
        # while the three others still run.
        await wait_until(lambda: _sims_running(s, sims, 3), "the evicted request aborted")
        still_running = [not t.done() for t in fillers]
        done = await asyncio.gather(*fillers)
        await wait_until(lambda: _zero(s, murl), "in-flight counts back to 0")
        refused = await metric(s, murl, "epp_requests_refused_total", reason="evicted-priority")
        issued = await metric(s, murl, "llm_d_epp_flow_control_revocations_issued_total")
        confirmed = await metric(
            s, murl, "llm_d_epp_flow_control_revocations_total", outcome="confirmed"
        )
    assert critical.status == 200
    statuses = [status for status, _, _ in done]
    # The most recently dispatched one was evicted, and the critical request finished
    # while the other three still ran (it took the evicted one's slot, not a finished one's).
    assert statuses == [200, 200, 200, 429], statuses
    assert still_running[:3] == [True, True, True]
    _, headers, body = done[-1]
    assert headers.get(REASON) == "evicted-priority"
    assert body["error"]["code"] == "evicted" and "higher priority" in body["error"]["message"]
    assert refused == refused0 + 1 and issued == issued0 + 1 and confirmed >= 1


async def _sims_running(session, sims: list[str], n: int) -> bool:
    total = 0.0
    for u in sims:
        total += await metric(session, u, "vllm:num_requests_running")
    return total == n


async def _zero(session, murl: str) -> bool:
    return await running(session, murl) == 0


async def test_eviction_of_a_started_stream_names_the_reason_in_an_sse_event(evict_stack):
    url, murl = evict_stack.url, evict_stack.epp_metrics_url
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s:
        fillers = await fill(s, url, murl, 4, streamed_last=True)
        # The victim's stream has started: wait for its first token.
        critical = await send(s, url, SHORT, headers=CRITICAL)
        done = await asyncio.gather(*fillers)
        await wait_until(lambda: _zero(s, murl), "in-flight counts back to 0")
    assert critical.status == 200
    status, lines, ended = done[-1]
    assert status == 200  # the response had started: its status cannot change
    assert ended.startswith("reset"), ended
    assert lines and b'"evicted"' in lines[-1] and b"higher priority" in lines[-1]
    assert [r[0] for r in done[:3]] == [200, 200, 200]
