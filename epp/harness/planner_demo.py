"""`epp demo --planner`: a time-compressed slice of a trace through Envoy and the EPP
while the planner scales `epp sim` replicas up and down.

The EPP runs in this process (`EppServer` with a planner file written here: mode load,
a short adjustment interval, the local connector); Envoy is a real child process. The
trace's arrivals are replayed `--speedup` times faster, thinned to `--sample` of them
(a laptop cannot take the full rate), each with `max_tokens` = its output length capped
at 64. After the slice the timeline goes on with no traffic (`--cooldown`) until the
pool is back at min-endpoint, so the scale-down after the peak shows as well as the
scale-up. Prints one line per adjustment interval (replicas, rate, TTFT/ITL p90),
writes a PNG if matplotlib is installed, and ends with the verdict line: failed
requests and GPU-hours (in trace time) against a static pool sized for the peak.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from epp.harness.envoy import EnvoyOptions, astart_envoy
from epp.harness.procs import ProcessGroup
from epp.planner.core.config import load_planner_file
from epp.planner.tracefile import load_trace
from epp.serve import EppServer, ServeOptions

DEFAULT_TRACE = "../shared/traces/azure-llm-conv-2023.csv"
# A request that waits in a queue is slow, not failed: on a shared machine a simulator
# may get a sliver of the CPU for a while, and the demo counts failures, not patience.
CLIENT_TIMEOUT = aiohttp.ClientTimeout(total=600)
SIM = "epp sim --port {port} --max-num-seqs 2 --decode-ms-per-token 8 --prefill-ms-per-token 0.02"


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("--planner")
    g.add_argument(
        "--trace", default=DEFAULT_TRACE, help=f"Azure CSV or Mooncake JSONL ({DEFAULT_TRACE})"
    )
    g.add_argument("--trace-seconds", type=float, default=600, help="slice of the trace (600)")
    g.add_argument("--speedup", type=float, default=20, help="trace seconds per wall second (20)")
    g.add_argument("--sample", type=float, default=0.05, help="share of arrivals sent (0.05)")
    g.add_argument("--interval", type=float, default=3, help="adjustment interval, wall s (3)")
    g.add_argument("--max-replicas", type=int, default=4, help="max-gpu-budget (4)")
    g.add_argument(
        "--cooldown", type=float, default=300,
        help="after the slice, wall seconds at most of no traffic while the pool drains "
        "its backlog and scales back down to one replica (300; it ends once it is there)",
    )  # fmt: skip
    g.add_argument("--png", default="planner-demo.png", help="timeline plot (planner-demo.png)")


@dataclass
class Row:
    t: float
    replicas: int
    sent: int = 0
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)


def p90(v: list[float]) -> str:
    if not v:
        return "    -"
    s = sorted(v)
    return f"{s[max(0, int(0.9 * len(s) + 0.999) - 1)] * 1000:5.0f}"


async def _one(session, url: str, body: dict, rows: list[Row], failures: list[str]) -> None:
    start = time.monotonic()
    first = last = None
    n = 0
    try:
        async with session.post(url + "/v1/completions", json=body) as r:
            async for _chunk in r.content.iter_any():
                now = time.monotonic()
                first = first or now
                last, n = now, n + 1
            if r.status != 200:
                failures.append(str(r.status))
                return
    except (aiohttp.ClientError, TimeoutError) as e:
        failures.append(type(e).__name__)
        return
    row = rows[-1]
    if first is not None:
        row.ttft.append(first - start)
        if n > 1 and last is not None:
            row.itl.append((last - first) / (n - 1))


async def demo(args: argparse.Namespace) -> int:
    arrivals = [a for a in load_trace(args.trace) if a.t_s < args.trace_seconds]
    step = max(1, round(1 / args.sample))
    arrivals = arrivals[::step]
    tmp = Path(tempfile.mkdtemp(prefix="epp-planner-demo-"))
    keys = {
        "mode": "load", "adjustment-interval": args.interval, "metric-pulling-interval": 0.5,
        "min-endpoint": 1, "max-gpu-budget": args.max_replicas,
        "decode-kv-scale-up-threshold": 0.1, "decode-kv-scale-down-threshold": 0.05,
        "worker-command": SIM, "statefile": str(tmp / "state.json"),
        "log-dir": str(tmp), "drain-timeout": 60,
    }  # fmt: skip
    cfg = load_planner_file("\n".join(f"{k}: {json.dumps(v)}" for k, v in keys.items()))
    opts = ServeOptions(host="127.0.0.1", grpc_port=0, health_port=0, metrics_port=0,
                        planner=cfg, pool_name="demo")  # fmt: skip
    server = EppServer(opts)
    failures: list[str] = []
    rows: list[Row] = []
    await server.start()
    try:
        conn = server.planner.connector  # type: ignore[union-attr]
        await conn.settle()  # type: ignore[attr-defined]
        async with ProcessGroup() as pg:
            envoy = await astart_envoy(
                pg,
                EnvoyOptions.loopback(server.grpc_port, server.health_port),
                timeout=60,
            )
            wall = args.trace_seconds / args.speedup
            print(
                f"replaying {len(arrivals)} requests ({args.trace_seconds:g} s of trace in "
                f"{wall:.0f} s); one line per {args.interval:g} s interval",
                flush=True,
            )
            print("   t(s)  replicas  req/s  TTFT p90 ms  ITL p90 ms", flush=True)
            t0 = time.monotonic()

            def holding() -> int:
                return sum(r.holding_gpus for r in conn.replicas().values())

            rows.append(Row(0.0, holding()))
            tasks = []
            async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as s:
                next_row = args.interval
                for a in arrivals:
                    due = a.t_s / args.speedup
                    while (now := time.monotonic() - t0) < due:
                        if now >= next_row:
                            _print(rows[-1], args.interval)
                            rows.append(Row(next_row, holding()))
                            next_row += args.interval
                        await asyncio.sleep(min(0.01, due - now))
                    rows[-1].sent += 1
                    body = {"model": "tiny", "prompt": "x " * min(a.isl, 512),
                            "max_tokens": max(1, min(a.osl, 64)), "stream": True,
                            "ignore_eos": True}  # fmt: skip
                    tasks.append(asyncio.create_task(_one(s, envoy.url, body, rows, failures)))
                # the slice is over: no new traffic; the pool drains its backlog and
                # scales back down (one row per interval, as before)
                print(f"  (end of the trace slice: no new requests; up to {args.cooldown:g} s "
                      "more while the pool scales down)", flush=True)  # fmt: skip
                pending = asyncio.gather(*tasks)
                end = time.monotonic() + args.cooldown
                while time.monotonic() < end:
                    if (now := time.monotonic() - t0) >= next_row:
                        _print(rows[-1], args.interval)
                        rows.append(Row(next_row, holding()))
                        next_row += args.interval
                        if pending.done() and rows[-1].replicas <= 1:
                            break
                    await asyncio.sleep(0.02)
                await pending
            _print(rows[-1], args.interval)
    finally:
        await server.stop()
    return _verdict(args, rows, failures, len(arrivals))


def _print(row: Row, interval: float) -> None:
    print(f"{row.t:7.0f}  {row.replicas:8d}  {row.sent / interval:5.1f}  "
          f"{p90(row.ttft):>11}  {p90(row.itl):>10}", flush=True)  # fmt: skip


def _verdict(args: argparse.Namespace, rows: list[Row], failures: list[str], total: int) -> int:
    # GPU-hours in trace time: each row's replicas held for one interval of wall time,
    # × speedup; static: the peak count held for the whole slice.
    hours = sum(r.replicas for r in rows) * args.interval * args.speedup / 3600
    peak = max(r.replicas for r in rows)
    after = rows[[r.replicas for r in rows].index(peak) :]
    static = peak * len(rows) * args.interval * args.speedup / 3600
    _plot(args.png, rows, args.interval)
    print(f"replicas: peak {peak}, then down to {min(r.replicas for r in after)}")
    print(f"planner demo: {len(failures)} failed requests of {total}; "
          f"{hours:.2f} GPU-hours vs {static:.2f} static at peak ({peak} replicas)")  # fmt: skip
    return 0 if not failures else 1


def _plot(path: str, rows: list[Row], interval: float) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(no matplotlib: no PNG)")
        return
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ts = [r.t for r in rows]
    ax.step(ts, [r.replicas for r in rows], where="post", label="replicas")
    ax2 = ax.twinx()
    ax2.plot(ts, [r.sent / interval for r in rows], color="tab:orange", label="req/s")
    ax.set_xlabel("wall seconds")
    ax.set_ylabel("replicas")
    ax2.set_ylabel("requests / s")
    fig.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"timeline written to {path}")


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(demo(args))
    except KeyboardInterrupt:
        print("\ninterrupted; every process the demo started has been stopped")
        return 130
