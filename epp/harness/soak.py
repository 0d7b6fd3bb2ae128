"""`make soak`: the EPP under steady load for a long time, watched for leaks.

    python -m epp.harness.soak --minutes 30 --out soak-report

1. Starts a local pool (`epp sim` servers, `epp serve` with the prefix-aware config,
   Envoy) from `epp.harness.localstack`.
2. Finds the pool's capacity with a short closed-loop ramp: `--ramp-step` seconds at
   2, 4, 8, … concurrent streamed chat requests until completed requests per second grow
   by less than 5 % (the knee); capacity = the best rate seen.
3. Sends an open-loop Poisson stream at `--load` (0.7) × capacity for `--minutes`,
   the same chat workload: one of `--prefixes` shared system prompts + a fresh user
   message, streamed, so the prefix index keeps learning new blocks and must evict.
4. Every `--sample` seconds reads the EPP process's RSS and open file descriptors from
   /proc, and from its /metrics the prefix index size
   (`inference_extension_prefix_indexer_size`) and asyncio task count
   (`epp_event_loop_tasks`); writes `samples.csv`, `soak.png` and `summary.json`.

Exit status 0 only if no request failed. Whether the curves are flat is read from the
summary (first vs last fifth after warm-up, and a least-squares slope per 10 minutes)
and the plot; the thresholds are in `verdict()`.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import itertools
import json
import os
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import aiohttp

from epp.harness.localstack import LocalStack

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "config" / "prefix-aware.yaml"
# 3 servers, 2 running requests each, 10 ms per output token: ~0.5 s per 48-token request,
# so the servers alone could do ~3 x 2 / 0.5 = 12 requests/s; on a busy machine the ramp
# finds a lower limit (the CPU's: 2.4 requests/s at a load average of 20-30 on 2 cores),
# which is the capacity that counts. A 16,384-token KV cache (1,024 blocks per server)
# makes the prefix index reach its bound (3 x 1,024 entries) within minutes.
SIM_ARGS = (
    "--max-num-seqs", "2", "--decode-ms-per-token", "10", "--prefill-ms-per-token", "0.01",
    "--kv-capacity-tokens", "16384",
)  # fmt: skip
MAX_TOKENS = 48
WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa",
         "lambda", "mu", "nu", "xi")  # fmt: skip


# ---- the EPP process, from outside ------------------------------------------------
def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def metric_value(text: str, name: str) -> float | None:
    """The value of an unlabelled sample `name` in Prometheus text, or None."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


@dataclass(frozen=True)
class Sample:
    t_s: float
    rss_mb: float
    open_fds: int
    loop_tasks: float
    prefix_index: float
    ok: int
    errors: int


# ---- the workload ---------------------------------------------------------------
@dataclass
class Tally:
    ok: int = 0
    errors: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)

    def fail(self, kind: str) -> None:
        self.errors += 1
        self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1


class Chat:
    """Streamed chat requests: a shared system prompt + a fresh user message."""

    def __init__(self, url: str, prefixes: int, seed: int = 0) -> None:
        self.url = url + "/v1/chat/completions"
        self.rng = random.Random(seed)
        self.systems = [
            f"System {i}. " + " ".join(random.Random(i).choice(WORDS) for _ in range(400))
            for i in range(prefixes)
        ]

    def body(self) -> dict:
        user = " ".join(self.rng.choice(WORDS) for _ in range(60))
        return {
            "model": "tiny",
            "stream": True,
            "max_tokens": MAX_TOKENS,
            "messages": [
                {"role": "system", "content": self.rng.choice(self.systems)},
                {"role": "user", "content": user},
            ],
        }

    async def one(self, http: aiohttp.ClientSession, tally: Tally) -> None:
        try:
            async with http.post(self.url, json=self.body()) as r:
                raw = await r.read()
                if r.status != 200:
                    tally.fail(f"http {r.status}")
                elif not raw.rstrip().endswith(b"data: [DONE]"):
                    tally.fail("stream without [DONE]")
                else:
                    tally.ok += 1
        except (TimeoutError, aiohttp.ClientError) as e:
            tally.fail(type(e).__name__)


def new_session() -> aiohttp.ClientSession:
    conn = aiohttp.TCPConnector(limit=0)
    return aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=120))


async def closed_loop_rate(chat: Chat, concurrency: int, seconds: float) -> tuple[float, Tally]:
    """Completed requests per second with `concurrency` requests always outstanding."""
    tally = Tally()
    stop = time.monotonic() + seconds
    async with new_session() as http:

        async def worker() -> None:
            while time.monotonic() < stop:
                await chat.one(http, tally)

        start = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return tally.ok / (time.monotonic() - start), tally


async def find_capacity(chat: Chat, step_s: float, log) -> tuple[float, list[dict]]:
    """Ramp 2, 4, 8, … concurrent requests until the rate grows < 5 %; the best rate."""
    steps: list[dict] = []
    best = 0.0
    concurrency = 2
    while concurrency <= 64:
        rate, tally = await closed_loop_rate(chat, concurrency, step_s)
        steps.append({"concurrency": concurrency, "rate": round(rate, 2), "errors": tally.errors})
        log(f"ramp: {concurrency} concurrent -> {rate:.2f} req/s ({tally.errors} errors)")
        if tally.errors:
            raise RuntimeError(f"errors while finding capacity: {tally.error_kinds}")
        if rate < best * 1.05:
            break
        best = max(best, rate)
        concurrency *= 2
    return best, steps


async def open_loop(chat: Chat, rate: float, seconds: float, tally: Tally) -> None:
    """Poisson arrivals at `rate`/s for `seconds`, then wait for every request to end."""
    rng = random.Random(1)
    pending: set[asyncio.Task] = set()
    async with new_session() as http:
        start = time.monotonic()
        due = start
        while True:
            due += rng.expovariate(rate)
            if due - start >= seconds:
                break
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            task = asyncio.create_task(chat.one(http, tally))
            pending.add(task)
            task.add_done_callback(pending.discard)
        await asyncio.gather(*pending)


# ---- sampling -------------------------------------------------------------------
async def sample_forever(
    pid: int, metrics_url: str, tally: Tally, every_s: float, out: list[Sample]
) -> None:
    start = time.monotonic()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        while True:
            async with http.get(metrics_url) as r:
                text = await r.text()
            out.append(
                Sample(
                    t_s=round(time.monotonic() - start, 1),
                    rss_mb=round(rss_mb(pid), 1),
                    open_fds=open_fds(pid),
                    loop_tasks=metric_value(text, "epp_event_loop_tasks") or 0.0,
                    prefix_index=metric_value(text, "inference_extension_prefix_indexer_size")
                    or 0.0,
                    ok=tally.ok,
                    errors=tally.errors,
                )
            )
            await asyncio.sleep(every_s)


def slope_per_10min(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ys over xs (seconds), scaled to 10 minutes."""
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    if var == 0:
        return 0.0
    return 600 * sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var


def verdict(samples: Sequence[Sample], warmup_s: float) -> dict:
    """First vs last fifth and the slope of each series after `warmup_s`."""
    steady = [s for s in samples if s.t_s >= warmup_s] or list(samples)
    fifth = max(1, len(steady) // 5)
    out = {}
    for name in ("rss_mb", "open_fds", "loop_tasks", "prefix_index"):
        ys = [float(getattr(s, name)) for s in steady]
        xs = [s.t_s for s in steady]
        out[name] = {
            "first_fifth_mean": round(sum(ys[:fifth]) / fifth, 1),
            "last_fifth_mean": round(sum(ys[-fifth:]) / fifth, 1),
            "max": max(ys),
            "slope_per_10min": round(slope_per_10min(xs, ys), 2),
        }
    return out


def plot(samples: Sequence[Sample], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s.t_s / 60 for s in samples]
    fig, axes = plt.subplots(5, 1, figsize=(8, 11), sharex=True)
    series = [
        ("rss_mb", "EPP RSS (MB)"),
        ("open_fds", "open file descriptors"),
        ("loop_tasks", "asyncio tasks"),
        ("prefix_index", "prefix index entries"),
    ]
    for ax, (name, label) in zip(axes, series, strict=False):
        ax.plot(t, [getattr(s, name) for s in samples])
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    rates = [0.0] + [
        (b.ok - a.ok) / (b.t_s - a.t_s) if b.t_s > a.t_s else 0.0
        for a, b in itertools.pairwise(samples)
    ]
    axes[4].plot(t, rates, label="completed/s")
    axes[4].plot(t, [s.errors for s in samples], label="errors (cumulative)")
    axes[4].set_ylabel("requests")
    axes[4].legend(loc="lower right")
    axes[4].grid(alpha=0.3)
    axes[4].set_xlabel("minutes")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# ---- the run --------------------------------------------------------------------
@dataclass(frozen=True)
class SoakOptions:
    minutes: float = 30.0
    load: float = 0.7
    n_sims: int = 3
    prefixes: int = 32
    ramp_step_s: float = 15.0
    sample_s: float = 10.0
    capacity: float | None = None  # known capacity (req/s): skip the ramp
    out_dir: Path = ROOT / "soak-report"


async def soak(options: SoakOptions) -> dict:
    out = options.out_dir
    out.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} soak: {msg}", flush=True)

    stack = LocalStack(
        n_sims=options.n_sims,
        sim_args=list(SIM_ARGS),
        epp_args=["--config", str(CONFIG)],
        run_dir=out / "logs",
    )
    await asyncio.to_thread(stack.start)
    try:
        assert stack.pg is not None
        epp = next(p for p in stack.pg.processes if p.name == "epp")
        assert epp.popen is not None
        pid = epp.popen.pid
        chat = Chat(stack.url, options.prefixes)
        steps: list[dict] = []
        if options.capacity is None:
            capacity, steps = await find_capacity(chat, options.ramp_step_s, log)
        else:
            capacity = options.capacity
        rate = options.load * capacity
        seconds = options.minutes * 60
        log(f"capacity {capacity:.2f} req/s; soaking at {rate:.2f} req/s for {seconds:.0f} s")
        tally, samples = Tally(), []
        sampler = asyncio.create_task(
            sample_forever(
                pid, stack.epp_metrics_url + "/metrics", tally, options.sample_s, samples
            )
        )
        try:
            await open_loop(chat, rate, seconds, tally)
            await asyncio.sleep(options.sample_s)  # one sample after the last request ended
        finally:
            sampler.cancel()
            await asyncio.gather(sampler, return_exceptions=True)
    finally:
        await asyncio.to_thread(stack.stop)
    with (out / "samples.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[fl.name for fl in fields(Sample)])
        w.writeheader()
        w.writerows(asdict(s) for s in samples)
    summary = {
        "minutes": options.minutes,
        "capacity_rps": round(capacity, 2),
        "ramp": steps,
        "rate_rps": round(rate, 2),
        "requests_ok": tally.ok,
        "errors": tally.errors,
        "error_kinds": tally.error_kinds,
        "series": verdict(samples, warmup_s=min(300.0, seconds / 5)),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    title = (
        f"soak: {options.minutes:g} min at {rate:.1f} req/s ({options.load:.0%} of "
        f"{capacity:.1f}); {tally.ok} ok, {tally.errors} errors"
    )
    plot(samples, out / "soak.png", title)
    log(f"{tally.ok} requests ok, {tally.errors} errors; {out}/summary.json, {out}/soak.png")
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m epp.harness.soak", description=__doc__.split("\n")[0]
    )
    p.add_argument("--minutes", type=float, default=float(os.environ.get("SOAK_MINUTES", 30)))
    p.add_argument("--load", type=float, default=0.7, help="fraction of capacity (0.7)")
    p.add_argument("--sims", type=int, default=3)
    p.add_argument("--prefixes", type=int, default=32, help="shared system prompts (32)")
    p.add_argument("--ramp-step", type=float, default=15.0, metavar="SECONDS")
    p.add_argument("--sample", type=float, default=10.0, metavar="SECONDS")
    p.add_argument("--capacity", type=float, help="req/s, skips the ramp")
    p.add_argument("--out", type=Path, default=ROOT / "soak-report")
    a = p.parse_args(argv)
    if a.minutes <= 0:
        p.error("--minutes (SOAK_MINUTES) must be > 0")
    if not 0 < a.load <= 1:
        p.error("--load must be in (0, 1]")
    if a.capacity is not None and a.capacity <= 0:
        p.error("--capacity must be > 0")
    options = SoakOptions(
        minutes=a.minutes,
        load=a.load,
        n_sims=a.sims,
        prefixes=a.prefixes,
        ramp_step_s=a.ramp_step,
        sample_s=a.sample,
        capacity=a.capacity,
        out_dir=a.out,
    )
    summary = asyncio.run(soak(options))
    return 1 if summary["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
