"""A family of SLO routing workloads, split into a tuning set and a reporting set.

One workload of `bench/slo_virtual.py` / `bench/slo_routing.py` (70 % chats at 150 / 30 ms,
one 2x slower server, ~35-60 % load) is a single point; a config tuned on it can lose on
the next pool or mix. This module draws workloads of the same kind with every knob varied
over the range a production pool shows — the slow servers' factor (1.5-3x) and how many
are slow, the share of interactive requests (50-90 %), their TTFT / TPOT targets and the
long requests' TTFT target, prompt and output lengths, the offered load (40-90 % of the
pool's capacity) — and splits them by a fixed seed: choose every default on `tuning`,
judge it on `reporting` only. Both are reproducible from `FAMILY_SEED` / `SPLIT_SEED`.

Capacity is measured, not guessed: each server kind is saturated in virtual time with the
workload's own mix (every request queued at t = 0) and the pool's capacity is the sum of
their throughputs; the offered rate is `load` × that. Poisson arrivals never reach a
saturated server's throughput without queueing, so 90 % is deep overload for the chats.

    .venv/bin/python bench/slo_family.py --set tuning --setups default,slo,slack
    .venv/bin/python bench/slo_family.py --set reporting --harness real --workloads w03,w07

`--harness virtual` (default) runs `bench/slo_virtual.py`'s engine: the EPP's real
scheduler over simulated servers in virtual time (no processes, no wall clock: the runs
differ only by their arrival seeds). `--harness real` runs `bench/slo_routing.py`'s:
`epp sim` processes behind Envoy and the EPP (`--response-path on`), streamed requests,
runs interleaved (the order rotates each repeat). Either way each figure is the median of
`--runs` runs (3).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from dataclasses import asdict
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.slo_configs import NO_PREDICTOR, add_workload_args  # noqa: E402
from epp.config.variants import write_without_predictor  # noqa: E402
from epp.sim.slo_workloads import FAMILY_SEED, SloWorkload, family, split  # noqa: E402


def namespace(
    w: SloWorkload, base: argparse.Namespace, rate: float, run: int
) -> argparse.Namespace:
    """The benchmarks' options for run `run` of `w` (pool and timing from `base`)."""
    fields = {k: v for k, v in asdict(w).items() if k not in ("name", "load")}
    fields["seed"] = w.seed + run
    return argparse.Namespace(**{**vars(base), **fields, "rate": rate})


@cache
def _throughput(decode_ms: float, prefill_ms: float, max_num_seqs: int, mix: tuple) -> float:
    """Requests/s of one saturated server of this speed on `mix` ((isl, osl) per request)."""
    from epp.sim.config import SimConfig
    from epp.sim.virtual import VirtualEngine

    eng = VirtualEngine(
        SimConfig(
            decode_ms_per_token=decode_ms,
            prefill_ms_per_token=prefill_ms,
            max_num_seqs=max_num_seqs,
            enable_prefix_caching=False,
        )
    )
    for rid, (isl, osl) in enumerate(mix):
        eng.add(rid, isl, osl, 0.0)
    eng.advance_to(math.inf)
    return len(mix) / max(f.finish for f in eng.drain_finished())


def capacity(w: SloWorkload, base: argparse.Namespace, n: int = 200) -> float:
    """The pool's saturated throughput (req/s) on `w`'s mix: the sum over its servers."""
    rng = random.Random(w.seed)
    mix = tuple(
        (w.chat_words, w.chat_out) if rng.random() < w.chat_share else (w.long_words, w.long_out)
        for _ in range(n)
    )
    fast = _throughput(base.decode_ms, base.prefill_ms, base.max_num_seqs, mix)
    f = w.slow_factor
    slow = _throughput(f * base.decode_ms, f * base.prefill_ms, base.max_num_seqs, mix)
    return (base.sims - w.slow_count) * fast + w.slow_count * slow


def figures(rows: list[dict]) -> dict:
    """Median over runs of every numeric figure (the run rows of one workload and setup)."""
    out: dict = {"runs": len(rows)}
    for key, value in rows[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            vals = [r[key] for r in rows if r.get(key) == r.get(key)]
            out[key] = statistics.median(vals) if vals else math.nan
    out["attainment_each"] = [round(r["attainment"], 4) for r in rows]
    return out


def run_virtual(
    w: SloWorkload, base: argparse.Namespace, setups: dict, rate: float
) -> dict[str, list[dict]]:
    from bench.slo_virtual import run

    out: dict[str, list[dict]] = {s: [] for s in setups}
    for k in range(base.runs):
        a = namespace(w, base, rate, k)
        for setup, config in setups.items():
            out[setup].append(run(a, setup, config, rate, a.seed))
    return out


def run_real(
    w: SloWorkload, base: argparse.Namespace, setups: dict, rate: float
) -> dict[str, list[dict]]:
    from bench.slo_routing import measure

    a = namespace(w, base, rate, 0)
    a.repeats = base.runs
    return measure(a, {s: [] if c is None else ["--config", str(c)] for s, c in setups.items()})


def main() -> None:
    from bench.slo_virtual import CONFIGS

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--set", default="tuning", choices=("tuning", "reporting", "all"))
    p.add_argument(
        "--family-seed",
        type=int,
        default=FAMILY_SEED,
        help="draw another family (a fresh hold-out for a change made after seeing the "
        "reporting set); the split seed stays",
    )
    p.add_argument("--workloads", default="", help="only these names of the set (w00,w03)")
    p.add_argument("--harness", default="virtual", choices=("virtual", "real"))
    p.add_argument("--setups", default="default,slo")
    p.add_argument("--setup", action="append", default=[], help="NAME=CONFIG (repeatable)")
    p.add_argument("--baseline", default="default")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--sims", type=int, default=3)
    p.add_argument("--warmup-s", type=float, default=15.0)
    p.add_argument("--duration-s", type=float, default=60.0)
    p.add_argument("--scrape-ms", type=float, default=50.0)
    p.add_argument("--refit-s", type=float, default=2.0)
    p.add_argument("--run-dir", help="real harness: keep the processes' logs here")
    p.add_argument("--list", action="store_true", help="print the set's workloads and exit")
    p.add_argument("--json", help="write every run and the medians here")
    add_workload_args(p)
    a = p.parse_args()
    a.oracle = False
    drawn = family(a.family_seed)
    chosen = drawn if a.set == "all" else split(drawn)[a.set]
    if a.workloads:
        want = set(a.workloads.split(","))
        unknown = want - {w.name for w in chosen}
        if unknown:
            p.error(f"--workloads {sorted(unknown)} not in the {a.set} set")
        chosen = [w for w in chosen if w.name in want]
    if a.list:
        for w in chosen:
            print(json.dumps({**asdict(w), "capacity_rps": round(capacity(w, a), 2)}))
        return
    configs: dict[str, Path | None] = dict(CONFIGS)
    configs[NO_PREDICTOR] = write_without_predictor(ROOT / "config" / "slo.yaml")
    for spec in a.setup:
        name, sep, path = spec.partition("=")
        if not sep or not Path(path).is_file():
            p.error(f"--setup {spec!r}: expected NAME=CONFIG_PATH of an existing file")
        configs[name] = Path(path)
    names = a.setups.split(",")
    unknown = [s for s in names if s not in configs]
    if unknown:
        p.error(f"unknown setup(s) {unknown}; known: {', '.join(configs)}")
    setups = {s: configs[s] for s in names}
    runner = run_virtual if a.harness == "virtual" else run_real
    results = []
    for w in chosen:
        rate = round(w.load * capacity(w, a), 2)
        runs = runner(w, a, setups, rate)
        meds = {s: figures(rs) for s, rs in runs.items()}
        results.append({"workload": asdict(w), "rate": rate, "runs": runs, "medians": meds})
        for s in names:
            print(json.dumps({"workload": w.name, "setup": s, **brief(meds[s])}), flush=True)
        if a.json:  # after every workload: a long real-process run keeps what it measured
            Path(a.json).write_text(json.dumps(results, indent=1, default=str))
    print_tables(results, names, a.baseline)


def brief(m: dict) -> dict:
    keys = ["attainment", "goodput_rps", "chat_attain", "long_attain", "attainment_each"]
    return {k: (round(m[k], 4) if isinstance(m[k], float) else m[k]) for k in keys if k in m}


def print_tables(results: list[dict], names: list[str], baseline: str) -> None:
    print(
        "\n| workload | setup | within both | goodput req/s | chat within "
        "| chat TTFT p50/p90/p99 ms | chat TPOT p90 ms | long within | long TTFT p50/p90/p99 ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        for s in names:
            m = r["medians"][s]

            def ttft(c: str, m: dict = m) -> str:
                return "/".join(f"{m.get(f'{c}_ttft_p{q}', math.nan):.0f}" for q in (50, 90, 99))

            print(
                f"| {r['workload']['name']} | {s} | {m['attainment']:.1%} | "
                f"{m['goodput_rps']:.2f} | {m['chat_attain']:.1%} | {ttft('chat')} | "
                f"{m.get('chat_tpot_p90', math.nan):.1f} | {m['long_attain']:.1%} | "
                f"{ttft('long')} |"
            )
    if baseline not in names:
        return
    print(f"\nagainst {baseline}: mean / worst attainment change (points), goodput ratio")
    for s in (n for n in names if n != baseline):
        d = [
            100 * (r["medians"][s]["attainment"] - r["medians"][baseline]["attainment"])
            for r in results
        ]
        g = sum(r["medians"][s]["goodput_rps"] for r in results) / max(
            1e-9, sum(r["medians"][baseline]["goodput_rps"] for r in results)
        )
        print(f"{s}: mean {statistics.fmean(d):+.1f}, worst {min(d):+.1f}, goodput {g:.2f}x")


if __name__ == "__main__":
    main()
