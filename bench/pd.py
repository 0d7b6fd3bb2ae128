"""Aggregated serving vs prefill/decode disaggregation on the simulator, same server count.

Every setup runs real processes on loopback: Envoy → `epp serve` → simulators (`epp sim`
with the calibrated Llama 3.1 8B / H100 preset).

- aggregated: N simulators that prefill and decode (kv-role both), the default config
  (queue, KV-cache and prefix scorers);
- P/D P:D: P prefill simulators and D decode simulators, each decode one behind an
  `epp sidecar`, with config/pd-disagg.yaml (prefix-based decider, nonCachedTokens 256).

The workload is long prompts (default 6,000 tokens, no shared prefixes, so every request
is disaggregated under P/D) with streamed answers (default 200 tokens), sent as a seeded
Poisson process at each rate (open loop: arrivals do not wait for answers). Per request
the client records TTFT (first SSE token), the gaps between later tokens (ITL, pooled over
all requests) and the end-to-end time.

    .venv/bin/python bench/pd.py                           # 3, 6, 9 req/s; 2P+2D and 3P+1D
    .venv/bin/python bench/pd.py --rates 2 --requests 20   # a quick look

The simulator's latency model is the ground truth: a step costs a base time, prefill time
per new prompt token (chunked, up to 8,192 per step) and decode time per running sequence,
so on an aggregated server every long prefill stalls the decodes batched with it (the ITL
tail P/D removes), while a P/D decode server only pays the KV transfer for a prompt
prefilled elsewhere.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass, field

import aiohttp

from epp.harness.localstack import LocalStack, PDLayout

# The simulator's calibrated Llama 3.1 8B on one H100 (epp/sim/presets.py: step times
# fitted to vLLM's published benchmarks; 8,192-token chunked prefill; KV transfer at
# 400 Gb/s RDMA, 2.6 us per token).
SIM_ARGS = ["--preset", "llama-3.1-8b-h100"]
STALL_S = 0.05  # an inter-token gap this long means a prefill ran in the decode's step
_WORDS = [f"{a}{b}{c}" for a in "bcdfgklmnprst" for b in "aeiou" for c in "bdgklmnprst"]


@dataclass
class Sample:
    ok: bool
    ttft: float | None = None
    gaps: list[float] = field(default_factory=list)
    e2e: float | None = None


@dataclass
class Row:
    setup: str
    rate: float
    offered: float  # the arrival rate the seeded Poisson draw actually produced
    samples: list[Sample]

    def stat(self, values: list[float], q: float) -> float | None:
        if not values:
            return None
        values = sorted(values)
        return values[min(len(values) - 1, int(q * len(values)))]

    def summary(self) -> dict[str, float | None]:
        ok = [s for s in self.samples if s.ok]
        ttft = [s.ttft for s in ok if s.ttft is not None]
        gaps = [g for s in ok for g in s.gaps]
        e2e = [s.e2e for s in ok if s.e2e is not None]
        return {
            "ttft_p50": self.stat(ttft, 0.5),
            "ttft_p90": self.stat(ttft, 0.9),
            "itl_mean": statistics.fmean(gaps) if gaps else None,
            "itl_p90": self.stat(gaps, 0.9),
            "itl_p99": self.stat(gaps, 0.99),
            # Share of gaps that are stalls: a decode waiting behind someone's prefill step.
            "stalls": sum(g >= STALL_S for g in gaps) / len(gaps) if gaps else None,
            "e2e_p50": self.stat(e2e, 0.5),
            "e2e_p90": self.stat(e2e, 0.9),
            "errors": float(len(self.samples) - len(ok)),
        }


def prompt(rng: random.Random, tokens: int, i: int) -> str:
    """`tokens` three-letter words: one token each for the simulator's tokenizer and for
    the EPP's estimate (4 characters per token), unique from the first word on."""
    return f"r{i:05d} " + " ".join(rng.choice(_WORDS) for _ in range(tokens - 1))


async def one(session: aiohttp.ClientSession, url: str, body: dict) -> Sample:
    t0 = time.perf_counter()
    last = None
    sample = Sample(ok=False)
    try:
        async with session.post(url + "/v1/completions", json=body) as r:
            if r.status != 200:
                await r.read()
                return sample
            async for line in r.content:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                now = time.perf_counter()
                if last is None:
                    sample.ttft = now - t0
                else:
                    sample.gaps.append(now - last)
                last = now
        sample.e2e = time.perf_counter() - t0
        sample.ok = sample.ttft is not None
    except (TimeoutError, aiohttp.ClientError):
        pass
    return sample


async def load(url: str, rate: float, n: int, args: argparse.Namespace, seed: int) -> Row:
    rng = random.Random(seed)
    bodies = [
        {
            "model": "tiny",
            "prompt": prompt(rng, args.prompt_tokens, i),
            "max_tokens": args.output_tokens,
            "stream": True,
        }
        for i in range(n)
    ]
    arrivals, t = [], 0.0
    for _ in range(n):
        t += rng.expovariate(rate)
        arrivals.append(t)
    timeout = aiohttp.ClientTimeout(total=300)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        start = time.perf_counter()

        async def fire(at: float, body: dict) -> Sample:
            await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
            return await one(session, url, body)

        samples = await asyncio.gather(*(fire(a, b) for a, b in zip(arrivals, bodies, strict=True)))
    return Row("", rate, n / arrivals[-1], list(samples))


async def run_setup(name: str, url: str, args: argparse.Namespace) -> list[Row]:
    rows = []
    await load(url, args.rates[0], 4, args, seed=999)  # warm connections and caches
    for k, rate in enumerate(args.rates):
        sys.stderr.write(f"  {name}: {rate:g} req/s x {args.requests} ...\n")
        row = await load(url, rate, args.requests, args, seed=args.seed + k)
        row.setup = name
        rows.append(row)
    return rows


def fmt(v: float | None, scale: float = 1000.0, digits: int = 0) -> str:
    return "-" if v is None else f"{v * scale:.{digits}f}"


def table(rows: list[Row]) -> str:
    lines = [
        "| setup | rate (req/s) | offered | TTFT p50 / p90 (ms) | ITL mean / p99 (ms) "
        "| gaps ≥ 50 ms | E2E p50 / p90 (ms) | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in sorted(rows, key=lambda r: (r.rate, r.setup)):
        s = row.summary()
        lines.append(
            f"| {row.setup} | {row.rate:g} | {row.offered:.2f} | "
            f"{fmt(s['ttft_p50'])} / {fmt(s['ttft_p90'])} | "
            f"{fmt(s['itl_mean'])} / {fmt(s['itl_p99'])} | {fmt(s['stalls'], 100, 1)} % | "
            f"{fmt(s['e2e_p50'])} / {fmt(s['e2e_p90'])} | {s['errors']:.0f} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", default="3,6,9", help="request rates, req/s (3,6,9)")
    p.add_argument("--requests", type=int, default=200, help="requests per rate (200)")
    p.add_argument("--servers", type=int, default=4, help="servers per setup (4)")
    p.add_argument(
        "--splits", default="2:2,3:1", help="P/D setups, PREFILL:DECODE comma-separated (2:2,3:1)"
    )
    p.add_argument("--prompt-tokens", type=int, default=6000)
    p.add_argument("--output-tokens", type=int, default=200)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--sim-arg", action="append", default=[], help="extra `epp sim` flag")
    p.add_argument("--json", metavar="FILE", help="also write the raw summaries here")
    args = p.parse_args(argv)
    args.rates = [float(r) for r in args.rates.split(",")]
    try:
        args.splits = [tuple(int(x) for x in s.split(":")) for s in args.splits.split(",")]
    except ValueError:
        p.error("--splits: expected PREFILL:DECODE pairs, e.g. 2:2,3:1")
    for split in args.splits:
        if len(split) != 2 or min(split) < 1 or sum(split) != args.servers:
            p.error(f"--splits: {split} must be two counts >= 1 adding up to --servers")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sim_args = [*SIM_ARGS, *args.sim_arg]
    rows: list[Row] = []
    setups = [
        (f"aggregated ({args.servers})", LocalStack(n_sims=args.servers, sim_args=sim_args)),
        *(
            (f"P/D ({p}P + {d}D)", LocalStack(sim_args=sim_args, pd=PDLayout(p, d)))
            for p, d in args.splits
        ),
    ]
    for name, stack in setups:
        sys.stderr.write(f"starting {name} ...\n")
        with stack:
            rows += asyncio.run(run_setup(name, stack.url, args))
    print(
        f"{args.prompt_tokens}-token prompts, {args.output_tokens}-token streamed answers, "
        f"{args.requests} Poisson requests per rate; sim: {' '.join(sim_args)}"
    )
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                [
                    {"setup": r.setup, "rate": r.rate, "offered": r.offered, **r.summary()}
                    for r in rows
                ],
                f,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
