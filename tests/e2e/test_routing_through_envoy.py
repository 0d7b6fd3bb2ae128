"""End to end through a real Envoy, `epp serve` and simulator processes on loopback."""

import asyncio
import json
import re
import urllib.request

import aiohttp
import pytest

from epp.harness.localstack import LocalStack
from epp.headers import DESTINATION_ENDPOINT, MODEL_REWRITE
from tests.e2e.client import burst, debug_endpoints, send, servers, sim_prefix
from tests.e2e.conftest import SIM_ARGS
from tests.eventually import eventually

pytestmark = pytest.mark.e2e

BODY = {"model": "tiny", "prompt": "Say something about routing.", "max_tokens": 4}


def epp_metric_counts(stack, name: str, label: str) -> dict[str, float]:
    text = urllib.request.urlopen(stack.epp_metrics_url + "/metrics", timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{") and 'status="success"' in line:
            m = re.search(label + r'="([^"]*)"', line)
            out[m.group(1)] = float(line.rsplit(" ", 1)[1])
    return out


async def test_requests_succeed_and_land_where_the_epp_said(stack):
    before = epp_metric_counts(stack, "inference_extension_scheduler_attempts_total", "pod_name")
    replies = await burst(stack.url, 45, 6, BODY)
    assert [r.status for r in replies] == [200] * 45
    assert all(r.json()["choices"][0]["text"] for r in replies)
    after = epp_metric_counts(stack, "inference_extension_scheduler_attempts_total", "pod_name")
    scheduled = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    served = servers(replies)
    # Every endpoint served exactly as many requests as the EPP sent it.
    assert {k: v for k, v in scheduled.items() if v} == {
        sim_prefix(k): float(v) for k, v in served.items()
    }


async def test_streaming_and_chat_through_envoy(stack):
    async with aiohttp.ClientSession() as s:
        r = await send(
            s,
            stack.url,
            {
                "model": "tiny",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 5,
                "stream": True,
            },
            path="/v1/chat/completions",
        )
    assert r.status == 200
    events = [line for line in r.body.decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert len(events) >= 6


async def test_client_sent_destination_header_is_ignored(stack):
    # Pointing at a closed port: if Envoy honoured it, every request would fail.
    replies = await burst(stack.url, 12, 4, BODY, headers={DESTINATION_ENDPOINT: "127.0.0.1:1"})
    assert [r.status for r in replies] == [200] * 12
    # Pointing at sim-0: requests still spread according to the EPP.
    replies = await burst(
        stack.url, 30, 3, BODY, headers={DESTINATION_ENDPOINT: stack.sims[0].hostport}
    )
    assert len(servers(replies)) > 1


async def test_malformed_json_gets_400_json_error_through_envoy(stack):
    async with aiohttp.ClientSession() as s:
        r = await send(s, stack.url, b'{"model": "tiny", "prompt": ', path="/v1/completions")
        assert r.status == 400
        err = r.json()["error"]
        assert "not valid JSON" in err["message"] and err["type"] == "invalid_request_error"
        r = await send(s, stack.url, {"model": "no-such-model", "prompt": "x"})
        assert r.status == 404 and "no-such-model" in r.json()["error"]["message"]
        r = await send(s, stack.url, BODY)  # the EPP keeps serving
        assert r.status == 200


async def test_get_without_body_is_routed(stack):
    async with aiohttp.ClientSession() as s, s.get(stack.url + "/v1/models") as r:
        assert r.status == 200
        assert (await r.json())["data"][0]["id"] == "tiny"


async def test_model_rewrite_header_reaches_the_server(stack):
    # The simulator serves "tiny"; the client asks for an alias the gateway rewrites.
    async with aiohttp.ClientSession() as s:
        r = await send(
            s,
            stack.url,
            {"model": "tiny-alias", "prompt": "hello", "max_tokens": 2},
            headers={MODEL_REWRITE: "tiny"},
        )
    assert r.status == 200, r.body
    assert r.json()["model"] == "tiny"


async def test_load_spreads_away_from_a_slow_busy_endpoint(stack):
    slow = stack.sims[0]
    async with aiohttp.ClientSession() as s:
        async with s.post(slow.url + "/admin", json={"delay_ms": 1500}) as r:
            assert r.status == 200
        try:
            body = {**BODY, "max_tokens": 12}
            replies = await burst(stack.url, 60, 10, body)
        finally:
            async with s.post(slow.url + "/admin", json={"delay_ms": 0}) as r:
                assert r.status == 200
    assert all(r.status == 200 for r in replies)
    share = servers(replies).get(f"{slow.name}-0", 0) / len(replies)
    assert share < 0.2, servers(replies)  # a fair share would be 1/3


def unhealthy(stack, *names: str) -> bool:
    rows = {r["name"]: r for r in debug_endpoints(stack)}
    return all(not rows[n]["healthy"] for n in names)


async def test_killed_endpoint_stops_receiving_traffic_once_marked_unhealthy(fresh_stack):
    st = fresh_stack
    first = await burst(st.url, 12, 3, BODY)
    assert all(r.status == 200 for r in first)
    st.kill_sim(2)
    dead = st.sims[2].name
    await eventually(
        lambda: unhealthy(st, dead), f"the EPP to mark {dead} unhealthy", blocking=True
    )
    replies = await burst(st.url, 30, 3, BODY)
    assert [r.status for r in replies] == [200] * 30
    assert "sim-2-0" not in servers(replies)


async def test_all_endpoints_gone_gives_503_and_epp_keeps_serving_then_recovers(fresh_stack):
    st = fresh_stack
    for i in range(3):
        st.kill_sim(i)
    await eventually(
        lambda: unhealthy(st, *(s.name for s in st.sims)),
        "the EPP to mark every simulator unhealthy",
        blocking=True,
    )
    replies = await burst(st.url, 6, 3, BODY)
    assert [r.status for r in replies] == [503] * 6
    assert "healthy" in replies[0].json()["error"]["message"]  # the EPP's own answer
    st.restart_sim(1)
    for _ in range(50):
        await asyncio.sleep(0.1)
        replies = await burst(st.url, 1, 1, BODY)
        if replies[0].status == 200:
            break
    assert replies[0].status == 200 and replies[0].server == "sim-1-0"


@pytest.mark.parametrize("mode", ["BUFFERED", "STREAMED"])
async def test_other_body_modes_route_and_keep_the_body(mode):
    with LocalStack(n_sims=2, sim_args=SIM_ARGS, request_body_mode=mode) as st:
        async with aiohttp.ClientSession() as s:
            for _ in range(4):
                r = await send(
                    s,
                    st.url,
                    {"model": "alias", "prompt": "hello " * 50, "max_tokens": 2},
                    headers={MODEL_REWRITE: "tiny"},
                )
                assert r.status == 200, r.body
                assert r.json()["usage"]["prompt_tokens"] > 40
            r = await send(s, st.url, json.dumps({"model": "tiny"}).encode())
            assert r.status == 400


async def test_hostile_bodies_get_400_json_through_envoy_never_an_empty_500(stack):
    """Issue 13 §1e: each of these once gave Envoy's empty 500 with a traceback."""
    hostile = [
        b'{"model": "tiny", "prompt": "x", "a": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
        b'{"model": "tiny", "prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}",
        b'{"model": "tiny", "prompt": "lone \\ud800 surrogate"}',
    ]
    async with aiohttp.ClientSession() as s:
        for body in hostile:
            r = await send(s, stack.url, body)
            assert r.status == 400, (r.status, r.body[:200])
            assert r.json()["error"]["type"] == "invalid_request_error"
        assert (await send(s, stack.url, BODY)).status == 200


async def test_too_many_headers_get_431_json_not_envoys_empty_500(stack):
    """Issue 13 §1f: 92-96 client headers plus the EPP's own crossed Envoy's limit of 100
    and got an empty 500. Around the limit each reply is now a 200 or the EPP's 431.
    (aiohttp sends 6 headers of its own; from 95 extra the client's headers alone cross
    Envoy's limit and Envoy's codec closes the connection, without the EPP.)"""
    statuses = []
    async with aiohttp.ClientSession() as s:
        for extra in range(84, 95):
            headers = {f"x-h{i}": "v" for i in range(extra)}
            r = await send(s, stack.url, BODY, headers=headers)
            statuses.append(r.status)
            if r.status != 200:
                assert r.status == 431, (extra, r.status, r.body[:200])
                assert "headers" in r.json()["error"]["message"]
    assert 200 in statuses and 431 in statuses
