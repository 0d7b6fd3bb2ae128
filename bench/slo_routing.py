"""SLO-aware routing vs the default profile vs prefix-aware, on a mixed workload over a
heterogeneous pool.

Pool: `--sims` `epp sim` processes (one `LocalStack` per setup, fresh), the last
`--slow-count` of them `--slow-factor` times slower (decode and prefill ms per token).
Workload (seeded, identical per setup): Poisson arrivals at `--rate` req/s; a
`--chat-share` of short chats (`--chat-words` prompt words, `--chat-out` tokens)
carrying `x-slo-ttft-ms: --chat-ttft-ms` and
`x-slo-tpot-ms: --chat-tpot-ms`, the rest long prompts (`--long-words` words,
`--long-out` tokens) with a loose `x-slo-ttft-ms: --long-ttft-ms`. Streamed; the client
measures TTFT (first token chunk) and TPOT (mean gap between later chunks).

Per setup: SLO attainment (share of requests meeting every SLO they carry, errors count
as misses) per class, goodput (SLO-meeting requests per second of the run), TTFT mean /
p99 per class. The predictor learns during the first `--warmup-s` seconds of traffic
(same traffic for every setup; excluded from the figures).

`--repeats N` runs every setup N times, interleaved (the order rotates each repeat, so
no setup always runs first on a machine that warms up or gets busier), and reports the
median of each figure over the repeats, plus each setup's attainment per repeat.
Setup `slo-nopred` is `config/slo.yaml` without the predictor's plugins
(`bench/slo_configs.py`): llm-d's anchor compares the stack with and without it.
`--setup NAME=CONFIG` adds a setup running `epp serve --config CONFIG` (to compare
variants of a profile without editing config/).

    .venv/bin/python bench/slo_routing.py [--rate 6] [--setups default,prefix,slo] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from epp.harness.localstack import LocalStack

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.slo_configs import NO_PREDICTOR, add_workload_args
from epp.config.variants import write_without_predictor

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {
    # "default": the sticky routing, what config/default.yaml does with a request without
    # targets (config/default.yaml itself now places requests with targets by them)
    "default": ["--config", str(ROOT / "config" / "prefix-aware.yaml")],
    "prefix": ["--config", str(ROOT / "config" / "prefix-aware.yaml")],
    "slo": ["--config", str(ROOT / "config" / "slo.yaml")],
}


@dataclass(frozen=True)
class Req:
    at: float
    cls: str  # "chat" | "long"
    prompt: str
    out: int
    headers: dict


@dataclass
class Res:
    req: Req
    ok: bool = False
    ttft_ms: float = float("nan")
    tpot_ms: float = float("nan")

    def meets(self) -> bool:
        if not self.ok:
            return False
        h = self.req.headers
        if "x-slo-ttft-ms" in h and not self.ttft_ms <= float(h["x-slo-ttft-ms"]):
            return False
        if "x-slo-tpot-ms" in h and self.tpot_ms == self.tpot_ms:  # NaN: one token, no TPOT
            return self.tpot_ms <= float(h["x-slo-tpot-ms"])
        return True


def workload(a: argparse.Namespace) -> list[Req]:
    rng = random.Random(a.seed)
    words = [f"w{i}" for i in range(5000)]
    out, t = [], 0.0
    while True:
        t += rng.expovariate(a.rate)
        if t >= a.warmup_s + a.duration_s:
            return out
        if rng.random() < a.chat_share:
            p = " ".join(rng.choice(words) for _ in range(a.chat_words))
            h = {"x-slo-ttft-ms": str(a.chat_ttft_ms), "x-slo-tpot-ms": str(a.chat_tpot_ms)}
            out.append(Req(t, "chat", p, a.chat_out, h))
        else:
            p = " ".join(rng.choice(words) for _ in range(a.long_words))
            out.append(Req(t, "long", p, a.long_out, {"x-slo-ttft-ms": str(a.long_ttft_ms)}))


async def one(http: aiohttp.ClientSession, url: str, r: Req) -> Res:
    res = Res(r)
    body = {"model": "tiny", "prompt": r.prompt, "max_tokens": r.out, "stream": True}
    t0 = time.perf_counter()
    times = []
    try:
        async with http.post(url + "/v1/completions", json=body, headers=r.headers) as resp:
            if resp.status != 200:
                await resp.read()
                return res
            async for line in resp.content:
                if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                    times.append(time.perf_counter())
    except (TimeoutError, aiohttp.ClientError):
        return res
    if times:
        res.ok = True
        res.ttft_ms = (times[0] - t0) * 1000
        if len(times) > 1:
            res.tpot_ms = (times[-1] - times[0]) * 1000 / (len(times) - 1)
    return res


async def drive(url: str, reqs: list[Req]) -> list[Res]:
    timeout = aiohttp.ClientTimeout(total=120)
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=conn) as http:
        start = time.perf_counter()

        async def at(r: Req) -> Res:
            await asyncio.sleep(max(0.0, start + r.at - time.perf_counter()))
            return await one(http, url, r)

        return await asyncio.gather(*(at(r) for r in reqs))


def pct(xs: list[float], q: float) -> float:
    xs = sorted(x for x in xs if x == x)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def summarise(setup: str, results: list[Res], a: argparse.Namespace) -> dict:
    measured = [r for r in results if r.req.at >= a.warmup_s]
    row: dict = {"setup": setup, "n": len(measured)}
    row["attainment"] = sum(r.meets() for r in measured) / len(measured)
    row["goodput_rps"] = sum(r.meets() for r in measured) / a.duration_s
    for cls in ("chat", "long"):
        rs = [r for r in measured if r.req.cls == cls]
        ttfts = [r.ttft_ms for r in rs if r.ok]
        row[f"{cls}_attain"] = sum(r.meets() for r in rs) / max(1, len(rs))
        row[f"{cls}_ttft_mean"] = statistics.fmean(ttfts) if ttfts else float("nan")
        for q in (50, 90, 99):
            row[f"{cls}_ttft_p{q}"] = pct(ttfts, q / 100)
        row[f"{cls}_tpot_p90"] = pct([r.tpot_ms for r in rs if r.ok], 0.9)
        row[f"{cls}_errors"] = sum(not r.ok for r in rs)
    return row


def median_row(setup: str, rows: list[dict]) -> dict:
    """Each figure's median over the repeats (errors: the total)."""
    out: dict = {"setup": setup, "repeats": len(rows)}
    for key in rows[0]:
        if key == "setup":
            continue
        vals = [r[key] for r in rows]
        out[key] = sum(vals) if key.endswith("errors") else statistics.median(vals)
    out["attainment_each"] = [round(r["attainment"], 3) for r in rows]
    return out


def parse_setups(a: argparse.Namespace, p: argparse.ArgumentParser) -> dict[str, list[str]]:
    configs = dict(CONFIGS)
    if NO_PREDICTOR in a.setups.split(","):
        configs[NO_PREDICTOR] = [
            "--config",
            str(write_without_predictor(ROOT / "config" / "slo.yaml")),
        ]
    for spec in a.setup:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            p.error(f"--setup {spec!r}: expected NAME=CONFIG_PATH")
        if not Path(path).is_file():
            p.error(f"--setup {spec!r}: no such file {path}")
        configs[name] = ["--config", path]
    chosen = {}
    for name in a.setups.split(","):
        if name not in configs:
            p.error(f"unknown setup {name!r}; known: {', '.join(configs)}")
        chosen[name] = configs[name]
    return chosen


def measure(a: argparse.Namespace, setups: dict[str, list[str]]) -> dict[str, list[dict]]:
    """Every setup `a.repeats` times on `a`'s workload, interleaved (the order rotates each
    repeat, so no setup always runs first on a machine that warms up or gets busier)."""
    reqs = workload(a)
    base = [
        "--max-num-seqs",
        str(a.max_num_seqs),
        "--decode-ms-per-token",
        str(a.decode_ms),
        "--prefill-ms-per-token",
        str(a.prefill_ms),
    ]
    slow = [
        "--decode-ms-per-token",
        str(a.slow_factor * a.decode_ms),
        "--prefill-ms-per-token",
        str(a.slow_factor * a.prefill_ms),
    ]
    names = list(setups)
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for rep in range(a.repeats):
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for setup in order:
            run_dir = Path(a.run_dir) / f"{setup}-{rep}" if a.run_dir else None
            with LocalStack(
                n_sims=a.sims,
                sim_args=base,
                per_sim_args={i: slow for i in range(a.sims - a.slow_count, a.sims)},
                epp_args=setups[setup],
                run_dir=run_dir,
            ) as st:
                results = asyncio.run(drive(st.url, reqs))
            runs[setup].append(summarise(setup, results, a))
            print(json.dumps({"repeat": rep, **runs[setup][-1]}), flush=True)
    return runs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--setups",
        default="default,prefix,slo",
        help=f"also {NO_PREDICTOR}: config/slo.yaml without the predictor's plugins",
    )
    p.add_argument(
        "--setup", action="append", default=[], help="NAME=CONFIG: an extra setup (repeatable)"
    )
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--sims", type=int, default=3)
    p.add_argument("--rate", type=float, default=6.0)
    p.add_argument("--warmup-s", type=float, default=15.0)
    p.add_argument("--duration-s", type=float, default=30.0)
    add_workload_args(p)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--run-dir", help="keep the processes' logs here (one folder per run)")
    p.add_argument("--json", help="write every run and the medians here")
    a = p.parse_args()
    setups = parse_setups(a, p)
    if a.repeats < 1:
        p.error("--repeats must be at least 1")
    names = list(setups)
    runs = measure(a, setups)
    rows = [median_row(n, runs[n]) for n in names]
    if a.json:
        Path(a.json).write_text(json.dumps({"runs": runs, "medians": rows}, indent=1))
    if a.repeats > 1:
        print(f"\nmedians of {a.repeats} interleaved repeats")
    print(
        "\n| setup | attainment | goodput req/s | chat attain | chat TTFT mean / p99 ms "
        "| long attain | long TTFT mean / p99 ms | errors |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['setup']} | {r['attainment']:.1%} | {r['goodput_rps']:.2f} "
            f"| {r['chat_attain']:.1%} | {r['chat_ttft_mean']:.0f} / {r['chat_ttft_p99']:.0f} "
            f"| {r['long_attain']:.1%} | {r['long_ttft_mean']:.0f} / {r['long_ttft_p99']:.0f} "
            f"| {r['chat_errors'] + r['long_errors']} |"
        )
    if a.repeats > 1:
        for r in rows:
            each = ", ".join(f"{v:.1%}" for v in r["attainment_each"])
            print(f"{r['setup']}: attainment per repeat {each}")


if __name__ == "__main__":
    main()
