"""The body-budget attack: can one client lock everyone out by holding request bodies?

Through the real stack (simulators, `epp serve`, Envoy on loopback), `--conns` connections
each send `--mib` MiB of a body that never ends and hold it; meanwhile `--good` ordinary
small completions are sent from another address (127.0.0.1, 4 at a time) and every
non-200 counted. Setups:

- `global`: the budget as before its shares (one server-wide --max-buffered-bytes; the
  shares switched off with flags): whoever fills it first locks everyone out;
- `shares`: the defaults (per-connection 1/8, per-source 1/4, 1/8 reserved for bodies
  up to 1 MiB, minimum body rate 64 KiB/s after 5 s);

each against an attacker on one address and on `--conns` addresses (a botnet). Then the
memory probe: `--rss-conns` connections each holding `--rss-mib` MiB, the EPP's RSS (VmRSS)
before, at the peak while held, and 5 s after the connections closed.

    .venv/bin/python bench/body_flood.py [--out docs/data/results/body_flood.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from urllib.parse import urlparse

from bench.results import Result
from epp.harness.body_flood import attack_sources, good_traffic, hold_bodies, rss_bytes
from epp.harness.localstack import LocalStack

MiB = 1 << 20
SHARES_OFF = [
    f"--max-buffered-bytes-per-source={256 * MiB}",
    f"--max-buffered-bytes-per-connection={256 * MiB}",
    "--small-body-reserve-bytes=0",
    "--min-body-rate=0",
]
SIM_ARGS = ["--decode-ms-per-token", "1"]


async def attack(stack: LocalStack, conns: int, mib: int, spread: bool, good: int) -> dict:
    u = urlparse(stack.url)
    held = await hold_bodies(u.hostname, u.port, attack_sources(conns, spread), mib * MiB)
    traffic = await good_traffic(stack.url, good)
    refused = sum(h.status is not None for h in held)
    for h in held:
        h.close()
    return {
        "held": conns - refused,
        "refused": refused,
        "good_sent": traffic.sent,
        "good_errors": sum(traffic.errors.values()),
        "error_statuses": traffic.errors,
    }


async def rss_probe(stack: LocalStack, conns: int, mib: int, spread: bool) -> dict:
    pid = stack.epp.pid
    before = rss_bytes(pid)
    peak = before
    u = urlparse(stack.url)
    sampling = True

    async def sample() -> None:
        nonlocal peak
        while sampling:
            peak = max(peak, rss_bytes(pid))
            await asyncio.sleep(0.05)

    sampler = asyncio.create_task(sample())
    held = await hold_bodies(u.hostname, u.port, attack_sources(conns, spread), mib * MiB)
    await asyncio.sleep(1.0)
    refused = sum(h.status is not None for h in held)
    for h in held:
        h.close()
    closed_at = time.monotonic()
    await asyncio.sleep(5.0)
    after = rss_bytes(pid)
    sampling = False
    await sampler
    del closed_at
    return {
        "held": conns - refused,
        "rss_before_mib": round(before / MiB),
        "rss_peak_rise_mib": round((peak - before) / MiB),
        "rss_after_5s_rise_mib": round((after - before) / MiB),
    }


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--conns", type=int, default=32)
    ap.add_argument("--mib", type=int, default=8)
    ap.add_argument("--good", type=int, default=200)
    ap.add_argument("--rss-conns", type=int, default=60)
    ap.add_argument("--rss-mib", type=int, default=30)
    ap.add_argument("--setups", default="global,shares")
    ap.add_argument("--epp-env", default="", help="extra env for the EPP, NAME=VALUE,...")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    rows = []
    for setup in args.setups.split(","):
        epp_args = SHARES_OFF if setup == "global" else []
        for spread in (False, True):
            with LocalStack(n_sims=2, sim_args=SIM_ARGS, epp_args=epp_args) as stack:
                await good_traffic(stack.url, 8)  # warm
                r = await attack(stack, args.conns, args.mib, spread, args.good)
            with LocalStack(n_sims=2, sim_args=SIM_ARGS, epp_args=epp_args) as stack:
                await good_traffic(stack.url, 8)  # warm, as above
                m = await rss_probe(stack, args.rss_conns, args.rss_mib, spread)
            where = f"{args.conns} addresses" if spread else "1 address"
            row = [
                setup,
                where,
                r["held"],
                r["refused"],
                r["good_sent"],
                r["good_errors"],
                m["held"],
                m["rss_peak_rise_mib"],
                m["rss_after_5s_rise_mib"],
            ]
            print(row, r["error_statuses"], flush=True)
            rows.append(row)
    command = "bench/body_flood.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out" and v
    )
    columns = [
        "budget",
        "attacker",
        "bodies held",
        "bodies refused",
        "good sent",
        "good errors",
        f"held of {args.rss_conns}x{args.rss_mib} MiB",
        "RSS peak rise MiB",
        "RSS rise 5 s after MiB",
    ]
    result = Result.measured(
        "body_flood", "Holding request bodies: one client against everyone else", command,
        columns, rows,
    ).to_json()  # fmt: skip
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
