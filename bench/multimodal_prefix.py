"""Predicted against actual prefix-cache hits when requests share text and differ in images.

One `epp sim` server (prefix caching on, block size 16, the simple tokenizer) applies
vLLM's multimodal block-hash rule: a block holding an image's placeholder tokens is keyed
with ("mm", identifier, offset) (`vllm/v1/core/kv_cache_utils.py`). A sequence of
requests, each a short system prompt, then one of `--images` distinct images (each sent
twice, shuffled), then the same long question and a short tail, goes to it one at a time,
every other one over Anthropic's Messages API (an `image` block; vLLM converts it to the
same chat prompt). Before each request the approximate prefix producer (tokenizer
"simple", the sim's block size) predicts the hit on that server two ways:

- before: the request as the EPP saw it before this change: a chat request with its
  image parts dropped from the text (as `epp.request` used to do), a Messages request
  not parsed at all (no prompt: no prediction);
- after: the request as it is (`epp.media`: each image's digest at its place).

The server's `usage.prompt_tokens_details.cached_tokens` is the actual hit. Over-predicted
tokens are the sum of (predicted − actual) where positive: the cache the router believes
in and the server does not have.

    .venv/bin/python bench/multimodal_prefix.py [--images 12] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import random
import sys
from pathlib import Path

import aiohttp

from bench.results import Result
from epp.datastore import Endpoint, EndpointMetrics, EndpointSnapshot
from epp.harness.procs import HttpReady, ProcessGroup, free_port
from epp.request import new_request, parse_body
from epp.scheduling.registry import Handle
from epp.scheduling.types import CycleState, ProfileResult, SchedulingResult
from plugins.prefix.approx_producer import ApproxPrefixCacheProducer, ApproxPrefixParams
from plugins.prefix.match_info import PREFIX_MATCH_KEY

BLOCK = 16
QUESTION = (
    "You are looking at a photograph taken by a field engineer during a routine inspection "
    "of a cell tower. Describe any visible corrosion, loose cabling or damaged mounts, and "
    "say which of them needs attention before the next storm season. "
)


def image(i: int) -> str:
    """A distinct inline image payload (bytes that differ per image)."""
    raw = f"PNG-{i:04d}-".encode() * 40
    return "data:image/png;base64," + base64.b64encode(raw).decode()


def body(i: int, tail: str) -> dict:
    return {
        "model": "tiny",
        "max_tokens": 1,
        "messages": [
            {"role": "system", "content": "You inspect photographs for a telecom operator."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Here is the picture: "},
                    {"type": "image_url", "image_url": {"url": image(i)}},
                    {"type": "text", "text": QUESTION * 2 + tail},
                ],
            },
        ],
    }


def as_messages(b: dict) -> dict:
    """The same request over Anthropic's Messages API (a base64 image block)."""
    system, user = b["messages"]
    blocks = []
    for part in user["content"]:
        if part["type"] == "text":
            blocks.append(part)
        else:
            media, _, data = part["image_url"]["url"][5:].partition(";base64,")
            source = {"type": "base64", "media_type": media, "data": data}
            blocks.append({"type": "image", "source": source})
    return {
        "model": b["model"],
        "max_tokens": b["max_tokens"],
        "system": system["content"],
        "messages": [{"role": "user", "content": blocks}],
    }


def without_media(b: dict) -> dict:
    """The body as the EPP's text rendering saw it before media items entered it."""
    out = json.loads(json.dumps(b))
    for m in out["messages"]:
        if isinstance(m["content"], list):
            m["content"] = [p for p in m["content"] if p["type"] == "text"]
    return out


class Predictor:
    def __init__(self, snap: EndpointSnapshot) -> None:
        self.snap = snap
        handle = Handle(rng=random.Random(0), pool=lambda: [snap.endpoint])
        params = ApproxPrefixParams(block_size_tokens=BLOCK, tokenizer="simple", auto_tune=False)
        self.producer = ApproxPrefixCacheProducer("approx", params, handle)

    def predict_and_record(self, b: dict, path: str) -> int:
        req = parse_body(new_request({}, path, "POST"), json.dumps(b).encode())
        state = CycleState()
        info = self.producer.produce(state, req, [self.snap])
        state.write(PREFIX_MATCH_KEY, info)
        result = SchedulingResult({"p": ProfileResult([self.snap])}, "p", cycle_state=state)
        self.producer.pre_request(req, result)
        return info.cached_tokens(self.snap.name)


async def run(images: int, seed: int) -> dict:
    rng = random.Random(seed)
    order = [i for i in range(images) for _ in range(2)]
    rng.shuffle(order)
    tails = ["What needs fixing first?", "Anything urgent?", "Summarise in one line."]
    with ProcessGroup() as pg:
        port = free_port()
        argv = [
            sys.executable, "-m", "epp.cli", "sim", "--port", str(port),
            "--block-size", str(BLOCK), "--enable-prefix-caching", "--num-gpu-blocks", "100000",
        ]  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        pg.start("sim", argv, ready=HttpReady(f"{url}/health"), timeout=60)
        snap = EndpointSnapshot(Endpoint("sim", "127.0.0.1", port), EndpointMetrics())
        before, after = Predictor(snap), Predictor(snap)
        rows = []
        async with aiohttp.ClientSession() as http:
            for n, i in enumerate(order):
                b = body(i, rng.choice(tails))
                path = "/v1/chat/completions"
                if n % 2:  # every other request over the Messages API
                    b, path = as_messages(b), "/v1/messages"
                # before: chat had its images dropped; /v1/messages was not parsed at all
                # (no prompt, no prefix: placed on load alone)
                p_before = 0 if n % 2 else before.predict_and_record(without_media(b), path)
                p_after = after.predict_and_record(b, path)
                async with http.post(url + path, json=b) as r:
                    assert r.status == 200, await r.text()
                    usage = (await r.json())["usage"]
                if path == "/v1/messages":  # Anthropic's: input net of cache reads
                    actual = usage["cache_read_input_tokens"]
                    prompt = usage["input_tokens"] + actual
                else:
                    actual = usage["prompt_tokens_details"]["cached_tokens"]
                    prompt = usage["prompt_tokens"]
                rows.append((n, i, prompt, actual, p_before, p_after))
    return {"rows": rows}


def summarise(rows: list[tuple]) -> dict:
    actual = sum(r[3] for r in rows)
    out = {"requests": len(rows), "prompt_tokens": sum(r[2] for r in rows), "actual": actual}
    for k, col in (("before", 4), ("after", 5)):
        over = sum(max(0, r[col] - r[3]) for r in rows)
        under = sum(max(0, r[3] - r[col]) for r in rows)
        exact = sum(1 for r in rows if r[col] == r[3])
        out[k] = {"predicted": sum(r[col] for r in rows), "over": over, "under": under,
                  "exact_requests": exact}  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()
    result = asyncio.run(run(args.images, args.seed))
    s = summarise(result["rows"])
    print(json.dumps(s, indent=1))
    if args.json_out:
        cols = ["when", "predicted cached tokens", "server's cached tokens", "over-predicted",
                "under-predicted", "requests predicted exactly"]  # fmt: skip
        rows = [
            [k, s[k]["predicted"], s["actual"], s[k]["over"], s[k]["under"],
             f"{s[k]['exact_requests']}/{s['requests']}"]
            for k in ("before", "after")
        ]  # fmt: skip
        doc = Result.measured(
            "multimodal_prefix",
            "Approximate prefix index vs the server's hits: shared text, different images",
            f".venv/bin/python bench/multimodal_prefix.py --images {args.images}",
            cols,
            rows,
            (
                f"{s['requests']} requests, half chat and half Messages ({args.images} images, "
                "each sent twice, shuffled), sharing a long question, to one `epp sim` "
                "that keys image "
                'blocks as vLLM does (`("mm", identifier, offset)` extra keys). Before: the '
                "EPP dropped image parts from the text it hashes, so chat requests predicted "
                "a hit through the image and beyond, and it did not parse /v1/messages "
                "(no prediction at all). After: each image's "
                "digest enters the chain at its place, so the prediction stops where the "
                "server's hit stops, and identical images share. Target (predicted = actual): "
                + ("met." if s["after"]["over"] == 0 and s["after"]["under"] == 0 else "missed.")
            ),
        ).to_json()
        args.json_out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
