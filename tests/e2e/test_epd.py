"""Encode/prefill/decode end to end: a real Envoy, `epp serve --config config/epd.yaml`, two
encode-role simulators (`--ec-role encode`) and a decode simulator behind an `epp sidecar`,
which sends a request's media to the encoder named in x-encoder-hosts-ports first."""

import json
import urllib.request
import uuid
from pathlib import Path

import aiohttp
import pytest

from epp.harness.localstack import LocalStack, PDLayout
from epp.headers import ENCODER_HOSTS_PORTS
from tests.e2e.client import send, sim_prefix

pytestmark = pytest.mark.e2e

EPD_CONFIG = Path(__file__).resolve().parents[2] / "config" / "epd.yaml"
SIM_ARGS = ["--max-num-seqs", "4", "--decode-ms-per-token", "2"]


@pytest.fixture(scope="module")
def epd_stack():
    layout = PDLayout(
        n_prefill=0,
        n_decode=1,
        n_encode=2,
        encode_args=["--encode-ms-per-item", "5"],
        config=EPD_CONFIG,
    )
    with LocalStack(sim_args=SIM_ARGS, pd=layout) as st:
        yield st


def image() -> str:
    """Inline bytes nobody has sent before (an identifier no encoder holds yet)."""
    return "data:image/png;base64," + uuid.uuid4().hex.upper()


def stats(stack) -> dict[str, dict]:
    out = {}
    for s in stack.sims:
        with urllib.request.urlopen(s.url + "/admin", timeout=5) as r:
            out[s.name] = json.loads(r.read())["stats"]
    return out


def changed(before, after, key: str) -> dict[str, int]:
    return {n: after[n][key] - before[n][key] for n in after if after[n][key] != before[n][key]}


async def post(stack, body: dict, path: str, headers: dict | None = None):
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
        return await send(s, stack.url, body, path=path, headers=headers)


def chat(url: str | None, text: str = "What is in the picture?") -> dict:
    parts: list[dict] = [{"type": "text", "text": text}]
    if url:
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": parts}]}


async def test_media_is_encoded_on_an_encode_server_and_comes_back_to_it(epd_stack):
    url = image()
    before = stats(epd_stack)
    r = await post(epd_stack, chat(url), "/v1/chat/completions")
    assert r.status == 200, r.body
    assert sim_prefix(r.server) == "decode-0"
    after = stats(epd_stack)
    received = changed(before, after, "requests_received")
    encoders = [n for n in received if n.startswith("encode-")]
    assert len(encoders) == 1 and received == {encoders[0]: 1, "decode-0": 1}
    assert changed(before, after, "mm_items_encoded") == {encoders[0]: 1}
    # The same image over the Messages API, streamed: the same encoder, from its cache.
    data = url.partition(",")[2]
    body = {
        "model": "tiny",
        "max_tokens": 4,
        "stream": True,
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": data},
                    },
                    {"type": "text", "text": "And now?"},
                ],
            }
        ],
    }
    before = after
    r = await post(epd_stack, body, "/v1/messages")
    assert r.status == 200, r.body
    assert b"message_stop" in r.body
    after = stats(epd_stack)
    assert changed(before, after, "requests_received") == {encoders[0]: 1, "decode-0": 1}
    assert changed(before, after, "encoder_cache_hits") == {encoders[0]: 1}
    assert changed(before, after, "mm_items_encoded") == {}


async def test_a_text_request_never_reaches_an_encoder_even_naming_one(epd_stack):
    encoder = next(s for s in epd_stack.sims if s.name == "encode-0")
    before = stats(epd_stack)
    r = await post(
        epd_stack, chat(None), "/v1/chat/completions", {ENCODER_HOSTS_PORTS: encoder.hostport}
    )
    assert r.status == 200, r.body
    assert changed(before, stats(epd_stack), "requests_received") == {"decode-0": 1}


async def test_each_image_returns_to_the_encoder_that_encoded_it(epd_stack):
    urls = [image() for _ in range(6)]
    first = {}
    for u in urls:
        before = stats(epd_stack)
        r = await post(epd_stack, chat(u), "/v1/chat/completions")
        assert r.status == 200
        (first[u],) = [n for n in changed(before, stats(epd_stack), "mm_items_encoded")]
    for u in urls:
        before = stats(epd_stack)
        r = await post(epd_stack, chat(u, "Once more."), "/v1/chat/completions")
        assert r.status == 200
        assert changed(before, stats(epd_stack), "encoder_cache_hits") == {first[u]: 1}
