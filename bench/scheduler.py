"""Scheduling latency per request at 10, 100 and 1000 endpoints, and the EPP's RSS.

Measures `Director.route` (candidate selection + the default profile: queue and KV-cache
scorers, max-score picker + in-flight accounting), the whole per-request scheduling
work, over endpoints with varied metrics. Run: `.venv/bin/python bench/scheduler.py`.
RSS is read from /proc/self/status after building the 1000-endpoint pool and routing.

Each route is timed twice: wall clock (`perf_counter`) and this thread's CPU time
(`thread_time`), which a shared machine's other jobs do not inflate (a preempted route's
wall time includes whoever ran meanwhile; its CPU time does not). The garbage collector
runs as in production.

`--baseline CHECKOUT` measures old and new side by side in one run: this same script runs
in subprocesses, alternately with this checkout's `epp` and with CHECKOUT's (e.g. main's
worktree), `--rounds` times each; the table gives the medians over rounds.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from epp.composition import install_plugins
from epp.config.loader import load_default_config
from epp.datastore import Datastore, Endpoint, EndpointMetrics
from epp.director import Director
from epp.headers import REQUEST_ID
from epp.request import new_request, parse_body
from epp.scheduling.registry import Handle


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def build(n: int, seed: int = 0) -> Director:
    rng = random.Random(seed)
    ds = Datastore(staleness=1e9)
    ds.set_endpoints(
        [Endpoint(f"ep-{i}", f"10.{i // 65536}.{i // 256 % 256}.{i % 256}", 8000) for i in range(n)]
    )
    now = ds.clock()
    for e in ds.endpoints():
        ds.update_metrics(
            e.name,
            EndpointMetrics(
                waiting_queue_size=rng.randrange(0, 20),
                running_requests=rng.randrange(0, 64),
                kv_cache_usage=rng.random(),
                update_time=now,
            ),
        )
    cfg = load_default_config(Handle(rng=random.Random(seed)), install_plugins())
    return Director(ds, cfg.scheduler, cfg.pre_request, random.Random(seed))


def measure(n: int, requests: int) -> dict[str, float]:
    director = build(n)
    body = json.dumps({"model": "m", "prompt": "hello " * 200}).encode()
    samples, cpu = [], []
    gc.collect()
    for _ in range(requests):
        req = parse_body(new_request({REQUEST_ID: "r"}, "/v1/completions", "POST"), body)
        c0, t0 = time.thread_time(), time.perf_counter()
        decision = director.route(req, None)
        t1, c1 = time.perf_counter(), time.thread_time()
        samples.append(t1 - t0)
        cpu.append(c1 - c0)
        director.release(decision)
    samples.sort()
    cpu.sort()
    return {
        "endpoints": n,
        "requests": requests,
        "p50_ms": samples[len(samples) // 2] * 1e3,
        "p99_ms": samples[int(len(samples) * 0.99)] * 1e3,
        "mean_ms": statistics.fmean(samples) * 1e3,
        "cpu_p50_ms": cpu[len(cpu) // 2] * 1e3,
        "cpu_p99_ms": cpu[int(len(cpu) * 0.99)] * 1e3,
        "cpu_mean_ms": statistics.fmean(cpu) * 1e3,
    }


SIZES = (10, 100, 1000)
COLUMNS = ("p50_ms", "p99_ms", "cpu_p50_ms", "cpu_p99_ms", "cpu_mean_ms")


def run_all(requests: int) -> list[dict[str, float]]:
    return [measure(n, requests if n < 1000 else max(1000, requests // 5)) for n in SIZES]


def subprocess_run(checkout: Path | None, requests: int) -> list[dict[str, float]]:
    """This script with `checkout`'s epp package (None: this checkout's) in a child."""
    env = dict(os.environ)
    if checkout is not None:
        env["PYTHONPATH"] = str(checkout)
    argv = [sys.executable, str(Path(__file__).resolve()), "--json", "--requests", str(requests)]
    out = subprocess.run(
        argv, env=env, cwd=checkout, check=True, capture_output=True, text=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def side_by_side(baseline: Path, rounds: int, requests: int) -> None:
    runs: dict[str, list[list[dict[str, float]]]] = {"before": [], "after": []}
    for r in range(rounds):
        order = [("before", baseline), ("after", None)]
        for label, checkout in order if r % 2 == 0 else order[::-1]:
            runs[label].append(subprocess_run(checkout, requests))
            print(f"round {r + 1}: {label} done", flush=True)
    print(f"\nmedians of {rounds} rounds; before = {baseline}, after = this checkout\n")
    print("| endpoints | | " + " | ".join(COLUMNS) + " |")
    print("|---:|---|" + "---:|" * len(COLUMNS))
    for i, n in enumerate(SIZES):
        for label in ("before", "after"):
            med = [statistics.median(run[i][c] for run in runs[label]) for c in COLUMNS]
            print(f"| {n} | {label} | " + " | ".join(f"{v:.3f}" for v in med) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--json", action="store_true", help="print one JSON line of results")
    ap.add_argument("--baseline", type=Path, metavar="CHECKOUT", help="before vs after")
    ap.add_argument("--rounds", type=int, default=3, help="with --baseline: runs of each")
    args = ap.parse_args()
    if args.baseline is not None:
        side_by_side(args.baseline, args.rounds, args.requests)
        return
    if args.json:
        print(json.dumps(run_all(args.requests)))
        return
    base = rss_mb()
    print(
        f"{'endpoints':>9} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8} {'CPU p50':>8} {'CPU p99':>8}"
    )
    for r in run_all(args.requests):
        print(
            f"{r['endpoints']:>9} {r['p50_ms']:>8.3f} {r['p99_ms']:>8.3f} {r['mean_ms']:>8.3f}"
            f" {r['cpu_p50_ms']:>8.3f} {r['cpu_p99_ms']:>8.3f}"
        )
    keep = build(1000)  # noqa: F841  (held so the RSS below includes a 1000-endpoint pool)
    print(
        f"RSS with a 1000-endpoint pool: {rss_mb():.1f} MB "
        f"(interpreter + libraries at start: {base:.1f} MB)"
    )


if __name__ == "__main__":
    main()
