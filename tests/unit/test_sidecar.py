"""The sidecar in front of real simulator servers (in-process), and of a recording upstream
where exact bytes matter."""

import asyncio
import contextlib
import dataclasses
import json

import aiohttp
import pytest
from aiohttp import web

from epp.headers import PREFILLER_HOST_PORT as PD
from epp.headers import REQUEST_ID, SIM_SERVER
from epp.sidecar import Sidecar, SidecarOptions
from epp.sim import SimConfig, SimServer

FAST = SimConfig(decode_ms_per_token=1.0, prefill_ms_per_token=0.01)
LONG_PROMPT = "tell me everything about disaggregated serving " * 100  # ~600 tokens


def pd_sim_config(role: str, **extra) -> SimConfig:
    """A simulator in a P/D role (vLLM's NixlConnector behaviour, see epp/sim/pd.py)."""
    return dataclasses.replace(FAST, kv_role=role, **extra)


@contextlib.asynccontextmanager
async def sidecar_for(decode_url: str, *allow: str, **options):
    sc = Sidecar(
        SidecarOptions(decode_url=decode_url, host="127.0.0.1", port=0, allow=allow, **options)
    )
    async with sc:
        yield sc


async def post(url: str, body: dict | bytes, headers: dict | None = None, path="/v1/completions"):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    hdrs = {"content-type": "application/json", **(headers or {})}
    async with aiohttp.ClientSession() as s, s.post(url + path, data=data, headers=hdrs) as r:
        return r.status, dict(r.headers), await r.read()


def sse_events(raw: bytes) -> list[str]:
    return [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]


def sidecar_counts(sc: Sidecar) -> dict[tuple[str, str], float]:
    out = {}
    for metric in sc.metrics.registry.collect():
        for sample in metric.samples:
            if sample.name == "epp_sidecar_requests_total":
                out[(sample.labels["path"], sample.labels["outcome"])] = sample.value
    return out


# ---- without the header: a transparent proxy ------------------------------------------


async def test_without_the_header_requests_reach_the_decode_server_unchanged():
    async with SimServer("dec-0", FAST) as dec, sidecar_for(dec.url) as sc:
        body = {"model": "tiny", "prompt": "hello", "max_tokens": 4, "stream": True}
        status, headers, raw = await post(sc.url, body)
        assert status == 200 and headers[SIM_SERVER] == "dec-0"
        assert headers["Content-Type"] == "text/event-stream"
        events = sse_events(raw)
        assert len(events) == 5 and events[-1] == "[DONE]"
        status, headers, raw = await post(sc.url, {**body, "stream": False})
        assert status == 200 and json.loads(raw)["usage"]["completion_tokens"] == 4
        status, _, raw = await post(sc.url, {"model": "nope", "prompt": "x"})
        assert status == 404 and "nope" in json.loads(raw)["error"]["message"]
        async with aiohttp.ClientSession() as s, s.get(sc.url + "/v1/models") as r:
            assert r.status == 200 and (await r.json())["data"][0]["id"] == "tiny"
        assert dec.stats.requests_received == 3
        assert sidecar_counts(sc)[("/v1/completions", "forwarded")] == 3


async def test_passthrough_is_byte_exact_and_streams_chunk_by_chunk():
    seen: dict = {}
    release = asyncio.Event()

    async def upstream(request: web.Request) -> web.StreamResponse:
        seen.update(
            method=request.method,
            path_qs=request.path_qs,
            body=await request.read(),
            headers={k.lower(): v for k, v in request.headers.items()},
        )
        resp = web.StreamResponse(status=207, headers={"x-up": "1", "content-type": "a/b"})
        await resp.prepare(request)
        await resp.write(b"first")
        await release.wait()
        await resp.write(b"second")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", upstream)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with sidecar_for(f"http://127.0.0.1:{port}") as sc, aiohttp.ClientSession() as s:
            body = b'{"odd":  "spacing" }'
            headers = {
                "authorization": "Bearer t",
                "x-custom": "v",
                PD: "10.0.0.1:1",
            }
            async with s.put(sc.url + "/any/path?q=1", data=body, headers=headers) as r:
                assert r.status == 207 and r.headers["x-up"] == "1"
                assert r.headers["content-type"] == "a/b"
                assert await r.content.readexactly(5) == b"first"  # before the rest exists
                release.set()
                assert await r.read() == b"second"
    finally:
        await runner.cleanup()
    assert seen["method"] == "PUT" and seen["path_qs"] == "/any/path?q=1"
    assert seen["body"] == body
    assert seen["headers"]["authorization"] == "Bearer t" and seen["headers"]["x-custom"] == "v"
    assert PD not in seen["headers"]


# ---- the allowlist ------------------------------------------------------------------------


async def test_a_prefill_server_outside_the_allowlist_gets_403():
    async with SimServer("dec-0", FAST) as dec, sidecar_for(dec.url, "10.0.0.9:8000") as sc:
        body = {"model": "tiny", "prompt": LONG_PROMPT, "max_tokens": 2}
        for value in ("127.0.0.1:1", "10.0.0.9:8001", "not a host"):
            status, headers, raw = await post(sc.url, body, {PD: value})
            assert status == 403 and headers["Content-Type"].startswith("application/json")
            err = json.loads(raw)["error"]
            assert err["type"] == "permission_error" and "allowlist" in err["message"]
        assert dec.stats.requests_received == 0
        assert sidecar_counts(sc)[("/v1/completions", "forbidden")] == 3


# ---- prefill failures --------------------------------------------------------------------


async def test_a_failing_prefill_server_falls_back_to_a_local_decode():
    async with (
        SimServer("pre-0", FAST) as pre,
        SimServer("dec-0", FAST) as dec,
        sidecar_for(dec.url, f"127.0.0.1:{pre.port}") as sc,
    ):
        pre.set_faults(fail_rate=1.0)
        for stream in (False, True):
            body = {"model": "tiny", "prompt": LONG_PROMPT, "max_tokens": 3, "stream": stream}
            status, headers, raw = await post(sc.url, body, {PD: f"127.0.0.1:{pre.port}"})
            assert status == 200 and headers[SIM_SERVER] == "dec-0"
            if stream:
                assert sse_events(raw)[-1] == "[DONE]"
            else:
                assert json.loads(raw)["usage"]["completion_tokens"] == 3
        assert pre.stats.requests_failed == 2
        assert dec.stats.requests_succeeded == 2
        assert sidecar_counts(sc)[("/v1/completions", "prefill_fallback")] == 2


async def test_an_unreachable_or_slow_prefill_server_falls_back():
    async with (
        SimServer("pre-0", FAST) as pre,
        SimServer("dec-0", FAST) as dec,
        sidecar_for(dec.url, "127.0.0.1", prefill_timeout=0.3) as sc,
    ):
        body = {"model": "tiny", "prompt": "x", "max_tokens": 2}
        status, _, _ = await post(sc.url, body, {PD: "127.0.0.1:1"})  # nothing listens
        assert status == 200
        pre.set_faults(delay_ms=5000)
        status, _, _ = await post(sc.url, body, {PD: f"127.0.0.1:{pre.port}"})
        assert status == 200 and dec.stats.requests_succeeded == 2
        assert sidecar_counts(sc)[("/v1/completions", "prefill_fallback")] == 2


async def test_a_prefill_4xx_goes_back_to_the_client():
    async with (
        SimServer("pre-0", dataclasses.replace(FAST, model="other")) as pre,
        SimServer("dec-0", FAST) as dec,
        sidecar_for(dec.url, f"127.0.0.1:{pre.port}") as sc,
    ):
        body = {"model": "tiny", "prompt": "x", "max_tokens": 2}
        status, headers, raw = await post(sc.url, body, {PD: f"127.0.0.1:{pre.port}"})
        assert status == 404 and headers[SIM_SERVER] == "pre-0"
        assert "tiny" in json.loads(raw)["error"]["message"]
        assert dec.stats.requests_received == 0
        assert sidecar_counts(sc)[("/v1/completions", "prefill_rejected")] == 1


# ---- metrics and a missing decode server -------------------------------------------------


async def test_metrics_are_the_decode_servers_plus_the_sidecars():
    async with SimServer("dec-0", FAST) as dec, sidecar_for(dec.url) as sc:
        await post(sc.url, {"model": "tiny", "prompt": "x", "max_tokens": 1})
        async with aiohttp.ClientSession() as s:
            async with s.get(sc.url + "/metrics") as r:
                assert r.status == 200 and r.headers["content-type"].startswith("text/plain")
                text = await r.text()
            async with s.get(sc.url + "/sidecar/metrics") as r:
                own = await r.text()
    assert "vllm:num_requests_waiting" in text
    line = 'epp_sidecar_requests_total{outcome="forwarded",path="/v1/completions"} 1.0'
    assert line in text and line in own and "vllm:" not in own
    for name in (
        "epp_sidecar_prefill_duration_seconds",
        "epp_sidecar_decode_first_byte_seconds",
        "epp_sidecar_decode_duration_seconds",
    ):
        assert f"# TYPE {name} histogram" in own


async def test_without_a_decode_server_requests_get_502_and_metrics_fail():
    async with sidecar_for("http://127.0.0.1:1") as sc:
        status, _, raw = await post(sc.url, {"model": "tiny", "prompt": "x"})
        assert status == 502 and "decode server" in json.loads(raw)["error"]["message"]
        async with aiohttp.ClientSession() as s, s.get(sc.url + "/metrics") as r:
            assert r.status == 502  # so the EPP marks the endpoint unhealthy
        assert sidecar_counts(sc)[("/v1/completions", "decode_error")] == 1


async def test_a_client_that_leaves_mid_stream_stops_the_decode():
    slow = dataclasses.replace(FAST, decode_ms_per_token=50.0)
    async with SimServer("dec-0", slow) as dec, sidecar_for(dec.url) as sc:
        body = {"model": "tiny", "prompt": "x", "max_tokens": 500, "stream": True}
        async with (
            aiohttp.ClientSession() as s,
            s.post(sc.url + "/v1/completions", json=body) as r,
        ):
            await r.content.readline()  # leaving the block closes the connection mid-stream
        for _ in range(100):
            if dec.stats.requests_aborted:
                break
            await asyncio.sleep(0.05)
        assert dec.stats.requests_aborted == 1
        assert dec.engine.snapshot().running == 0


# ---- the remote prefill protocol on P/D simulators ---------------------------------------


@contextlib.asynccontextmanager
async def pd_pair(**decode_extra):
    async with (
        SimServer("pre-0", pd_sim_config("prefill")) as pre,
        SimServer("dec-0", pd_sim_config("decode", **decode_extra)) as dec,
        sidecar_for(dec.url, f"127.0.0.1:{pre.port}") as sc,
    ):
        yield pre, dec, sc


@pytest.mark.parametrize("stream", [False, True])
async def test_a_long_prompt_is_prefilled_remotely_then_decoded_here(stream):
    async with pd_pair() as (pre, dec, sc):
        body = {"model": "tiny", "prompt": LONG_PROMPT, "max_tokens": 5, "stream": stream}
        # Warm the prefill server's prefix cache only: it will report cached tokens that
        # the cold decode server would not.
        warm = {**body, "stream": False, "max_tokens": 1}
        warm["kv_transfer_params"] = {"do_remote_decode": True}
        status, _, raw = await post(pre.url, warm)
        assert status == 200
        if stream:
            body["stream_options"] = {"include_usage": True}
        status, headers, raw = await post(sc.url, body, {PD: f"127.0.0.1:{pre.port}"})
        assert status == 200 and headers[SIM_SERVER] == "dec-0"
        if stream:
            events = sse_events(raw)
            assert events[-1] == "[DONE]"
            usage = json.loads(events[-2])["usage"]
            assert len(events) == 5 + 2  # five tokens, the usage chunk, [DONE]
        else:
            usage = json.loads(raw)["usage"]
        assert usage["completion_tokens"] == 5
        # The prefill server did one more prefill-only request for a remote decoder ...
        pre_stats = pre.admin_state()["stats"]
        assert pre_stats["requests_received"] == 2
        assert pre_stats["completion_tokens"] == 2  # max_tokens 1, twice
        assert pre_stats["kv_transfer"]["do_remote_decode"] == 2
        # ... and the decode server continued from the transferred KV.
        dec_stats = dec.admin_state()["stats"]
        assert dec_stats["kv_transfer"] == {
            "do_remote_decode": 0,
            "do_remote_prefill": 1,
            "other": 0,
        }
        assert dec_stats["completion_tokens"] == 5 and dec_stats["cached_tokens"] == 0
        # cached_tokens is what the prefill server reported, not the decoder's own count.
        prefill_cached = pre_stats["cached_tokens"]
        assert prefill_cached > 500
        assert usage["prompt_tokens_details"]["cached_tokens"] == prefill_cached
        assert sidecar_counts(sc)[("/v1/completions", "prefill_decode")] == 1


@contextlib.asynccontextmanager
async def recorder(answer: dict):
    """An upstream that records (body, x-request-id) of each POST and answers `answer`."""
    seen: list[tuple[dict, str]] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append((await request.json(), request.headers.get(REQUEST_ID, "")))
        return web.json_response(answer)

    app = web.Application()
    app.router.add_post("/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"127.0.0.1:{runner.addresses[0][1]}", seen
    finally:
        await runner.cleanup()


async def test_both_legs_exactly_and_one_request_id():
    handle = {"do_remote_prefill": True, "remote_block_ids": [3], "remote_port": 1}
    cached_7 = {"prompt_tokens_details": {"cached_tokens": 7}}
    prefill_answer = {"kv_transfer_params": handle, "usage": cached_7}
    decode_answer = {"choices": [], "usage": {"prompt_tokens": 9}}
    async with (
        recorder(prefill_answer) as (prefill, prefill_seen),
        recorder(decode_answer) as (decode, decode_seen),
        sidecar_for(f"http://{decode}", prefill) as sc,
    ):
        body = {"model": "m", "prompt": "p", "stream": False, "stream_options": {"x": 1}}
        status, _, raw = await post(sc.url, body, {PD: prefill})
        chat = {"model": "m", "messages": [{"role": "user", "content": "c"}], "max_tokens": 9}
        await post(
            sc.url,
            chat,
            {PD: prefill, REQUEST_ID: "cid"},
            path="/v1/chat/completions",
        )
    assert status == 200
    (p1, p1_id), (p2, p2_id) = prefill_seen
    (d1, d1_id), (d2, d2_id) = decode_seen
    assert p1 == {
        "model": "m",
        "prompt": "p",
        "stream": False,
        "max_tokens": 1,
        "max_completion_tokens": 1,
        "kv_transfer_params": {
            "do_remote_decode": True,
            "do_remote_prefill": False,
            "remote_engine_id": None,
            "remote_block_ids": None,
            "remote_host": None,
            "remote_port": None,
        },
    }
    assert d1 == {**body, "kv_transfer_params": handle}  # the client's fields as sent
    assert d2 == {**chat, "kv_transfer_params": handle}
    assert p2["max_tokens"] == p2["max_completion_tokens"] == 1
    assert p1_id and p1_id == d1_id  # generated once, shared by both legs
    assert p2_id == d2_id == "cid"
    assert json.loads(raw)["usage"] == {"prompt_tokens": 9, **cached_7}


async def test_chat_goes_through_the_same_two_legs():
    async with pd_pair() as (pre, dec, sc):
        body = {
            "model": "tiny",
            "messages": [{"role": "user", "content": LONG_PROMPT}],
            "max_completion_tokens": 3,
        }
        status, _, raw = await post(
            sc.url,
            body,
            {PD: f"127.0.0.1:{pre.port}"},
            path="/v1/chat/completions",
        )
        assert status == 200 and json.loads(raw)["usage"]["completion_tokens"] == 3
        assert pre.admin_state()["stats"]["kv_transfer"]["do_remote_decode"] == 1
        assert dec.admin_state()["stats"]["kv_transfer"]["do_remote_prefill"] == 1


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--allow", "http://10.0.0.1"], "expected HOST:PORT or HOST"),
        (["--allow-from-endpoints", "/nonexistent/pool.yaml"], "cannot read the file"),
        (["--prefill-timeout", "0"], "--prefill-timeout must be > 0"),
        (["--decode-url", "127.0.0.1:8001"], "must start with http://"),
    ],
)
def test_sidecar_cli_refuses_bad_flags_before_serving(flags, message):
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "epp.cli", "sidecar", "--port", "0", *flags],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2 and message in r.stderr, r.stderr
