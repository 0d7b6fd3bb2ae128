"""CPU per scrape of the EPP's metrics scraper, as `epp serve` runs it, against a real
`epp sim --replicas N` (vLLM-shaped /metrics pages, ~25 KB each).

    .venv/bin/python bench/scrape_cpu.py [--servers 8] [--seconds 10]
    .venv/bin/python bench/scrape_cpu.py --baseline ../main     # old vs new, one run

A scraper scrapes every server every `--interval` for `--seconds` into a datastore that
counts the results it receives; the figure is this process's CPU time (every thread:
`time.process_time`) per result. It is robust to a busy machine where `bench/scrape_cost.py`
is not: when the servers are starved they answer fewer scrapes, and CPU per scrape stays
what it is while CPU per second falls. The scraper runs as the checkout's `epp serve` runs
it: `ScraperThread` (its own thread) when the checkout has it, else `MetricsScraper` on
the loop. With `--baseline CHECKOUT` the measurement runs in subprocesses, alternately with
this checkout's `epp` and CHECKOUT's, `--rounds` times each, against one simulator.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from epp.datalayer.loopclock import LoopClock
from epp.datalayer.scraper import ScrapeConfig
from epp.datastore import Datastore, Endpoint, EndpointMetrics
from epp.harness.procs import LogReady, ProcessGroup


class CountingDatastore(Datastore):
    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.updates = 0
        self.failures = 0

    def update_metrics(self, name: str, metrics: EndpointMetrics) -> None:
        self.updates += 1
        super().update_metrics(name, metrics)

    def mark_scrape_failed(self, name: str, error: str) -> None:
        self.failures += 1
        super().mark_scrape_failed(name, error)


async def measure(hostports: list[str], interval: float, seconds: float) -> dict[str, object]:
    clock = LoopClock()
    clock.start()
    ds = CountingDatastore(clock=clock.now)
    eps = []
    for i, hp in enumerate(hostports):
        host, _, port = hp.rpartition(":")
        eps.append(Endpoint(f"sim-{i}", host, int(port)))
    ds.set_endpoints(eps)
    config = ScrapeConfig(interval=interval)
    try:
        from epp.datalayer.scrape_thread import ScraperThread

        scraper: object = ScraperThread(ds, config)
        kind = "ScraperThread"
    except ImportError:  # a checkout from before the scraper had its thread
        from epp.datalayer.scraper import MetricsScraper

        scraper = MetricsScraper(ds, config)
        kind = "MetricsScraper on the loop"
    scraper.start()  # type: ignore[attr-defined]
    await asyncio.sleep(2.0)  # connections made, pages seen once
    c0, n0, f0, t0 = time.process_time(), ds.updates, ds.failures, time.perf_counter()
    await asyncio.sleep(seconds)
    c1, n1, f1, t1 = time.process_time(), ds.updates, ds.failures, time.perf_counter()
    await scraper.stop()  # type: ignore[attr-defined]
    await clock.stop()
    scrapes = n1 - n0
    return {
        "kind": kind,
        "scrapes": scrapes,
        "failures": f1 - f0,
        "scrapes_per_s": scrapes / (t1 - t0),
        "cpu_ms_per_scrape": (c1 - c0) * 1e3 / max(scrapes, 1),
        "cpu_cores": (c1 - c0) / (t1 - t0),
    }


def child(checkout: Path | None, hostports: list[str], args: argparse.Namespace) -> dict:
    env = dict(os.environ)
    if checkout is not None:
        env["PYTHONPATH"] = str(checkout)
    argv = [
        sys.executable, str(Path(__file__).resolve()), "--json", "--targets", ",".join(hostports),
        "--interval", str(args.interval), "--seconds", str(args.seconds),
    ]  # fmt: skip
    out = subprocess.run(argv, env=env, cwd=checkout, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def start_sim(pg: ProcessGroup, servers: int) -> list[str]:
    argv = [sys.executable, "-m", "epp.cli", "sim", "--replicas", str(servers), "--port", "0"]
    proc = pg.start("sim", argv, ready=LogReady(f"sim sim-{servers - 1} listening on"), timeout=90)
    lines = proc.output().splitlines()
    return [ln.split()[-1].removeprefix("http://") for ln in lines if " listening on " in ln]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servers", type=int, default=8)
    ap.add_argument("--interval", type=float, default=0.05)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--baseline", type=Path, metavar="CHECKOUT")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--targets", help=argparse.SUPPRESS)  # child: host:port,...
    args = ap.parse_args()
    if args.targets:
        result = asyncio.run(measure(args.targets.split(","), args.interval, args.seconds))
        print(json.dumps(result))
        return
    with ProcessGroup() as pg:
        hostports = start_sim(pg, args.servers)
        if args.baseline is None:
            print(json.dumps(child(None, hostports, args)))
            return
        got: dict[str, list[dict]] = {"before": [], "after": []}
        for r in range(args.rounds):
            order = [("before", args.baseline), ("after", None)]
            for label, checkout in order if r % 2 == 0 else order[::-1]:
                got[label].append(child(checkout, hostports, args))
                print(f"round {r + 1} {label}: {got[label][-1]}", flush=True)
    print(
        f"\n{args.servers} servers every {args.interval:g} s, {args.seconds:g} s windows, "
        f"medians of {args.rounds}\n\n"
        "| scraper | scrapes/s | CPU ms per scrape | CPU cores |\n|---|---:|---:|---:|"
    )
    for label in ("before", "after"):
        rows = got[label]
        med = {
            k: statistics.median(r[k] for r in rows)
            for k in ("scrapes_per_s", "cpu_ms_per_scrape", "cpu_cores")
        }
        print(
            f"| {label}: {rows[0]['kind']} | {med['scrapes_per_s']:.0f} "
            f"| {med['cpu_ms_per_scrape']:.3f} | {med['cpu_cores']:.3f} |"
        )


if __name__ == "__main__":
    main()
