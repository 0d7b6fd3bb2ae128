"""What scraping costs an idle pool: CPU of N simulated servers and of the EPP per scrape
setting (fixed intervals and the adaptive one), no traffic, side by side in one run.

    .venv/bin/python bench/scrape_cost.py --settings 0.05,0.25,1.0,0.05-1.0 --seconds 20

Each setting gets a fresh `epp sim --replicas N` process and an `epp serve` scraping it
(no Envoy, no requests: what remains is the scrape traffic). CPU is user + system time
from /proc over the measured window, in cores. "a-b" is adaptive: --refresh-metrics-interval
a, --refresh-metrics-max-interval b. An idle server's state does not change, so the
adaptive setting settles at b; under traffic it scrapes at a while the state moves.

`--baseline CHECKOUT` adds, per setting, the same measurement with CHECKOUT's `epp` (e.g.
main's worktree, before a change), interleaved `--rounds` times (medians): old and new
side by side in one run. EPP CPU is then also given per scrape (the EPP's /metrics
counter of scrapes is not read: the rate is servers / interval for a fixed interval).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from epp.harness.procs import HttpReady, LogReady, ProcessGroup, free_port, free_port_range

EPP_CMD = [sys.executable, "-m", "epp.cli"]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(
    setting: str, servers: int, seconds: float, checkout: Path | None = None
) -> tuple[float, float]:
    """(servers' CPU, EPP CPU) in cores; `checkout`: run that checkout's epp serve."""
    lo, _, hi = setting.partition("-")
    with ProcessGroup() as pg:
        base = free_port_range(servers)
        argv = [*EPP_CMD, "sim", "--replicas", str(servers), "--port", str(base)]
        urls = [f"http://127.0.0.1:{base + i}" for i in range(servers)]
        sim = pg.start("sims", argv, ready=HttpReady(urls[-1] + "/health"), timeout=90)
        eps = [f"--endpoint=s{i}=127.0.0.1:{base + i}" for i in range(servers)]
        argv = [*EPP_CMD, "serve", "--host", "127.0.0.1", "--grpc-port", str(free_port())]
        argv += ["--health-port", str(free_port()), "--metrics-port", str(free_port()), *eps]
        argv += ["--refresh-metrics-interval", lo]
        if hi:
            argv += ["--refresh-metrics-max-interval", hi]
        env = {"PYTHONPATH": str(checkout)} if checkout is not None else None
        epp = pg.start(
            "epp", argv, ready=LogReady(r"epp serving ext_proc"), timeout=60, env=env, cwd=checkout
        )
        time.sleep(3)  # past start-up (and the adaptive back-off)
        s0, e0, t0 = cpu_seconds(sim.pid), cpu_seconds(epp.pid), time.perf_counter()
        time.sleep(seconds)
        wall = time.perf_counter() - t0
        return (cpu_seconds(sim.pid) - s0) / wall, (cpu_seconds(epp.pid) - e0) / wall


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--settings", default="0.05,0.25,1.0,0.05-1.0")
    p.add_argument("--servers", type=int, default=8)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--baseline", type=Path, metavar="CHECKOUT", help="old vs new, one run")
    p.add_argument("--rounds", type=int, default=3, help="with --baseline: runs of each")
    args = p.parse_args()
    if args.baseline is not None:
        return side_by_side(args)
    print("| scraping | servers' CPU (cores) | EPP CPU (cores) |\n|---|---:|---:|")
    for setting in args.settings.split(","):
        sim, epp = measure(setting, args.servers, args.seconds)
        label = f"adaptive {setting.replace('-', '–')} s" if "-" in setting else f"{setting} s"
        print(f"| {label} | {sim:.3f} | {epp:.3f} |", flush=True)
    return 0


def side_by_side(args: argparse.Namespace) -> int:
    print(
        "| scraping | EPP | servers' CPU (cores) | EPP CPU (cores) | EPP CPU ms per scrape |\n"
        "|---|---|---:|---:|---:|"
    )
    for setting in args.settings.split(","):
        got: dict[str, list[tuple[float, float]]] = {"before": [], "after": []}
        for r in range(args.rounds):
            order = [("before", args.baseline), ("after", None)]
            for label, checkout in order if r % 2 == 0 else order[::-1]:
                got[label].append(measure(setting, args.servers, args.seconds, checkout))
        lo = float(setting.partition("-")[0])
        for label in ("before", "after"):
            sim = statistics.median(x[0] for x in got[label])
            epp = statistics.median(x[1] for x in got[label])
            per = f"{epp * 1e3 / (args.servers / lo):.3f}" if "-" not in setting else "—"
            print(f"| {setting} s | {label} | {sim:.3f} | {epp:.3f} | {per} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
