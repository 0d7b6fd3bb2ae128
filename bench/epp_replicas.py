"""Throughput of 1, 2 and 4 `epp serve` processes behind one Envoy (active-active), and
of one EPP serving TLS on ext_proc, on this machine.

One `epp sim --replicas 8` process with a zero-latency model (bench/overhead.py's
SIM_ARGS: it answers as fast as its HTTP stack can) is the pool for the whole run. Each
window starts a fresh stack of K EPPs (defaults, response path on, every EPP scraping
all 8 replicas every `--scrape-interval`: K replicas put K times the scrape load on the
servers, so on a starved machine the default 50 ms makes the simulator miss scrapes and
the EPPs answer 503; `--staleness` and the scrape timeout, half of it, are raised for the
same reason) behind one real Envoy whose
ext_proc cluster lists them all (`epp.harness.localstack.start_epps_behind_envoy`, the
shape of deploy/envoy/envoy-replicas.yaml), drives it with bench/overhead.py's closed-loop
load generator (`--concurrency` keep-alive connections, ~300-byte completions, 1 output
token) and stops it. The configurations run in rotating order every round, so drift on a
shared machine hits all alike; each round's ratio to the same round's 1-EPP window is
taken, and the medians over rounds are reported with the load average before and after.

CPU time per request says more than req/s on a shared machine (a starved window serves
fewer requests, but each costs about the same CPU): per window the EPPs' and Envoy's CPU
milliseconds per completed request, and the EPPs' again net of what they burn idle
(scraping the pool), sampled over `--idle` seconds before the load starts with the stack
up and no requests; K EPPs idle K times the scrape loop, so only the net figure compares
across K.

    .venv/bin/python bench/epp_replicas.py [--rounds 3] [--duration 8] [--concurrency 32]
        [--configs 1,2,4,1tls]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # run as a script: the bench package beside it
    sys.path.insert(0, str(HERE.parent))

from bench import overhead  # noqa: E402
from epp.harness.localstack import start_epps_behind_envoy  # noqa: E402
from epp.harness.procs import ProcessGroup  # noqa: E402

OVERHEAD = overhead


def parse_config(text: str) -> tuple[int, bool]:
    """'2' → 2 EPPs plaintext; '1tls' → 1 EPP over TLS."""
    tls = text.endswith("tls")
    n = int(text.removesuffix("tls"))
    if n < 1:
        raise ValueError(f"config {text!r}: at least one EPP")
    return n, tls


def label(text: str) -> str:
    n, tls = parse_config(text)
    return f"{n} EPP{'s' if n > 1 else ''}" + (" (TLS)" if tls else "")


def window(
    sim_pg: ProcessGroup, hostports: list[str], config: str, args: argparse.Namespace
) -> dict[str, Any]:
    """A fresh stack of this config, one load window against it, its numbers."""
    n, tls = parse_config(config)
    endpoints = [f"--endpoint=sim-{i}={hp}" for i, hp in enumerate(hostports)]
    endpoints += ["--refresh-metrics-interval", str(args.scrape_interval)]
    endpoints += ["--metrics-staleness-threshold", str(args.staleness)]
    endpoints += ["--scrape-timeout", str(args.staleness / 2)]
    with ProcessGroup() as pg:
        envoy, metrics = start_epps_behind_envoy(pg, endpoints, n_epps=n, tls=tls)
        for port in metrics:
            OVERHEAD._wait_until(
                lambda p=port: OVERHEAD._healthy_endpoints(p) == len(hostports), "EPP", 60
            )
        url = envoy.url + "/v1/completions"
        OVERHEAD._check_route(url)
        epp_pids = [p.pid for p in pg.processes if p.name.startswith("epp")]
        idle0, t0 = sum(OVERHEAD.cpu_seconds(p) for p in epp_pids), time.perf_counter()
        time.sleep(args.idle)
        idle_cores = (sum(OVERHEAD.cpu_seconds(p) for p in epp_pids) - idle0) / (
            time.perf_counter() - t0
        )
        pids = {p.name: p.pid for p in pg.processes if p.name.startswith("epp")}
        pids |= {"envoy": envoy.process.pid, "sim": sim_pg.processes[0].pid}
        argv = [
            sys.executable, str(HERE / "overhead.py"), "_loadgen", "--url", url,
            "--concurrency", str(args.concurrency), "--warmup", str(args.warmup),
            "--duration", str(args.duration), *[f"--watch={k}={v}" for k, v in pids.items()],
        ]  # fmt: skip
        proc = pg.spawn("loadgen", argv)
        assert proc.popen is not None
        proc.popen.wait(timeout=args.warmup + args.duration + 120)
        if proc.returncode != 0:
            raise proc.died_error("during a load window")
        raw = json.loads(proc.output().strip().splitlines()[-1])
    lat = sorted(raw["latencies"])
    done, elapsed, cpu = len(lat), raw["elapsed"], raw["cpu"]
    epp_cpu = sum(v for k, v in cpu.items() if k.startswith("epp"))
    ours = sum(v for k, v in cpu.items() if k != "machine")
    return {
        "rps": done / elapsed,
        "p50_ms": lat[done // 2] * 1e3 if done else float("nan"),
        "errors": raw["errors"],
        "epp_cores": epp_cpu / elapsed,
        "envoy_cores": cpu["envoy"] / elapsed,
        "foreign_cores": max(0.0, cpu["machine"] - ours) / elapsed,
        # CPU ms per completed request (NaN if none completed)
        "epp_ms_per_req": epp_cpu * 1e3 / done if done else float("nan"),
        "epp_net_ms_per_req": (
            max(0.0, epp_cpu - idle_cores * elapsed) * 1e3 / done if done else float("nan")
        ),
        "envoy_ms_per_req": cpu["envoy"] * 1e3 / done if done else float("nan"),
        "epp_idle_cores": idle_cores,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=8.0, help="measured seconds per window")
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument(
        "--idle", type=float, default=3.0, help="seconds the EPPs' idle CPU is sampled (3)"
    )
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--configs", default="1,2,4,1tls", help="comma list: N EPPs, Ntls = TLS")
    ap.add_argument("--scrape-interval", type=float, default=0.25, help="EPP scrape period (0.25)")
    ap.add_argument("--staleness", type=float, default=10.0, help="EPP staleness threshold (10)")
    ap.add_argument("--json", help="write every window's numbers here")
    args = ap.parse_args(argv)
    configs = args.configs.split(",")
    for c in configs:
        parse_config(c)
    if "1" not in configs:
        ap.error("--configs must include 1 (the baseline of the ratios)")
    load_before = os.getloadavg()
    rows: dict[str, list[dict[str, Any]]] = {c: [] for c in configs}
    with ProcessGroup() as sim_pg:
        _, hostports = OVERHEAD.start_sims(sim_pg)
        for r in range(args.rounds):
            order = configs[r % len(configs) :] + configs[: r % len(configs)]
            for c in order:
                row = window(sim_pg, hostports, c, args)
                rows[c].append(row)
                sys.stderr.write(
                    f"{time.strftime('%H:%M:%S')} round {r + 1} {label(c)}: {row['rps']:.0f} "
                    f"req/s, p50 {row['p50_ms']:.1f} ms, EPP {row['epp_cores']:.2f} cores, "
                    f"EPP {row['epp_net_ms_per_req']:.2f} CPU-ms/req net of idle, "
                    f"errors {row['errors']}\n"
                )
    load_after = os.getloadavg()
    print(table(rows, configs, args, load_before, load_after))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


def table(rows, configs, args, load_before, load_after) -> str:
    base = rows["1"]
    out = [
        f"{os.cpu_count()} CPUs; load average (1/5/15 min) before "
        f"{'/'.join(f'{x:.2f}' for x in load_before)}, after "
        f"{'/'.join(f'{x:.2f}' for x in load_after)}; {args.rounds} rounds x "
        f"{args.duration:g} s, concurrency {args.concurrency}, scrape every "
        f"{args.scrape_interval:g} s; medians",
        "",
        "| EPPs | req/s | ratio to 1 EPP (same round) | p50 ms | EPP cores | Envoy cores "
        "| other load (cores) | EPP CPU-ms/req | EPP CPU-ms/req net of idle (idle cores) "
        "| Envoy CPU-ms/req | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in configs:
        rs = rows[c]
        ratio = statistics.median(r["rps"] / b["rps"] for r, b in zip(rs, base, strict=True))
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        out.append(
            f"| {label(c)} | {med['rps']:.0f} | {ratio:.2f} | {med['p50_ms']:.1f} | "
            f"{med['epp_cores']:.2f} | {med['envoy_cores']:.2f} | {med['foreign_cores']:.2f} "
            f"| {med['epp_ms_per_req']:.2f} | {med['epp_net_ms_per_req']:.2f} "
            f"({med['epp_idle_cores']:.3f}) | {med['envoy_ms_per_req']:.2f} "
            f"| {sum(r['errors'] for r in rs)} |"
        )
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
