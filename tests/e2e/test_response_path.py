"""The response path through a real Envoy, `epp serve` and `epp sim`: streams reach the
client chunk by chunk and unchanged, the EPP's in-flight count lasts exactly as long as
the response (end, client disconnect, upstream failure), and usage/TTFT are recorded.
Each test runs with the response read by Envoy and reported in its access log
(deploy/envoy/envoy.yaml, `--response-path log`, the default), in Envoy's path through the
EPP (`--response-path on`) and on the observability-mode filter (envoy-observer.yaml,
`--response-path observer`): the same observations, the same accounting."""

import asyncio
import json
import re
import urllib.request

import aiohttp
import pytest

from epp.harness.localstack import LocalStack

pytestmark = pytest.mark.e2e

# 40 ms per output token: a 40-token stream generates for ~1.6 s, long enough to look
# at the EPP while it runs and for every token to be its own chunk on the wire.
SIM_ARGS = ["--decode-ms-per-token", "40", "--prefill-ms-per-token", "0.02"]
TOKENS = 40
STREAM = {
    "model": "tiny",
    "prompt": "Tell me about streaming.",
    "max_tokens": TOKENS,
    "stream": True,
    "stream_options": {"include_usage": True},
}
TIMEOUT = aiohttp.ClientTimeout(total=60)


# log: Envoy measures and reports each response once; on (in-path): Envoy waits for the
# EPP to hand every chunk back; observer: Envoy sends every chunk and does not wait.
PATHS = ["log", "on", "observer"]


def local_stack(path: str, **kw) -> LocalStack:
    kw.setdefault("sim_args", SIM_ARGS)
    return LocalStack(response_path=path, observer=path == "observer", **kw)


@pytest.fixture(scope="module", params=PATHS)
def stack(request):
    with local_stack(request.param, n_sims=1) as st:
        yield st


def inflight(stack) -> int:
    url = stack.epp_metrics_url + "/debug/endpoints"
    rows = json.loads(urllib.request.urlopen(url, timeout=5).read())
    return sum(r["inflight_requests"] for r in rows)


async def wait_inflight_zero(stack, timeout: float = 15.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while inflight(stack) != 0:
        assert loop.time() < deadline, f"in-flight still {inflight(stack)} after {timeout}s"
        await asyncio.sleep(0.05)


def metric(stack, name: str) -> float:
    """Sum of one series over all label sets (e.g. `..._sum`, `..._count`)."""
    text = urllib.request.urlopen(stack.epp_metrics_url + "/metrics", timeout=5).read().decode()
    pattern = re.compile(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", re.M)
    return sum(float(v) for v in pattern.findall(text))


def events(raw: bytes) -> list[str]:
    return [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]


def texts(raw: bytes) -> list[str]:
    return [json.loads(e)["choices"][0]["text"] for e in events(raw)[:-1] if '"choices": [{' in e]


async def test_stream_arrives_chunk_by_chunk_unchanged_and_holds_inflight_until_it_ends(stack):
    ttft_before = metric(stack, "inference_objective_request_ttft_seconds_count")
    out_before = metric(stack, "inference_objective_output_tokens_sum")
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        async with session.post(stack.url + "/v1/completions", json=STREAM) as r:
            assert r.status == 200
            chunks = [await r.content.readany()]
            # The first token is at the client while the model still generates: nothing
            # is buffered, and the EPP still counts the request.
            during = inflight(stack)
            async for data in r.content.iter_any():
                chunks.append(data)
        # The same request straight to the simulator, for the bytes the client should see.
        async with session.post(stack.sims[0].url + "/v1/completions", json=STREAM) as r:
            direct = await r.read()
    await wait_inflight_zero(stack)
    assert during == 1
    via_envoy = b"".join(chunks)
    assert texts(via_envoy) == texts(direct) and len(texts(direct)) == TOKENS
    assert len(events(via_envoy)) == len(events(direct))  # 40 tokens + usage + [DONE]
    # Chunk by chunk: 40 tokens 40 ms apart reach the client as (nearly) 40 reads; a
    # buffering proxy would deliver one or two.
    assert len(chunks) >= TOKENS // 2, len(chunks)
    usage = json.loads(events(via_envoy)[-2])["usage"]
    assert usage["completion_tokens"] == TOKENS
    await asyncio.sleep(0)  # the record is written before in-flight reads 0; metrics too
    assert metric(stack, "inference_objective_request_ttft_seconds_count") == ttft_before + 1
    assert metric(stack, "inference_objective_output_tokens_sum") == out_before + TOKENS


async def test_non_streamed_response_records_usage_and_ttft(stack):
    ttft_before = metric(stack, "inference_objective_request_ttft_seconds_count")
    in_before = metric(stack, "inference_objective_input_tokens_sum")
    body = {"model": "tiny", "prompt": "Tell me about JSON.", "max_tokens": 5}
    async with (
        aiohttp.ClientSession(timeout=TIMEOUT) as session,
        session.post(stack.url + "/v1/completions", json=body) as r,
    ):
        assert r.status == 200
        reply = await r.json()
    await wait_inflight_zero(stack)
    assert metric(stack, "inference_objective_request_ttft_seconds_count") == ttft_before + 1
    # The histogram took the server's own prompt count (usage), not the EPP's estimate.
    expected = in_before + reply["usage"]["prompt_tokens"]
    assert metric(stack, "inference_objective_input_tokens_sum") == expected


MESSAGES = {
    "model": "tiny",
    "max_tokens": 12,
    "system": [{"type": "text", "text": "You answer about streaming."}],
    "messages": [{"role": "user", "content": [{"type": "text", "text": "Tell me."}]}],
}


@pytest.mark.parametrize("streamed", [True, False])
async def test_messages_api_is_measured_like_any_request(stack, streamed):
    """/v1/messages through Envoy: Anthropic's events reach the client unchanged, the EPP
    counts the request in flight until the end, and records TTFT and the server's usage
    (Anthropic's: input + cache reads) like any other request's."""
    ttft_before = metric(stack, "inference_objective_request_ttft_seconds_count")
    in_before = metric(stack, "inference_objective_input_tokens_sum")
    out_before = metric(stack, "inference_objective_output_tokens_sum")
    async with (
        aiohttp.ClientSession(timeout=TIMEOUT) as session,
        session.post(stack.url + "/v1/messages", json={**MESSAGES, "stream": streamed}) as r,
    ):
        assert r.status == 200
        raw = await r.read()
    if streamed:
        names = [ln[7:] for ln in raw.decode().splitlines() if ln.startswith("event: ")]
        assert names[:2] == ["message_start", "content_block_start"]
        assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
        assert names.count("content_block_delta") == 12
        usage = json.loads(events(raw)[-2])["usage"]
    else:
        usage = json.loads(raw)["usage"]
    await wait_inflight_zero(stack)
    prompt = usage["input_tokens"] + usage["cache_read_input_tokens"]
    assert metric(stack, "inference_objective_request_ttft_seconds_count") == ttft_before + 1
    assert metric(stack, "inference_objective_input_tokens_sum") == in_before + prompt
    assert metric(stack, "inference_objective_output_tokens_sum") == out_before + 12


async def test_messages_count_tokens_passes_through(stack):
    body = {k: v for k, v in MESSAGES.items() if k != "max_tokens"}
    async with (
        aiohttp.ClientSession(timeout=TIMEOUT) as session,
        session.post(stack.url + "/v1/messages/count_tokens", json=body) as r,
        session.post(stack.url + "/v1/messages", json=MESSAGES) as full,
    ):
        assert r.status == 200 and full.status == 200
        counted = (await r.json())["input_tokens"]
        usage = (await full.json())["usage"]
    assert counted == usage["input_tokens"] + usage["cache_read_input_tokens"] > 0


async def test_a_malformed_messages_body_gets_anthropics_error_shape(stack):
    async with (
        aiohttp.ClientSession(timeout=TIMEOUT) as session,
        session.post(stack.url + "/v1/messages", json={"model": "tiny", "messages": []}) as r,
    ):
        assert r.status == 400
        reply = await r.json()
    assert reply["type"] == "error"
    assert reply["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in reply["error"]["message"]


async def test_client_disconnect_mid_stream_releases_inflight(stack):
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        r = await session.post(stack.url + "/v1/completions", json=STREAM)
        assert r.status == 200
        await r.content.readany()
        assert inflight(stack) == 1
        r.close()  # drop the connection mid-stream
    await wait_inflight_zero(stack)


async def test_upstream_error_status_passes_through_and_releases_inflight(stack):
    sim = stack.sims[0].url + "/admin"
    set_faults = urllib.request.Request(sim, data=b'{"fail_rate": 1.0}', method="POST")
    urllib.request.urlopen(set_faults, timeout=5).read()
    try:
        async with (
            aiohttp.ClientSession(timeout=TIMEOUT) as session,
            session.post(stack.url + "/v1/completions", json=STREAM) as r,
        ):
            status, body = r.status, await r.read()
    finally:
        reset = urllib.request.Request(sim, data=b'{"fail_rate": 0.0}', method="POST")
        urllib.request.urlopen(reset, timeout=5).read()
    assert status == 500 and b"error" in body
    await wait_inflight_zero(stack)


@pytest.mark.parametrize("path", PATHS)
async def test_upstream_dying_mid_stream_releases_inflight(path):
    with local_stack(path, n_sims=1) as st:
        async with (
            aiohttp.ClientSession(timeout=TIMEOUT) as session,
            session.post(st.url + "/v1/completions", json=STREAM) as r,
        ):
            await r.content.readany()
            assert inflight(st) == 1
            st.kill_sim(0)  # SIGKILL: the upstream connection resets mid-stream
            with pytest.raises(aiohttp.ClientPayloadError):
                await r.read()
        await wait_inflight_zero(st)


async def test_a_request_whose_log_never_comes_is_given_back_after_the_timeout():
    """Envoy without the access log (a config that lost it, or entries lost with a broken
    stream): the EPP still gives the request back, after --response-log-timeout, and
    counts it."""
    with local_stack(
        "log", n_sims=1, epp_args=["--response-log-timeout", "2"],
        envoy_options={"response_log": False},
    ) as st:  # fmt: skip
        async with (
            aiohttp.ClientSession(timeout=TIMEOUT) as session,
            session.post(st.url + "/v1/completions", json={**STREAM, "max_tokens": 4}) as r,
        ):
            assert r.status == 200 and b"[DONE]" in await r.read()
        assert inflight(st) == 1  # the end is not known yet
        await wait_inflight_zero(st)
        text = urllib.request.urlopen(st.epp_metrics_url + "/metrics", timeout=5).read().decode()
        assert 'epp_response_log_entries_total{outcome="expired"} 1.0' in text


async def test_a_response_longer_than_the_timeout_is_kept_alive_by_envoys_periodic_entries():
    """Envoy logs a running request every 5 s: a 12 s response outlives a 7 s timeout, and
    the first such entry after its first token gives the prompt's prefill count back."""
    with local_stack(
        "log", n_sims=1, epp_args=["--response-log-timeout", "7"],
        sim_args=["--decode-ms-per-token", "400", "--prefill-ms-per-token", "0.02"],
    ) as st:  # fmt: skip
        async with (
            aiohttp.ClientSession(timeout=TIMEOUT) as session,
            session.post(st.url + "/v1/completions", json={**STREAM, "max_tokens": 30}) as r,
        ):
            assert r.status == 200
            seen = []
            async for _ in r.content.iter_any():
                url = st.epp_metrics_url + "/debug/endpoints"
                [row] = json.loads(urllib.request.urlopen(url, timeout=5).read())
                seen.append((row["inflight_requests"], row["inflight_prefill_tokens"]))
        # Before the first periodic entry the prompt still counts; after it, only the
        # request (the last reads may come after the end).
        assert seen[0][0] == 1 and seen[0][1] > 0, seen
        assert any(n == 1 and prefill == 0 for n, prefill in seen), seen
        await wait_inflight_zero(st)
        text = urllib.request.urlopen(st.epp_metrics_url + "/metrics", timeout=5).read().decode()
        assert 'epp_response_log_entries_total{outcome="expired"} 0.0' in text
        assert 'epp_response_log_entries_total{outcome="joined"} 1.0' in text
        assert metric(st, "inference_objective_output_tokens_sum") == 30
