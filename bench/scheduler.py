"""Scheduling latency per request at 10, 100 and 1000 endpoints, and the EPP's RSS.

Measures `Director.route` (candidate selection + the default profile: queue and KV-cache
scorers, max-score picker + in-flight accounting), the whole per-request scheduling
work, over endpoints with varied metrics. Run: `.venv/bin/python bench/scheduler.py`.
RSS is read from /proc/self/status after building the 1000-endpoint pool and routing.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import time

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


def measure(n: int, requests: int, status_ring: bool = False) -> dict[str, float]:
    director = build(n)
    if status_ring:  # as `epp serve` wires it: the status page's ring of recent decisions
        from epp.status.ring import DecisionRing

        director.decision_sinks.append(DecisionRing().record)
    body = json.dumps({"model": "m", "prompt": "hello " * 200}).encode()
    samples = []
    gc.collect()
    for _ in range(requests):
        req = parse_body(new_request({REQUEST_ID: "r"}, "/v1/completions", "POST"), body)
        t0 = time.perf_counter()
        decision = director.route(req, None)
        samples.append(time.perf_counter() - t0)
        director.release(decision)
    samples.sort()
    return {
        "endpoints": n,
        "requests": requests,
        "p50_ms": samples[len(samples) // 2] * 1e3,
        "p99_ms": samples[int(len(samples) * 0.99)] * 1e3,
        "mean_ms": statistics.fmean(samples) * 1e3,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument(
        "--status-ring",
        action="store_true",
        help="record each decision in the status page's ring, as epp serve does",
    )
    args = ap.parse_args()
    base = rss_mb()
    print(f"{'endpoints':>9} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8}")
    for n in (10, 100, 1000):
        count = args.requests if n < 1000 else max(1000, args.requests // 5)
        r = measure(n, count, args.status_ring)
        print(f"{r['endpoints']:>9} {r['p50_ms']:>8.3f} {r['p99_ms']:>8.3f} {r['mean_ms']:>8.3f}")
    keep = build(1000)  # noqa: F841  (held so the RSS below includes a 1000-endpoint pool)
    print(
        f"RSS with a 1000-endpoint pool: {rss_mb():.1f} MB "
        f"(interpreter + libraries at start: {base:.1f} MB)"
    )


if __name__ == "__main__":
    main()
