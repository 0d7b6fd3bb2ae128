"""Measure what many simulated servers cost: start one `epp sim --replicas N` process,
drive every replica with Poisson traffic, report the process's CPU and peak RSS.

    .venv/bin/python -m epp.sim.loadgen --replicas 16 --preset llama-3.1-8b-h100 \\
        --qps-per-server 2 --duration 30

Prompts are distinct texts with ShareGPT-like lengths (log-normal, means 202 input and
179 output tokens, as in vLLM's published ShareGPT runs); `--stream` is the fraction of
streamed requests. CPU is the simulator process's user+system time over the measured
window (after `--warmup`), divided by the window: 1.0 means one core. RSS is the peak
seen while sampling /proc. The load generator runs in this process, apart from the
simulator's, so its own cost is not counted. Linux only (reads /proc).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass, field

import aiohttp

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass
class Tally:
    sent: int = 0
    ok: int = 0
    failed: int = 0
    tokens: int = 0
    ttft: list[float] = field(default_factory=list)


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / CLK_TCK  # utime, stime


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def start_sim(
    replicas: int, extra: list[str]
) -> tuple[asyncio.subprocess.Process, list[str]]:
    argv = [sys.executable, "-m", "epp.cli", "sim", "--replicas", str(replicas), "--port", "0"]
    proc = await asyncio.create_subprocess_exec(
        *argv, *extra, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    assert proc.stdout is not None
    urls = []
    while len(urls) < replicas:
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode().split()
        if not line:
            raise RuntimeError("epp sim exited before listening")
        if line[:1] == ["sim"] and "listening" in line:
            urls.append(line[-1])
    return proc, urls


async def one(
    http: aiohttp.ClientSession, url: str, rng: random.Random, stream: float, tally: Tally
) -> None:
    n_in = max(4, round(rng.lognormvariate(0, 0.9) * 202 / 1.5))
    n_out = max(4, round(rng.lognormvariate(0, 0.7) * 179 / 1.28))
    words = " ".join(f"w{rng.getrandbits(40)}" for _ in range(n_in))
    body = {"model": "tiny", "prompt": words, "max_tokens": n_out, "stream": rng.random() < stream}
    tally.sent += 1
    start = time.monotonic()
    try:
        async with http.post(url + "/v1/completions", json=body) as resp:
            if resp.status != 200:
                tally.failed += 1
                return
            if body["stream"]:
                first = True
                async for _ in resp.content:
                    if first:
                        tally.ttft.append(time.monotonic() - start)
                        first = False
            else:
                await resp.read()
        tally.ok += 1
        tally.tokens += n_out
    except aiohttp.ClientError:
        tally.failed += 1


async def drive(url: str, qps: float, until: float, stream: float, seed: int, tally: Tally,
                http: aiohttp.ClientSession) -> None:  # fmt: skip
    rng = random.Random(seed)
    tasks = set()
    while time.monotonic() < until:
        await asyncio.sleep(rng.expovariate(qps))
        task = asyncio.ensure_future(one(http, url, rng, stream, tally))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(tasks, timeout=120)


async def main_async(args: argparse.Namespace) -> int:
    extra = ["--preset", args.preset, *(["--time-scale", str(args.time_scale)])]
    proc, urls = await start_sim(args.replicas, extra)
    pid = proc.pid
    tally = Tally()
    peak = rss_mb(pid)
    idle_rss = peak
    try:
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=600)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
            t0 = time.monotonic()
            until = t0 + args.warmup + args.duration
            drivers = asyncio.gather(
                *(
                    drive(u, args.qps_per_server, until, args.stream, i, tally, http)
                    for i, u in enumerate(urls)
                )
            )
            await asyncio.sleep(args.warmup)
            cpu0, w0, ok0, tok0 = cpu_seconds(pid), time.monotonic(), tally.ok, tally.tokens
            while time.monotonic() < until:
                await asyncio.sleep(0.5)
                peak = max(peak, rss_mb(pid))
            cpu1, w1 = cpu_seconds(pid), time.monotonic()
            ok1, tok1 = tally.ok, tally.tokens
            await drivers
    finally:
        proc.terminate()
        await proc.wait()
    window = w1 - w0
    print(f"replicas={args.replicas} preset={args.preset} qps/server={args.qps_per_server} "
          f"stream={args.stream} window={window:.1f}s")  # fmt: skip
    rate, tokens = (ok1 - ok0) / window, (tok1 - tok0) / window
    print(f"  completed {rate:.1f} req/s, {tokens:.0f} output tok/s "
          f"(sent {tally.sent}, ok {tally.ok}, failed {tally.failed})")  # fmt: skip
    if tally.ttft:
        print(f"  client TTFT (streams): median {1000 * statistics.median(tally.ttft):.1f} ms")
    print(f"  simulator process: CPU {(cpu1 - cpu0) / window:.2f} cores, "
          f"RSS idle {idle_rss:.0f} MB, peak {peak:.0f} MB")  # fmt: skip
    return 0 if tally.failed == 0 else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=16)
    ap.add_argument("--preset", default="llama-3.1-8b-h100")
    ap.add_argument("--qps-per-server", type=float, default=2.0)
    ap.add_argument("--stream", type=float, default=0.5, help="fraction of streamed requests")
    ap.add_argument("--duration", type=float, default=30.0, help="measured seconds")
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--time-scale", type=float, default=1.0)
    return asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
