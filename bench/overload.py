"""Overload: critical + sheddable traffic at 2x the pool's capacity, with and without flow
control.

Pool: `--sims` `epp sim` processes with `--max-num-seqs` slots each. Capacity is
measured at the start of every repeat, in the first setup's fresh stack (closed loop: 2
clients per slot for `--calib-s` seconds: completions per second), unless `--rate` is
given: on the shared machine it drifts from minute to minute. Workload (seeded, the same
for the setups of a repeat): Poisson arrivals at `--load` x capacity for `--duration-s`;
a `--critical-share` of them carry `x-gateway-inference-objective: critical` (priority
100), the rest `batch` (priority -1, sheddable). Streamed; the client measures TTFT
(first token chunk), and for a refused request the time to its status.

Setups, run in turn within each of `--repeats` repeats (same machine, same minutes):
- `flow`: `config/flow-control.yaml` with `maxConcurrency` = the sims' slots, objectives;
- `none`: the default config and no objectives (no flow control, no objectives);
- `legacy` (optional): default config + objectives: sheddable 429 when the scraped
  utilization detector says saturated, no queue in the EPP.
- `evict-off` / `evict-on` (optional): the `flow` config with sheddable requests let
  through up to full saturation (`sheddableThreshold` 1.0, so they can fill the pool), in-flight
  eviction off / on (llm-d-router's `flowControl.enableEviction`): with it on, a critical
  request that finds the pool full of sheddable work evicts the newest of it.

Per setup (median over repeats): critical TTFT p50/p90/p99 and SLO attainment
(TTFT <= `--critical-ttft-ms`), sheddable served / refused counts, time to the 429
(p50/p99), and the ratio none / flow side by side. The load average is printed with it.

    .venv/bin/python bench/overload.py [--repeats 3] [--setups none,flow,legacy]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from epp.harness.localstack import LocalStack

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script
from bench.results import Result, command_line, load_span

ROOT = Path(__file__).resolve().parents[1]
OBJECTIVE = "x-gateway-inference-objective"
DROPPED_REASON = "x-llm-d-request-dropped-reason"
OBJECTIVES = "objectives:\n- {name: critical, priority: 100}\n- {name: batch, priority: -1}\n"


@dataclass(frozen=True)
class Req:
    at: float
    critical: bool
    prompt: str


@dataclass
class Res:
    req: Req
    status: int = 0  # 0: transport error / timeout
    ttft_ms: float = float("nan")
    total_ms: float = float("nan")
    evicted: bool = False  # stopped by the EPP's in-flight eviction (429 or SSE error event)


def workload(a: argparse.Namespace, rate: float) -> list[Req]:
    rng = random.Random(a.seed)
    out, t = [], 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= a.duration_s:
            return out
        words = " ".join(f"w{rng.randrange(5000)}" for _ in range(a.prompt_words))
        out.append(Req(t, rng.random() < a.critical_share, words))


async def one(http: aiohttp.ClientSession, url: str, r: Req, out_tokens: int) -> Res:
    res = Res(r)
    body = {"model": "tiny", "prompt": r.prompt, "max_tokens": out_tokens, "stream": True}
    headers = {OBJECTIVE: "critical" if r.critical else "batch"}
    t0 = time.perf_counter()
    try:
        async with http.post(url + "/v1/completions", json=body, headers=headers) as resp:
            res.status = resp.status
            if resp.status != 200:
                await resp.read()
                res.evicted = resp.headers.get(DROPPED_REASON, "").startswith("evicted")
            else:
                async for line in resp.content:
                    if line.startswith(b'data: {"error"') and b'"evicted"' in line:
                        res.evicted = True
                    elif res.ttft_ms != res.ttft_ms and line.startswith(b"data: {"):
                        res.ttft_ms = (time.perf_counter() - t0) * 1000
    except aiohttp.ClientPayloadError:
        # The response had started, then the stream was reset: an evicted request (its
        # error event may be lost: aiohttp raises before handing over what it buffered).
        res.evicted = res.status == 200
    except (TimeoutError, aiohttp.ClientError):
        res.status = 0
    res.total_ms = (time.perf_counter() - t0) * 1000
    return res


async def drive(url: str, reqs: list[Req], out_tokens: int) -> list[Res]:
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(
        timeout=timeout, connector=aiohttp.TCPConnector(limit=0)
    ) as http:
        start = time.perf_counter()

        async def at(r: Req) -> Res:
            await asyncio.sleep(max(0.0, start + r.at - time.perf_counter()))
            return await one(http, url, r, out_tokens)

        return await asyncio.gather(*(at(r) for r in reqs))


async def calibrate(url: str, clients: int, seconds: float, out_tokens: int) -> float:
    """Completions per second with `clients` closed-loop clients (the pool's capacity)."""
    done = 0
    r = Req(0.0, True, "calibration prompt " * 4)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
        end = time.perf_counter() + seconds

        async def client() -> None:
            nonlocal done
            while time.perf_counter() < end:
                if (await one(http, url, r, out_tokens)).status == 200:
                    done += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        return done / (time.perf_counter() - t0)


def refusals_within(metrics_url: str, le: float) -> float:
    """Share of flow control's 429s (RejectedCapacity) decided within `le` seconds of the
    request reaching it, from the EPP's own histogram (NaN without flow control)."""
    with urllib.request.urlopen(metrics_url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    name = "inference_extension_flow_control_request_queue_duration_seconds"
    within = total = 0.0
    for fam in text_string_to_metric_families(text):
        if fam.name != name:
            continue
        for smp in fam.samples:
            if smp.labels.get("outcome") != "RejectedCapacity":
                continue
            if smp.name == name + "_count":
                total += smp.value
            elif smp.name == name + "_bucket" and float(smp.labels["le"]) == le:
                within += smp.value
    return within / total if total else float("nan")


def epp_counter(metrics_url: str, name: str, reason: str) -> float:
    """A counter's sample with `reason` on the EPP's /metrics (0 when absent)."""
    with urllib.request.urlopen(metrics_url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            if smp.name == name and smp.labels.get("reason") == reason:
                return smp.value
    return 0.0


def pct(xs: list[float], q: float) -> float:
    xs = sorted(x for x in xs if x == x)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def summarise(results: list[Res], slo_ms: float) -> dict:
    crit = [r for r in results if r.req.critical]
    shed = [r for r in results if not r.req.critical]
    ttft = [r.ttft_ms for r in crit if r.status == 200 and not r.evicted]
    refused = [r.total_ms for r in shed if r.status == 429 and not r.evicted]
    return {
        "critical_n": len(crit),
        "critical_ok": len(ttft),
        "critical_ttft_p50": pct(ttft, 0.5),
        "critical_ttft_p90": pct(ttft, 0.9),
        "critical_ttft_p99": pct(ttft, 0.99),
        "critical_slo": sum(r.status == 200 and r.ttft_ms <= slo_ms for r in crit)
        / max(1, len(crit)),
        "sheddable_n": len(shed),
        "sheddable_ok": sum(r.status == 200 and not r.evicted for r in shed),
        "sheddable_ttft_p90": pct([r.ttft_ms for r in shed if r.status == 200], 0.9),
        "sheddable_429": len(refused),
        "sheddable_evicted": sum(r.evicted for r in shed),
        "critical_evicted": sum(r.evicted for r in crit),
        "to_429_p50": pct(refused, 0.5),
        "to_429_p99": pct(refused, 0.99),
        "errors": sum(r.status not in (200, 429) and not r.evicted for r in results),
    }


def stack(a: argparse.Namespace, setup: str, tmp: Path) -> LocalStack:
    sim = ["--max-num-seqs", str(a.max_num_seqs), "--decode-ms-per-token", str(a.decode_ms)]
    sim += ["--prefill-ms-per-token", str(a.prefill_ms)]
    objectives = tmp / "objectives.yaml"
    objectives.write_text(OBJECTIVES)
    if setup in ("flow", "evict-off", "evict-on"):
        text = (ROOT / "config" / "flow-control.yaml").read_text()
        text = text.replace("maxConcurrency: 16", f"maxConcurrency: {a.max_num_seqs}")
        if setup != "flow":
            text = text.replace("sheddableThreshold: 0.75", "sheddableThreshold: 1.0")
            on = "true" if setup == "evict-on" else "false"
            text = text.replace(
                "  usageLimitPolicyPluginRef:",
                f"  enableEviction: {on}\n  usageLimitPolicyPluginRef:",
            )
        cfg = tmp / f"{setup}.yaml"
        cfg.write_text(text)
        epp = ["--config", str(cfg), "--objectives", str(objectives)]
    elif setup == "legacy":
        epp = ["--objectives", str(objectives)]
    else:
        epp = []
    # Eviction needs the in-path response mode (the routing stream open until the end).
    return LocalStack(n_sims=a.sims, sim_args=sim, epp_args=epp, response_path=True)


def results_table(
    a: argparse.Namespace,
    med: dict[str, dict],
    capacities: list[float],
    load_before: tuple[float, ...],
    load_after: tuple[float, ...],
) -> None:
    """The median table as results JSON (`--results`); notes are written by hand after."""
    columns = [
        "setup", "critical TTFT p50 ms", "critical TTFT p90 ms", "critical TTFT p99 ms",
        "critical within SLO", "sheddable served", "sheddable 429", "sheddable evicted",
        "evicted (EPP count)", "sheddable requests", "errors",
    ]  # fmt: skip
    rows = [
        [
            setup,
            round(r["critical_ttft_p50"]),
            round(r["critical_ttft_p90"]),
            round(r["critical_ttft_p99"]),
            round(r["critical_slo"], 3),
            r["sheddable_ok"],
            r["sheddable_429"],
            r["sheddable_evicted"],
            r["epp_evicted"],
            r["sheddable_n"],
            r["errors"],
        ]
        for setup, r in med.items()
    ]
    Result.measured(
        Path(a.results).stem, "Overload with in-flight eviction on and off", command_line(),
        columns, rows, load=load_span(load_before, load_after),
        capacity_rps=[round(c, 2) for c in capacities],
    ).write(a.results)  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--setups", default="none,flow")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--sims", type=int, default=2)
    # Few slow simulated steps keep the CPU the stack needs low (2 x 2 slots / ~1 s per
    # request ≈ 4 req/s nominal); on a busy machine scheduling delays still stretch every
    # step, hence the capacity measured each repeat.
    p.add_argument("--max-num-seqs", type=int, default=2)
    p.add_argument("--decode-ms", type=float, default=60.0)
    p.add_argument("--prefill-ms", type=float, default=0.05)
    p.add_argument("--out-tokens", type=int, default=16)
    p.add_argument("--prompt-words", type=int, default=30)
    p.add_argument("--rate", type=float, default=0.0, help="capacity in req/s (0: measure)")
    p.add_argument("--calib-s", type=float, default=10.0)
    p.add_argument("--load", type=float, default=2.0, help="offered load / capacity")
    p.add_argument("--critical-share", type=float, default=0.3)
    p.add_argument("--critical-ttft-ms", type=float, default=1000.0)
    p.add_argument("--duration-s", type=float, default=40.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--results", default="", help="write the median table as results JSON")
    a = p.parse_args()
    setups = a.setups.split(",")
    load_before = os.getloadavg()
    nominal = a.sims * a.max_num_seqs / (a.out_tokens * a.decode_ms / 1000)
    capacities: list[float] = []
    counts: list[int] = []
    rows: dict[str, list[dict]] = {s: [] for s in setups}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for rep in range(a.repeats):
            # Capacity is measured again each repeat, in the first setup's fresh stack, just
            # before its run: the shared machine's speed drifts from minute to minute, and
            # the same workload (2x that capacity) then goes to every setup of the repeat.
            reqs: list[Req] = []
            for setup in setups:
                with stack(a, setup, tmp) as st:
                    if not reqs:
                        capacity = a.rate or asyncio.run(
                            calibrate(st.url, 2 * a.sims * a.max_num_seqs, a.calib_s, a.out_tokens)
                        )
                        reqs = workload(a, a.load * capacity)
                        capacities.append(capacity)
                        counts.append(len(reqs))
                    results = asyncio.run(drive(st.url, reqs, a.out_tokens))
                    in_epp = refusals_within(st.epp_metrics_url, 0.0005)
                    evicted_in_epp = epp_counter(
                        st.epp_metrics_url, "epp_requests_refused_total", "evicted-priority"
                    )
                row = summarise(results, a.critical_ttft_ms)
                row["epp_429_within_0.5ms"] = in_epp
                row["epp_evicted"] = evicted_in_epp
                rows[setup].append(row)
                info = {"setup": setup, "repeat": rep, "capacity_rps": capacities[-1]}
                print(json.dumps({**info, "requests": len(reqs), **row}), flush=True)
    load_after = os.getloadavg()
    med = {s: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for s, rs in rows.items()}
    print(
        f"\ncapacity measured per repeat {', '.join(f'{c:.2f}' for c in capacities)} req/s "
        f"({nominal:.1f} nominal: slots / decode time), offered {a.load:g}x that, "
        f"{', '.join(map(str, counts))} requests per run, {a.critical_share:.0%} critical; "
        f"critical TTFT SLO {a.critical_ttft_ms:g} ms; medians of {a.repeats} alternating "
        f"repeats; load average {load_before[0]:.1f} before, {load_after[0]:.1f} after "
        f"(2 cores)\n"
    )
    print(
        "| setup | critical TTFT p50 / p90 / p99 ms | critical within SLO | sheddable served "
        "| sheddable 429 | sheddable evicted (client / EPP) | time to 429 p50 / p99 ms "
        "| 429s decided in the EPP < 0.5 ms | errors |"
    )
    print("|---|---|---|---|---|---|---|---|---|")

    def cell(x: float, spec: str) -> str:
        # A setup that refused nothing has no time to a 429: a dash, not "nan".
        return "–" if math.isnan(x) else format(x, spec)

    for s, r in med.items():
        print(
            f"| {s} | {r['critical_ttft_p50']:.0f} / {r['critical_ttft_p90']:.0f} / "
            f"{r['critical_ttft_p99']:.0f} | {r['critical_slo']:.1%} "
            f"| {r['sheddable_ok']:.0f} of {r['sheddable_n']:.0f} | {r['sheddable_429']:.0f} "
            f"| {r['sheddable_evicted']:.0f} / {r['epp_evicted']:.0f} "
            f"| {cell(r['to_429_p50'], '.1f')} / {cell(r['to_429_p99'], '.1f')} "
            f"| {cell(r['epp_429_within_0.5ms'], '.1%')} | {r['errors']:.0f} |"
        )
    if "evict-on" in rows and "evict-off" in rows:
        key = "critical_ttft_p90"
        pairs = zip(rows["evict-on"], rows["evict-off"], strict=True)
        ratios = [off[key] / on[key] for on, off in pairs]
        print(
            f"evict-off / evict-on, critical TTFT p90: median {statistics.median(ratios):.1f}x "
            f"(per repeat: {', '.join(f'{x:.1f}x' for x in ratios)})"
        )
    if a.results:
        results_table(a, med, capacities, load_before, load_after)
    if "flow" in rows and "none" in rows:
        # Paired: each repeat's none / flow ratio (same minute), then their median.
        for q in ("p50", "p90", "p99"):
            key = f"critical_ttft_{q}"
            ratios = [n[key] / f[key] for f, n in zip(rows["flow"], rows["none"], strict=True)]
            print(
                f"none / flow, critical TTFT {q}: median {statistics.median(ratios):.1f}x "
                f"(per repeat: {', '.join(f'{x:.1f}x' for x in ratios)})"
            )


if __name__ == "__main__":
    main()
