"""`epp demo`: a real Envoy, the EPP and four simulated vLLM servers, under load.

The pool is deliberately uneven (one server is slower, like an older GPU), which is
where a load-aware picker earns its keep. The same seeded workload first goes through
the same Envoy balancing round-robin on its own, then through the EPP; the table shows
where the EPP sent requests and what each server did with them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field

import aiohttp

from epp.harness.localstack import LocalStack, PDLayout
from epp.headers import SIM_SERVER

# Model time per token on the simulators (milliseconds). sim-3 decodes 3× slower.
SIM_ARGS = ["--max-num-seqs", "4", "--decode-ms-per-token", "6", "--prefill-ms-per-token", "0.05"]
SLOW_SIM_ARGS = ["--decode-ms-per-token", "18", "--prefill-ms-per-token", "0.15"]
TOPICS = ["routing", "caching", "batching", "GPUs", "queues", "tokens", "latency", "Envoy"]


@dataclass
class Outcome:
    server: str | None
    ok: bool
    ttft: float | None
    status: int


@dataclass
class Run:
    name: str
    outcomes: list[Outcome] = field(default_factory=list)
    seconds: float = 0.0

    def ttfts(self, server: str | None = None) -> list[float]:
        return [
            o.ttft
            for o in self.outcomes
            if o.ttft is not None and (server is None or o.server == server)
        ]

    @property
    def errors(self) -> int:
        return sum(not o.ok for o in self.outcomes)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--requests", type=int, default=300, help="requests per phase (300)")
    p.add_argument("--concurrency", type=int, default=16, help="requests in flight (16)")
    p.add_argument("--seed", type=int, default=1, help="workload seed (1)")
    p.add_argument("--no-baseline", action="store_true", help="skip the round-robin phase")
    p.add_argument(
        "--pd",
        action="store_true",
        help="prefill/decode disaggregation: 2 prefill and 2 decode simulators, the decode "
        "ones behind `epp sidecar`, config/pd-disagg.yaml (no round-robin phase)",
    )


def workload(n: int, seed: int) -> list[tuple[str, dict]]:
    """A seeded mix: completions and chat, short and long prompts, mostly streaming."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        topic = rng.choice(TOPICS)
        words = rng.choice([8, 40, 200, 600])
        text = f"Request {i}: tell me about {topic}. " + "context " * words
        max_tokens = rng.choice([8, 16, 32, 64])
        stream = rng.random() < 0.8
        if rng.random() < 0.5:
            body = {"model": "tiny", "prompt": text, "max_tokens": max_tokens, "stream": stream}
            out.append(("/v1/completions", body))
        else:
            body = {
                "model": "tiny",
                "messages": [{"role": "user", "content": text}],
                "max_tokens": max_tokens,
                "stream": stream,
            }
            out.append(("/v1/chat/completions", body))
    return out


async def _one(session: aiohttp.ClientSession, url: str, path: str, body: dict) -> Outcome:
    t0 = time.perf_counter()
    try:
        async with session.post(url + path, data=json.dumps(body)) as r:
            server = r.headers.get(SIM_SERVER)
            ttft = None
            if body.get("stream") and r.status == 200:
                async for line in r.content:
                    if line.startswith(b"data: ") and ttft is None:
                        ttft = time.perf_counter() - t0
            else:
                await r.read()
            return Outcome(_endpoint_name(server), r.status == 200, ttft, r.status)
    except (TimeoutError, aiohttp.ClientError):
        return Outcome(None, False, None, 0)


def _endpoint_name(server: str | None) -> str | None:
    return server.rsplit("-", 1)[0] if server else None  # sim-3-0 → sim-3


async def drive(name: str, url: str, requests: list[tuple[str, dict]], concurrency: int) -> Run:
    run = Run(name)
    sem = asyncio.Semaphore(concurrency)
    done = 0
    t0 = time.perf_counter()
    timeout = aiohttp.ClientTimeout(total=120)
    headers = {"content-type": "application/json"}
    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:

        async def task(path: str, body: dict) -> None:
            nonlocal done
            async with sem:
                run.outcomes.append(await _one(session, url, path, body))
            done += 1
            _progress(name, done, len(requests), time.perf_counter() - t0)

        await asyncio.gather(*(task(p, b) for p, b in requests))
    run.seconds = time.perf_counter() - t0
    if sys.stderr.isatty():
        sys.stderr.write("\n")
    return run


def _progress(name: str, done: int, total: int, elapsed: float) -> None:
    """A redrawn bar on a terminal; four plain lines when output goes to a file or CI log."""
    if not sys.stderr.isatty():
        if done * 4 % total < 4 or done == total:
            rate = done / elapsed if elapsed > 0 else 0.0
            sys.stderr.write(f"  {name:<12} {done}/{total}  {rate:5.1f} req/s\n")
        return
    width = 30
    filled = width * done // total
    bar = "#" * filled + "." * (width - filled)
    rate = done / elapsed if elapsed > 0 else 0.0
    sys.stderr.write(f"\r  {name:<12} [{bar}] {done}/{total}  {rate:5.1f} req/s")
    sys.stderr.flush()


async def sample_queues(metrics_url: str, stop: asyncio.Event, into: dict[str, list[int]]) -> None:
    """Poll the EPP's view of each server's waiting queue while the EPP phase runs."""
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            try:
                async with session.get(metrics_url + "/debug/endpoints") as r:
                    for row in await r.json():
                        into[row["name"]].append(row["waiting"])
            except aiohttp.ClientError:
                pass
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.1)


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def fmt_s(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def table(run: Run, names: list[str], queues: dict[str, list[int]]) -> str:
    counts: dict[str | None, int] = defaultdict(int)
    errors: dict[str | None, int] = defaultdict(int)
    for o in run.outcomes:
        counts[o.server] += 1
        errors[o.server] += not o.ok
    lines = [
        f"{'endpoint':<10} {'requests':>8} {'share':>6} {'mean queue':>10} "
        f"{'TTFT p50 s':>10} {'TTFT p90 s':>10} {'errors':>6}",
    ]
    for n in names:
        q = queues.get(n) or []
        mean_q = f"{statistics.fmean(q):.2f}" if q else "-"
        share = counts[n] / max(1, len(run.outcomes))
        p50, p90 = fmt_s(pct(run.ttfts(n), 0.5)), fmt_s(pct(run.ttfts(n), 0.9))
        lines.append(
            f"{n:<10} {counts[n]:>8} {share:>6.0%} {mean_q:>10} {p50:>10} {p90:>10} {errors[n]:>6}"
        )
    if counts[None]:
        lines.append(f"{'(no reply)':<10} {counts[None]:>8} {'':>39} {errors[None]:>6}")
    return "\n".join(lines)


async def _phases(stack: LocalStack, args: argparse.Namespace, baseline_url: str | None) -> int:
    requests = workload(args.requests, args.seed)
    names = [s.name for s in stack.sims]
    slow = names[-1]
    baseline = None
    if baseline_url:
        baseline = await drive("round-robin", baseline_url, requests, args.concurrency)
    queues: dict[str, list[int]] = defaultdict(list)
    stop = asyncio.Event()
    sampler = asyncio.create_task(sample_queues(stack.epp_metrics_url, stop, queues))
    epp_run = await drive("epp", stack.url, requests, args.concurrency)
    stop.set()
    await sampler

    print()
    print(
        f"Through Envoy + EPP ({len(requests)} requests, {args.concurrency} in flight, "
        f"{slow} is a 3x slower server); TTFT over streaming requests:"
    )
    print(table(epp_run, names, queues))
    if baseline is not None:
        print()
        print("Same workload, Envoy round-robin without the EPP:")
        print(table(baseline, names, {}))
    print()
    ok = epp_run.errors == 0
    slow_share = sum(o.server == slow for o in epp_run.outcomes) / max(1, len(epp_run.outcomes))
    verdict = (
        f"verdict: {'OK' if ok else 'FAILED'}: {len(epp_run.outcomes) - epp_run.errors}/"
        f"{len(epp_run.outcomes)} requests succeeded through the EPP; the slow server "
        f"{slow} got {slow_share:.0%} of them (round-robin: 25%); TTFT p90 "
        f"{fmt_s(pct(epp_run.ttfts(), 0.9))} s"
    )
    if baseline is not None:
        verdict += f" vs {fmt_s(pct(baseline.ttfts(), 0.9))} s round-robin"
    print(verdict)
    return 0 if ok else 1


async def _admin_stats(urls: dict[str, str]) -> dict[str, dict]:
    async with aiohttp.ClientSession() as session:
        out = {}
        for name, url in urls.items():
            async with session.get(url + "/admin") as r:
                out[name] = (await r.json())["stats"]
        return out


async def _decisions(metrics_url: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as session, session.get(metrics_url + "/metrics") as r:
        text = await r.text()
    out: dict[str, float] = defaultdict(float)
    for line in text.splitlines():
        if line.startswith("inference_extension_disagg_decisions_total{"):
            kind = line.split('decision_type="', 1)[1].split('"', 1)[0]
            out[kind] = float(line.rsplit(" ", 1)[1])
    return out


async def _pd_phases(stack: LocalStack, args: argparse.Namespace) -> int:
    """The P/D run: the same workload; decode servers in the table, prefill servers below."""
    requests = workload(args.requests, args.seed)
    urls = {s.name: s.url for s in stack.sims}
    prefills = [n for n in urls if n.startswith("prefill-")]
    decodes = [n for n in urls if n.startswith("decode-")]
    before, d0 = await _admin_stats(urls), await _decisions(stack.epp_metrics_url)
    queues: dict[str, list[int]] = defaultdict(list)
    stop = asyncio.Event()
    sampler = asyncio.create_task(sample_queues(stack.epp_metrics_url, stop, queues))
    run_ = await drive("epp p/d", stack.url, requests, args.concurrency)
    stop.set()
    await sampler
    after, d1 = await _admin_stats(urls), await _decisions(stack.epp_metrics_url)
    pd_count = d1["prefill-decode"] - d0["prefill-decode"]
    local = d1["decode-only"] - d0["decode-only"]

    print()
    print(
        f"Through Envoy + EPP, P/D ({len(requests)} requests, {args.concurrency} in flight; "
        "decode servers answer, behind their sidecars); TTFT over streaming requests:"
    )
    print(table(run_, decodes, queues))
    print()
    print(f"{'prefill':<10} {'remote prefills':>15} {'mean queue':>10} {'failed':>6}")
    for n in prefills:
        q = queues.get(n) or []
        done = after[n]["requests_received"] - before[n]["requests_received"]
        failed = after[n]["requests_failed"] - before[n]["requests_failed"]
        mean_q = f"{statistics.fmean(q):.2f}" if q else "-"
        print(f"{n:<10} {done:>15} {mean_q:>10} {failed:>6}")
    print()
    ok = run_.errors == 0 and pd_count > 0
    print(
        f"verdict: {'OK' if ok else 'FAILED'}: {len(run_.outcomes) - run_.errors}/"
        f"{len(run_.outcomes)} requests succeeded; the EPP sent {pd_count:.0f} to a remote "
        f"prefill and kept {local:.0f} decode-only (short or cached prompts); TTFT p90 "
        f"{fmt_s(pct(run_.ttfts(), 0.9))} s"
    )
    return 0 if ok else 1


def run(args: argparse.Namespace) -> int:
    if args.requests < 1 or args.concurrency < 1:
        print("epp demo: --requests and --concurrency must be at least 1", file=sys.stderr)
        return 2
    if args.pd:
        return _run_pd(args)
    print("Starting 4 simulated vLLM servers, the EPP and Envoy on loopback ...", flush=True)
    t0 = time.perf_counter()
    try:
        with LocalStack(n_sims=4, sim_args=SIM_ARGS, per_sim_args={3: SLOW_SIM_ARGS}) as stack:
            baseline_url = None
            if not args.no_baseline:
                baseline_url = stack.start_baseline_envoy("ROUND_ROBIN").url
            print(f"  ready in {time.perf_counter() - t0:.1f} s; Envoy + EPP at {stack.url}")
            return asyncio.run(_phases(stack, args, baseline_url))
    except KeyboardInterrupt:
        print("\ninterrupted; every process the demo started has been stopped", file=sys.stderr)
        return 130


def _run_pd(args: argparse.Namespace) -> int:
    print(
        "Starting 2 prefill + 2 decode simulators (with sidecars), the EPP and Envoy ...",
        flush=True,
    )
    t0 = time.perf_counter()
    try:
        with LocalStack(sim_args=SIM_ARGS, pd=PDLayout(n_prefill=2, n_decode=2)) as stack:
            print(f"  ready in {time.perf_counter() - t0:.1f} s; Envoy + EPP at {stack.url}")
            return asyncio.run(_pd_phases(stack, args))
    except KeyboardInterrupt:
        print("\ninterrupted; every process the demo started has been stopped", file=sys.stderr)
        return 130
