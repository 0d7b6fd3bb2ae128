"""A weighted InferenceModelRewrite's split through real Envoy: `--requests` requests for
`llama` with random `x-request-id`s, rewritten 90/10 (`--weights`) to `llama-v1` /
`llama-v2`, each served by its own `epp sim`; the share each target got (from the model
the server answered as), against its weight; then `--retries` of those ids sent again,
and how many kept their target (all should: the pick hashes the request id).

    .venv/bin/python bench/rewrite_split.py [--requests 10000] [--results FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path

import aiohttp

from epp.harness.localstack import LocalStack

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script
from bench.results import Result, command_line, load_span

ROOT = Path(__file__).resolve().parents[1]

MANIFEST = """apiVersion: llm-d.ai/v1alpha2
kind: InferenceModelRewrite
metadata: {{name: llama-canary}}
spec:
  poolRef: {{group: inference.networking.k8s.io, name: default}}
  rules:
  - matches: [{{model: {{type: Exact, value: llama}}}}]
    targets:
    - {{modelRewrite: llama-v1, weight: {w1}}}
    - {{modelRewrite: llama-v2, weight: {w2}}}
"""


async def run(url: str, ids: list[str], concurrency: int) -> list[str]:
    sem = asyncio.Semaphore(concurrency)
    body = {"model": "llama", "prompt": "hello", "max_tokens": 1}
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(
        timeout=timeout, connector=aiohttp.TCPConnector(limit=0)
    ) as http:

        async def one(rid: str) -> str:
            async with (
                sem,
                http.post(url + "/v1/completions", json=body, headers={"x-request-id": rid}) as r,
            ):
                data = json.loads(await r.read())
                return data.get("model", f"status {r.status}")

        return await asyncio.gather(*(one(rid) for rid in ids))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=10_000)
    p.add_argument("--retries", type=int, default=1000)
    p.add_argument("--weights", default="90,10")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--results", default="")
    a = p.parse_args()
    w1, w2 = (int(x) for x in a.weights.split(","))
    rng = random.Random(a.seed)
    ids = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(a.requests)]
    sim = ["--max-num-seqs", "64", "--decode-ms-per-token", "1", "--prefill-ms-per-token", "0"]
    per_sim = {0: ["--model", "llama-v1"], 1: ["--model", "llama-v2"]}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as d:
        manifest = Path(d) / "rewrite.yaml"
        manifest.write_text(MANIFEST.format(w1=w1, w2=w2))
        args = ["--model-rewrites", str(manifest)]
        with LocalStack(n_sims=2, sim_args=sim, per_sim_args=per_sim, epp_args=args) as st:
            t0 = time.perf_counter()
            got = asyncio.run(run(st.url, ids, a.concurrency))
            seconds = time.perf_counter() - t0
            again = asyncio.run(run(st.url, ids[: a.retries], a.concurrency))
    load_after = os.getloadavg()
    n = len(got)
    share1, share2 = got.count("llama-v1") / n, got.count("llama-v2") / n
    kept = sum(x == y for x, y in zip(again, got, strict=False))
    other = n - got.count("llama-v1") - got.count("llama-v2")
    e1, e2 = w1 / (w1 + w2), w2 / (w1 + w2)
    print(
        f"{n} requests in {seconds:.1f} s: llama-v1 {share1:.2%} (weight {e1:.0%}), "
        f"llama-v2 {share2:.2%} (weight {e2:.0%}), other {other}; retried {len(again)}, "
        f"kept their target {kept}; load average {load_before[0]:.1f} → {load_after[0]:.1f}"
    )
    if a.results:
        within = max(abs(share1 - e1), abs(share2 - e2))
        rows = [
            ["llama-v1", round(e1, 4), got.count("llama-v1"), round(share1, 4),
             round(share1 - e1, 4)],
            ["llama-v2", round(e2, 4), got.count("llama-v2"), round(share2, 4),
             round(share2 - e2, 4)],
        ]  # fmt: skip
        notes = (
            f"{n} requests with random UUID request ids through Envoy → epp serve "
            f"--model-rewrites (llm-d.ai/v1alpha2 manifest) → two `epp sim`s, one per "
            f"target. Target: each share within 2 points of its weight; measured "
            f"{within * 100:.2f} points off at most ({'met' if within <= 0.02 else 'MISSED'}). "
            f"{kept} of {len(again)} retried ids (same x-request-id) kept their target "
            f"(upstream picks with rand.Intn, so a retry may switch models). {other} failed."
        )
        Result.measured(
            Path(a.results).stem, "Weighted InferenceModelRewrite through Envoy: split and retries",
            command_line(), ["target", "weight share", "requests", "measured share", "off by"],
            rows, notes, load=load_span(load_before, load_after),
        ).write(a.results)  # fmt: skip


if __name__ == "__main__":
    main()
