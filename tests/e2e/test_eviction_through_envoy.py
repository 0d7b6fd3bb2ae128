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

Placement is made exact: the detector is also the profile's first filter, so a server
at its 2 takes nothing more. Without it the scorers place by the servers' scraped
metrics, which lag what the EPP has just sent: a filler can queue on a full server and
the critical request can land on a full server rather than in the evicted one's slot,
and then waits there for a filler to finish (the pool-wide eviction itself still works).
"""

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest

from epp.harness.localstack import LocalStack
from tests.e2e.client import send
from tests.e2e.conftest import SIM_ARGS
from tests.e2e.test_flow_control_through_envoy import metric
from tests.eventually import eventually

pytestmark = pytest.mark.e2e

OBJECTIVE = "x-gateway-inference-objective"
CRITICAL = {OBJECTIVE: "critical"}
SHEDDABLE = {OBJECTIVE: "batch"}
REASON = "x-llm-d-request-dropped-reason"
SHORT = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
LONG = {"model": "tiny", "prompt": "a long job", "max_tokens": 1000}  # ~8 s of decode
SHIPPED = Path(__file__).resolve().parents[2] / "config" / "flow-control.yaml"


def eviction_args(d: Path, enable: bool = True) -> list[str]:
    """The shipped flow-control config, 2 slots per server (the detector also filters,
    so no server is sent a third), sheddable requests allowed up to full saturation (so
    they can fill the pool), eviction on."""
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
        (
            "  plugins:\n  - pluginRef: queue-scorer",
            "  plugins:\n  - pluginRef: concurrency-detector\n  - pluginRef: queue-scorer",
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
    # Eviction stops a running request on its routing stream: the in-path response mode.
    with LocalStack(n_sims=2, sim_args=SIM_ARGS, epp_args=args, response_path=True) as st:
        yield st


async def running(session, murl: str) -> float:
    return await metric(session, murl, "inference_objective_running_requests")


async def wait_until(cond, what: str) -> None:
    """Until `cond` holds; the deadline only bounds a broken run on a loaded machine."""
    await eventually(cond, what, timeout=120, interval=0.05)


class RawStream:
    """A streamed request on a plain socket, so what reaches the client is seen byte for
    byte (an HTTP library may drop data it buffered when the connection then resets)."""

    def __init__(self, url: str, body: dict, headers: dict) -> None:
        self.host, port = url.removeprefix("http://").split(":")
        self.port = int(port)
        payload = json.dumps({**body, "stream": True}).encode()
        lines = [
            "POST /v1/completions HTTP/1.1",
            f"host: {self.host}",
            "content-type: application/json",
            f"content-length: {len(payload)}",
            *(f"{k}: {v}" for k, v in headers.items()),
        ]
        self.request = ("\r\n".join(lines) + "\r\n\r\n").encode() + payload
        self.received = b""

    async def start(self) -> None:
        """Send, then read until the first token event has arrived."""
        self.reader, writer = await asyncio.open_connection(self.host, self.port)
        writer.write(self.request)
        await writer.drain()
        self.writer = writer
        while b"data: {" not in self.received:
            chunk = await self.reader.read(65536)
            assert chunk, f"closed before the first token: {self.received!r}"
            self.received += chunk

    async def finish(self) -> bytes:
        """Everything until the connection ends."""
        while chunk := await self.reader.read(65536):
            self.received += chunk
        self.writer.close()
        return self.received


async def post(session, url: str, body: dict, headers: dict) -> tuple[int, dict, dict]:
    """A request's status, response headers and JSON body."""
    hdrs = {"content-type": "application/json", **headers}
    async with session.post(url + "/v1/completions", json=body, headers=hdrs) as r:
        return r.status, dict(r.headers), json.loads(await r.read())


async def fill(session, url: str, murl: str, n: int) -> list[asyncio.Task]:
    """`n` long non-streamed sheddable requests, each running before the next is sent."""
    tasks = []
    for i in range(n):
        tasks.append(asyncio.create_task(post(session, url, LONG, SHEDDABLE)))
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
        aborted0 = await _sims_aborted(s, sims)
        # 4 slots (2 servers x maxConcurrency 2), 4 non-streamed sheddable requests: their
        # responses start only when they finish, so the victim is still before its response.
        fillers = await fill(s, url, murl, 4)
        critical = await send(s, url, SHORT, headers=CRITICAL)
        # The server was told: Envoy reset the evicted upstream request, the simulator
        # aborted it (as vLLM aborts a request whose client left) and freed its slot,
        # while the three others still run.
        await wait_until(
            lambda: _sims_aborted_reached(s, sims, aborted0 + 1), "the evicted request aborted"
        )
        still_running = [not t.done() for t in fillers]
        done = await asyncio.gather(*fillers)
        await wait_until(lambda: _zero(s, murl), "in-flight counts back to 0")
        aborted = await _sims_aborted(s, sims)
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
    assert aborted == aborted0 + 1  # the evicted one, and nothing else


async def _sims_aborted(session, sims: list[str]) -> int:
    """Requests the simulators aborted (client gone), wherever the EPP put them."""
    total = 0
    for u in sims:
        async with session.get(u + "/admin") as r:
            total += (await r.json())["stats"]["requests_aborted"]
    return total


async def _sims_aborted_reached(session, sims: list[str], n: int) -> bool:
    return await _sims_aborted(session, sims) >= n


async def _zero(session, murl: str) -> bool:
    return await running(session, murl) == 0


async def test_eviction_of_a_started_stream_names_the_reason_in_an_sse_event(evict_stack):
    url, murl = evict_stack.url, evict_stack.epp_metrics_url
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s:
        fillers = await fill(s, url, murl, 3)
        victim = RawStream(url, LONG, SHEDDABLE)  # the most recently dispatched
        await asyncio.wait_for(victim.start(), 60)  # its response has started
        critical = await send(s, url, SHORT, headers=CRITICAL)
        raw = await asyncio.wait_for(victim.finish(), 60)
        done = await asyncio.gather(*fillers)
        await wait_until(lambda: _zero(s, murl), "in-flight counts back to 0")
    assert critical.status == 200
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")  # the response had started: its status stays
    events = [line for line in body.split(b"\n") if line.startswith(b"data: ")]
    assert b'"evicted"' in events[-1] and b"higher priority" in events[-1], events[-3:]
    assert not body.endswith(b"0\r\n\r\n")  # no chunked terminator: the stream was reset
    assert [r[0] for r in done] == [200, 200, 200]
