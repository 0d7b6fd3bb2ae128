"""Prefix indexes: per-request `produce` latency with full indexes, and their memory.

Run: `.venv/bin/python bench/prefix_index.py` (about a minute on a 2-core machine).

- approximate (`approx-prefix-cache-producer`, upstream defaults: 16-token = 64-character
  blocks, 256 blocks matched, 31,250 blocks per endpoint): `produce` for a 4K-token
  prompt (16,384 characters = 256 blocks, the first half held by one endpoint) with 8
  and 16 endpoints each holding 31,250 distinct blocks; then, in a fresh process, the
  RSS growth of building 16 × 31,250 blocks (target: under 150 MB).
- precise (`precise-prefix-cache-producer`, simple tokenizer, 16-token blocks): the same
  prompt as token ids, with 16 endpoints × 31,250 blocks stored through KV events; its
  `produce` includes tokenizing the prompt.

Blocks are filled as real traffic would: chains of 250 blocks, 125 per endpoint.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import subprocess
import sys
import time

from epp.composition import install_plugins
from epp.config.params import parse_params
from epp.datalayer.kv_decode import BlockStored
from epp.datastore import Endpoint, EndpointMetrics, EndpointSnapshot
from epp.headers import REQUEST_ID
from epp.request import new_request, parse_body
from epp.scheduling.registry import Handle
from epp.scheduling.types import CycleState

BLOCKS_PER_ENDPOINT = 31_250
CHAIN = 250
PROMPT_TOKENS = 4096


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def snapshots(n: int) -> list[EndpointSnapshot]:
    return [
        EndpointSnapshot(Endpoint(f"ep-{i}", f"10.0.{i // 256}.{i % 256}", 8000), EndpointMetrics())
        for i in range(n)
    ]


def prompt(rng: random.Random, tokens: bool = False) -> str:
    """4K tokens: 4,096 words (one simple-tokenizer token each) or, for the character
    blocks, 16,384 characters (upstream's 4 characters per token)."""
    text = " ".join(f"w{rng.randrange(100_000)}" for _ in range(PROMPT_TOKENS))
    return text if tokens else text[: PROMPT_TOKENS * 4]


def request(text: str):
    body = json.dumps({"model": "m", "prompt": text}).encode()
    return parse_body(new_request({REQUEST_ID: "r"}, "/v1/completions", "POST"), body)


def build(type_name: str, params: dict | None = None):
    spec = install_plugins().lookup(type_name)
    assert spec is not None
    return spec.build("bench", parse_params(spec.params, params), Handle(rng=random.Random(0)))


def fill_approx(prod, n: int, rng: random.Random) -> None:
    for i in range(n):
        for _ in range(BLOCKS_PER_ENDPOINT // CHAIN):
            prod.index.add(f"ep-{i}", [rng.getrandbits(64) for _ in range(CHAIN)])


def fill_precise(prod, n: int, rng: random.Random) -> None:
    for i in range(n):
        for c in range(BLOCKS_PER_ENDPOINT // CHAIN):
            tokens = [rng.randrange(50_000) for _ in range(CHAIN * 16)]
            hashes = [(i << 40) + (c << 16) + k for k in range(CHAIN)]
            prod.index.apply(f"ep-{i}", "m", [BlockStored(hashes, None, tokens, 16)])


def timed(prod, req, snaps: list[EndpointSnapshot], iterations: int) -> dict[str, float]:
    samples = []
    gc.collect()
    for _ in range(iterations):
        state = CycleState()
        t0 = time.perf_counter()
        prod.produce(state, req, snaps)
        samples.append(time.perf_counter() - t0)
    samples.sort()
    return {
        "p50_ms": round(samples[len(samples) // 2] * 1e3, 3),
        "p90_ms": round(samples[int(len(samples) * 0.9)] * 1e3, 3),
        "p99_ms": round(samples[int(len(samples) * 0.99)] * 1e3, 3),
        "mean_ms": round(statistics.fmean(samples) * 1e3, 3),
    }


def approx_latency(n: int, iterations: int, tokenizer: str | None = None) -> dict:
    rng = random.Random(n)
    prod = build("approx-prefix-cache-producer", {"tokenizer": tokenizer} if tokenizer else {})
    fill_approx(prod, n, rng)
    req = request(prompt(rng, tokens=tokenizer is not None))
    block = prod.block_size(snapshots(n))
    hashes = prod.hashes(req, block)
    prod.index.add("ep-0", hashes[: len(hashes) // 2])  # half the prompt cached on ep-0
    snaps = snapshots(n)
    info = prod.produce(CycleState(), req, snaps)
    return {
        "endpoints": n,
        "tokenizer": tokenizer or "none (characters)",
        "index_entries": prod.index.size,
        "prompt_blocks": info.total_blocks,
        "ep-0_score": round(info.score("ep-0"), 3),
        **timed(prod, req, snaps, iterations),
    }


def precise_latency(n: int, iterations: int) -> dict:
    rng = random.Random(n)
    prod = build("precise-prefix-cache-producer", {"blockSizeTokens": 16})
    fill_precise(prod, n, rng)
    req = request(prompt(rng, tokens=True))
    ids = prod.tokenizer.encode(req.prompt_text)
    half = (len(ids) // 32) * 16
    prod.index.apply("ep-0", "m", [BlockStored(list(range(half // 16)), None, ids[:half], 16)])
    snaps = snapshots(n)
    info = prod.produce(CycleState(), req, snaps)
    t0 = time.perf_counter()
    for _ in range(50):
        prod.tokenizer.encode(req.prompt_text)
    tokenize_ms = (time.perf_counter() - t0) / 50 * 1e3
    return {
        "endpoints": n,
        "index_blocks": sum(prod.index.size(s.name) for s in snaps),
        "prompt_tokens": len(ids),
        "prompt_blocks": info.total_blocks,
        "ep-0_score": round(info.score("ep-0"), 3),
        "tokenize_ms": round(tokenize_ms, 3),
        **timed(prod, req, snaps, iterations),
    }


def memory(kind: str, n: int) -> dict:
    """Run in a fresh process so earlier allocations do not hide the growth."""
    gc.collect()
    before = rss_mb()
    rng = random.Random(0)
    if kind == "approx":
        prod = build("approx-prefix-cache-producer")
        fill_approx(prod, n, rng)
        entries = prod.index.size
    else:
        prod = build("precise-prefix-cache-producer", {"blockSizeTokens": 16})
        fill_precise(prod, n, rng)
        entries = sum(prod.index.size(f"ep-{i}") for i in range(n))
    gc.collect()
    after = rss_mb()
    return {
        "index": kind,
        "endpoints": n,
        "entries": entries,
        "rss_before_mb": round(before, 1),
        "rss_after_mb": round(after, 1),
        "index_rss_mb": round(after - before, 1),
        "bytes_per_entry": round((after - before) * 2**20 / max(1, entries)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=2000)
    ap.add_argument("--memory-only", choices=("approx", "precise"))
    args = ap.parse_args()
    if args.memory_only:
        print(json.dumps(memory(args.memory_only, 16)))
        return
    for n in (8, 16):
        print(json.dumps({"approx": approx_latency(n, args.iterations)}))
    print(json.dumps({"approx": approx_latency(16, args.iterations, tokenizer="simple")}))
    print(json.dumps({"precise": precise_latency(16, args.iterations // 4)}))
    for kind in ("approx", "precise"):
        out = subprocess.run(
            [sys.executable, __file__, "--memory-only", kind],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        print(json.dumps({"memory": json.loads(out)}))


if __name__ == "__main__":
    main()
