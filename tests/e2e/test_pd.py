"""P/D end to end: a real Envoy, `epp serve --config config/pd-disagg.yaml`, two prefill and
two decode simulator processes, each decode simulator behind an `epp sidecar` process."""

import json
import re
import urllib.request
import uuid

import aiohttp
import pytest

from epp.harness.localstack import LocalStack, PDLayout
from epp.headers import PREFILLER_HOST_PORT as PD
from tests.e2e.client import send, sim_prefix

pytestmark = pytest.mark.e2e

SIM_ARGS = ["--max-num-seqs", "4", "--decode-ms-per-token", "2", "--prefill-ms-per-token", "0.02"]


@pytest.fixture(scope="module")
def pd_stack():
    with LocalStack(sim_args=SIM_ARGS, pd=PDLayout(n_prefill=2, n_decode=2)) as st:
        yield st


def long_prompt() -> str:
    """~1,500 tokens nobody has sent before (so nothing is cached anywhere)."""
    return f"{uuid.uuid4()} " + " ".join(f"fact{i} about disaggregation." for i in range(1000))


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def stats(stack) -> dict[str, dict]:
    return {s.name: get_json(s.url + "/admin")["stats"] for s in stack.sims}


def kv_count(stat: dict, kind: str) -> int:
    return int(stat.get("kv_transfer", {}).get(kind, 0))


def decisions(stack) -> dict[str, float]:
    text = urllib.request.urlopen(stack.epp_metrics_url + "/metrics", timeout=5).read().decode()
    pattern = r'^inference_extension_disagg_decisions_total\{decision_type="([^"]+)"\} (\S+)$'
    return {m[1]: float(m[2]) for m in re.finditer(pattern, text, re.MULTILINE)}


def changed(before: dict[str, dict], after: dict[str, dict], key: str) -> dict[str, int]:
    out = {}
    for name in after:
        d = after[name][key] - before[name][key] if key in after[name] else 0
        if d:
            out[name] = d
    return out


async def post(stack, body: dict, headers: dict | None = None, path="/v1/completions"):
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
        return await send(s, stack.url, body, path=path, headers=headers)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_long_prompt_is_prefilled_on_a_prefill_server_and_decoded_on_a_decode_server(
    pd_stack, stream
):
    before, d0 = stats(pd_stack), decisions(pd_stack)
    body = {"model": "tiny", "prompt": long_prompt(), "max_tokens": 6, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    r = await post(pd_stack, body)
    assert r.status == 200, r.body
    decoder = sim_prefix(r.server)
    assert decoder is not None and decoder.startswith("decode-")
    after = stats(pd_stack)
    # One prefill server did one request of one token, asked to keep the KV for a decoder.
    received = changed(before, after, "requests_received")
    prefillers = [n for n in received if n.startswith("prefill-")]
    assert len(prefillers) == 1 and received[prefillers[0]] == 1
    assert changed(before, after, "completion_tokens")[prefillers[0]] == 1  # max_tokens 1
    p = prefillers[0]
    assert kv_count(after[p], "do_remote_decode") - kv_count(before[p], "do_remote_decode") == 1
    # The decode server that answered continued from the transferred KV.
    assert received[decoder] == 1
    transferred = kv_count(after[decoder], "do_remote_prefill")
    assert transferred - kv_count(before[decoder], "do_remote_prefill") == 1
    if stream:
        events = [x[6:] for x in r.body.decode().splitlines() if x.startswith("data: ")]
        assert events[-1] == "[DONE]" and json.loads(events[-2])["usage"]["completion_tokens"] == 6
    else:
        assert r.json()["usage"]["completion_tokens"] == 6
    d1 = decisions(pd_stack)
    assert d1["prefill-decode"] - d0["prefill-decode"] == 1
    assert d1["decode-only"] == d0["decode-only"]


async def test_a_short_prompt_stays_decode_only(pd_stack):
    before, d0 = stats(pd_stack), decisions(pd_stack)
    r = await post(pd_stack, {"model": "tiny", "prompt": "Say hi.", "max_tokens": 3})
    assert r.status == 200 and sim_prefix(r.server).startswith("decode-")
    received = changed(before, stats(pd_stack), "requests_received")
    assert received == {sim_prefix(r.server): 1}
    assert decisions(pd_stack)["decode-only"] - d0["decode-only"] == 1


async def test_a_cached_long_prompt_stays_on_its_decoder_without_a_remote_prefill(pd_stack):
    body = {"model": "tiny", "prompt": long_prompt(), "max_tokens": 3}
    d_first = decisions(pd_stack)
    first = await post(pd_stack, body)
    assert first.status == 200
    before, d0 = stats(pd_stack), decisions(pd_stack)
    assert d0["prefill-decode"] - d_first["prefill-decode"] == 1  # new: disaggregated
    again = await post(pd_stack, body)
    assert again.status == 200 and again.server == first.server
    assert changed(before, stats(pd_stack), "requests_received") == {sim_prefix(again.server): 1}
    assert decisions(pd_stack)["decode-only"] - d0["decode-only"] == 1


async def test_a_client_sent_prefiller_header_is_never_honoured(pd_stack):
    prefill = next(s for s in pd_stack.sims if s.name == "prefill-0")
    # A short prompt naming a prefill server: the EPP removes the header, no remote prefill.
    before = stats(pd_stack)
    r = await post(
        pd_stack,
        {"model": "tiny", "prompt": "hi", "max_tokens": 2},
        {PD: prefill.hostport},
    )
    assert r.status == 200
    received = changed(before, stats(pd_stack), "requests_received")
    assert not any(n.startswith("prefill-") for n in received)
    # A long prompt naming a closed port: the EPP's own header replaces it.
    before = stats(pd_stack)
    body = {"model": "tiny", "prompt": long_prompt(), "max_tokens": 2}
    r = await post(pd_stack, body, {PD: "127.0.0.1:1"})
    assert r.status == 200
    received = changed(before, stats(pd_stack), "requests_received")
    assert sum(v for n, v in received.items() if n.startswith("prefill-")) == 1


async def test_a_failing_prefill_server_leads_to_a_local_decode_and_a_200(pd_stack):
    prefills = [s for s in pd_stack.sims if s.name.startswith("prefill-")]
    async with aiohttp.ClientSession() as s:
        for sim in prefills:
            async with s.post(sim.url + "/admin", json={"fail_rate": 1.0}) as r:
                assert r.status == 200
        try:
            before = stats(pd_stack)
            body = {"model": "tiny", "prompt": long_prompt(), "max_tokens": 4, "stream": True}
            r = await post(pd_stack, body)
        finally:
            for sim in prefills:
                async with s.post(sim.url + "/admin", json={"fail_rate": 0.0}) as resp:
                    assert resp.status == 200
    assert r.status == 200 and r.body.decode().rstrip().endswith("data: [DONE]")
    after = stats(pd_stack)
    assert sum(changed(before, after, "requests_failed").values()) == 1
    decoder = sim_prefix(r.server)
    assert changed(before, after, "requests_succeeded")[decoder] == 1
    assert kv_count(after[decoder], "do_remote_prefill") == kv_count(
        before[decoder], "do_remote_prefill"
    )


async def test_the_sidecar_refuses_a_prefill_server_outside_the_pool(pd_stack):
    sidecar = pd_stack.sidecars[0]
    async with aiohttp.ClientSession() as s:
        body = {"model": "tiny", "prompt": long_prompt(), "max_tokens": 2}
        r = await send(s, sidecar.url, body, headers={PD: "10.255.0.1:8000"})
        assert r.status == 403
        assert r.json()["error"]["type"] == "permission_error"
        async with s.get(sidecar.url + "/sidecar/metrics") as m:
            text = await m.text()
    assert 'epp_sidecar_requests_total{outcome="forbidden",path="/v1/completions"} 1.0' in text


def test_demo_pd_prints_the_table_and_splits_requests():
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "epp.cli", "demo", "--pd", "--requests", "40", "--concurrency", "6"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "endpoint   requests" in out and "remote prefills" in out
    for name in ("decode-0", "decode-1", "prefill-0", "prefill-1"):
        assert name in out
    verdict = re.search(
        r"verdict: OK: 40/40 requests succeeded; the EPP sent (\d+) .* kept (\d+)", out
    )
    assert verdict is not None, out
    assert int(verdict[1]) > 0 and int(verdict[2]) > 0  # long prompts split, short ones local
