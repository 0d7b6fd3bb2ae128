"""SLO routing in virtual time: the EPP's real scheduler and configs over simulated servers,
without processes or a wall clock (the noise-free twin of bench/slo_routing.py).

On a shared 2-core machine `bench/slo_routing.py` measures mostly CPU contention: the
simulators' steps stretch, and the default profile's attainment ranged 55-78 % over runs
of the same workload. Here the pool is `epp.sim.virtual.VirtualEngine` replicas (the
simulator's scheduler and step costs: the same law `epp sim` follows) and every routing
decision is made by the scheduler that `epp serve --config FILE` builds: the same
plugins, producers, pre-request hooks and post-response learning (the latency producer's
refit runs every `--refit-s` of virtual time). The EPP's view is rebuilt as in
bench/predictor_accuracy.py: metrics scraped every `--scrape-ms`, in-flight requests /
prompt tokens (until the first token) / expected output tokens counted per endpoint.

Workload, pool and figures as in bench/slo_routing.py (same defaults): 70 % chats with
`x-slo-ttft-ms` / `x-slo-tpot-ms`, 30 % long prompts with a loose TTFT SLO, three servers
(the last 2x slower); attainment and goodput over the requests after `--warmup-s`.
Several `--seeds` give independent workloads; the table shows the median over them.

    .venv/bin/python bench/slo_virtual.py [--rates 6,10] [--setups default,prefix,slo]

Setup `slo-nopred` is `config/slo.yaml` without the predictor's plugins
(`bench/slo_configs.py`): the anchor's "same stack without the predictor". With it as
`--baseline`, the run also prints the bound no router can pass: every request alone on an
idle fast server (its own prefill), as the most the baseline's TTFT mean / p99 could fall.
"""

from __future__ import annotations

import argparse
import copy
import heapq
import json
import math
import random
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.slo_configs import NO_PREDICTOR, add_workload_args  # noqa: E402
from epp.composition import install_plugins  # noqa: E402
from epp.config.loader import load_config_file, load_default_config  # noqa: E402
from epp.config.variants import write_without_predictor  # noqa: E402
from epp.datastore import EndpointMetrics  # noqa: E402
from epp.records import RequestRecord  # noqa: E402
from epp.request import InferenceRequest, new_request, parse_body  # noqa: E402
from epp.scheduling.registry import Handle  # noqa: E402
from epp.scheduling.types import ProfileResult, SchedulingResult  # noqa: E402
from epp.sim.config import SimConfig  # noqa: E402
from epp.sim.epp_view import epp_view, finished_by, scrape  # noqa: E402
from epp.sim.virtual import Finished, VirtualEngine  # noqa: E402
from plugins.latency.info import LATENCY_PREDICTION_KEY, LatencyPredictionInfo  # noqa: E402

CONFIGS = {
    # "default": the sticky routing, what config/default.yaml does with a request without
    # targets (config/default.yaml itself now places requests with targets by them)
    "default": ROOT / "config" / "prefix-aware.yaml",
    "prefix": ROOT / "config" / "prefix-aware.yaml",
    "slo": ROOT / "config" / "slo.yaml",
}
ORACLE = "oracle"  # route by the true TTFT (needs --oracle): what a perfect predictor gives
PROBE_RID = -1
CLASSES = ("chat", "long")


@dataclass
class Sent:
    """One routed request, in the units the EPP counts (its prompt estimate)."""

    request: InferenceRequest
    cls: str
    isl: int  # the EPP's prompt estimate: what it holds as pending prefill
    osl: int
    arrival: float
    snap: object  # the primary endpoint's snapshot at pick (post_response gets it)
    predicted: tuple[float, float] | None = None  # (TTFT, TPOT ms) on the pick, if predicted


def workload(a: argparse.Namespace, rate: float, seed: int) -> list[tuple[float, str, str, int]]:
    """(arrival, class, prompt, max tokens): bench/slo_routing.py's generator."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(5000)]
    out, t = [], 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= a.warmup_s + a.duration_s:
            return out
        if rng.random() < a.chat_share:
            out.append(
                (t, "chat", " ".join(rng.choice(words) for _ in range(a.chat_words)), a.chat_out)
            )
        else:
            out.append(
                (t, "long", " ".join(rng.choice(words) for _ in range(a.long_words)), a.long_out)
            )


def headers(a: argparse.Namespace, cls: str) -> dict[str, str]:
    if cls == "chat":
        return {"x-slo-ttft-ms": f"{a.chat_ttft_ms:g}", "x-slo-tpot-ms": f"{a.chat_tpot_ms:g}"}
    return {"x-slo-ttft-ms": f"{a.long_ttft_ms:g}"}


def meets(a: argparse.Namespace, cls: str, ttft_ms: float, tpot_ms: float) -> bool:
    if cls == "chat":
        return ttft_ms <= a.chat_ttft_ms and (tpot_ms != tpot_ms or tpot_ms <= a.chat_tpot_ms)
    return ttft_ms <= a.long_ttft_ms


def run(a: argparse.Namespace, setup: str, config: Path | None, rate: float, seed: int) -> dict:
    handle = Handle(rng=random.Random(seed), clock=lambda: now)
    registry = install_plugins()
    loaded = (
        load_default_config(handle, registry)
        if config is None
        else load_config_file(config, handle, registry)
    )
    refit = [p for p in loaded.plugins.values() if hasattr(p, "refit")]
    base = dict(max_num_seqs=a.max_num_seqs, enable_prefix_caching=False)
    fast = SimConfig(decode_ms_per_token=a.decode_ms, prefill_ms_per_token=a.prefill_ms, **base)
    f = a.slow_factor
    slow = SimConfig(
        decode_ms_per_token=f * a.decode_ms, prefill_ms_per_token=f * a.prefill_ms, **base
    )
    engines = [VirtualEngine(c) for c in [fast] * (a.sims - a.slow_count) + [slow] * a.slow_count]
    scraped = [EndpointMetrics() for _ in engines]
    sent: dict[int, Sent] = {}
    reqs = workload(a, rate, seed)
    end = a.warmup_s + a.duration_s
    events: list[tuple[float, int, int]] = [(t, 2, rid) for rid, (t, *_) in enumerate(reqs)]
    events += [(k * a.scrape_ms / 1000, 0, 0) for k in range(int(end * 1000 / a.scrape_ms) + 1)]
    events += [(k * a.refit_s, 1, 0) for k in range(1, int(end / a.refit_s) + 1)]
    heapq.heapify(events)
    results: list[tuple[str, float, float, float]] = []  # (class, arrival, ttft, tpot)
    # (endpoint, class, arrival, predicted TTFT, observed TTFT, predicted TPOT, observed TPOT)
    errors: list[tuple[int, str, float, float, float, float, float]] = []
    # --oracle: (class, picked endpoint, true TTFT ms on every endpoint, predicted or None)
    ranks: list[tuple[str, int, list[float], list[float] | None]] = []
    routed = [0] * len(engines)
    now = 0.0

    held: list[list[Finished]] = [[] for _ in engines]

    def collect(t: float) -> None:
        for i, f in finished_by(engines, held, t):
            s = sent.pop(f.rid)
            ttft, tpot = 1000 * f.ttft_s, (1000 * f.itl_s if f.osl >= 2 else math.nan)
            results.append((s.cls, s.arrival, ttft, tpot))
            if s.predicted is not None:
                errors.append((i, s.cls, s.arrival, s.predicted[0], ttft, s.predicted[1], tpot))
            rec = RequestRecord(f.finish, f.isl, f.osl, ttft, tpot, f.duration_s, endpoint=f"e{i}")
            for plugin in loaded.post_response:
                plugin.post_response(s.request, rec, s.snap)

    while events:
        now, kind, rid = heapq.heappop(events)
        collect(now)
        if kind == 0:
            scraped[:] = scrape(engines, now)
        elif kind == 1:
            for plugin in refit:
                plugin.refit()
        else:
            t, cls, prompt, out = reqs[rid]
            body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": out}).encode()
            request = parse_body(new_request(headers(a, cls), "/v1/completions", "POST"), body)
            view = epp_view(engines, scraped, sent, now, held)
            state = loaded.scheduler.prepare(request)
            result = loaded.scheduler.schedule(request, view, state)
            truth = true_ttfts(engines, len(prompt.split()), t) if a.oracle else None
            if setup == ORACLE:  # route by the true TTFT instead (pre_request still runs)
                best = min(range(len(engines)), key=lambda k: truth[k])
                result = SchedulingResult({"default": ProfileResult([view[best]])}, "default")
            for plugin in loaded.pre_request:
                plugin.pre_request(request, result)
            pick = result.primary.targets[0]
            i = int(pick.name[1:])
            info = state.read(LATENCY_PREDICTION_KEY)
            learned = isinstance(info, LatencyPredictionInfo) and all(
                p.learned for p in info.predictions.values()
            )
            pred = info.predictions[pick.name] if learned else None
            predicted = (pred.ttft_ms, pred.tpot_ms) if pred is not None else None
            if truth is not None and t >= a.warmup_s:
                preds = [info.predictions[e.name].ttft_ms for e in view] if learned else None
                ranks.append((cls, i, truth, preds))
            sent[rid] = Sent(request, cls, request.prompt_tokens_estimate, out, t, pick, predicted)
            engines[i].add(rid, len(prompt.split()), out, t)
            routed[i] += 1
    for eng in engines:
        eng.advance_to(math.inf)
    collect(math.inf)
    measured = [r for r in results if r[1] >= a.warmup_s]
    row: dict = {"setup": setup, "rate": rate, "seed": seed, "n": len(measured), "routed": routed}
    ok = [meets(a, c, ttft, tpot) for c, _, ttft, tpot in measured]
    row["attainment"] = sum(ok) / len(measured)
    row["goodput_rps"] = sum(ok) / a.duration_s
    ttfts = sorted(r[2] for r in measured)
    row["ttft_mean"] = statistics.fmean(ttfts)
    row["ttft_p99"] = ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))]
    # The floor no router can beat: each request alone on an idle fast server.
    alone = {c: isolated_ttft(fast, a.chat_words if c == "chat" else a.long_words) for c in CLASSES}
    floor = sorted(alone[c] for c, *_ in measured)
    row["floor_ttft_mean"] = statistics.fmean(floor)
    row["floor_ttft_p99"] = floor[min(len(floor) - 1, int(0.99 * len(floor)))]
    for cls in CLASSES:
        rs = [(r, m) for r, m in zip(measured, ok, strict=True) if r[0] == cls]
        ttfts = sorted(r[2] for r, _ in rs)
        row[f"{cls}_n"] = len(rs)
        row[f"{cls}_attain"] = sum(m for _, m in rs) / max(1, len(rs))
        row[f"{cls}_ttft_mean"] = statistics.fmean(ttfts) if ttfts else math.nan
        for q in (50, 90, 99):
            row[f"{cls}_ttft_p{q}"] = pct(ttfts, q / 100)
        row[f"{cls}_tpot_p90"] = pct([r[3] for r, _ in rs], 0.9)
    if errors:
        row["errors"] = prediction_errors(a, errors, len(engines))
    if ranks:
        row["ranking"] = ranking(ranks, len(engines))
    return row


def pct(xs: list[float], q: float) -> float:
    """The q-quantile (nearest rank, NaNs dropped; NaN when nothing is left)."""
    xs = sorted(x for x in xs if x == x)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else math.nan


def isolated_ttft(config: SimConfig, isl: int) -> float:
    """TTFT (ms) of an `isl`-token prompt on an idle server of `config`: its own prefill."""
    eng = VirtualEngine(config)
    eng.add(PROBE_RID, isl, 1, 0.0)
    eng.advance_to(math.inf)
    return 1000 * next(f for f in eng.drain_finished()).ttft_s


def true_ttfts(engines: list[VirtualEngine], isl: int, at: float) -> list[float]:
    """The TTFT (ms) a request of `isl` prompt tokens arriving now would get on each
    engine, by running a copy of it (later arrivals ignored: FCFS, they cannot overtake)."""
    out = []
    for eng in engines:
        probe = copy.deepcopy(eng)
        probe.add(PROBE_RID, isl, 1, at)
        probe.advance_to(math.inf)
        first = next(f for f in probe.drain_finished() if f.rid == PROBE_RID)
        out.append(1000 * first.ttft_s)
    return out


def ranking(ranks: list, n: int) -> dict:
    """Per class: how far the pick's true TTFT was from the best endpoint's (regret), how
    often the pick was the best, and, when the predictor ran, its error on every candidate
    (not only the picked one, which a router biases towards optimistic predictions) and
    how often its own lowest prediction was the true best."""
    out: dict[str, dict] = {}
    for cls in ("chat", "long"):
        rs = [r for r in ranks if r[0] == cls]
        if not rs:
            continue
        d: dict = {
            "n": len(rs),
            "regret_ms": statistics.fmean(tr[i] - min(tr) for _, i, tr, _ in rs),
            "best_share": statistics.fmean(tr[i] <= min(tr) + 1e-6 for _, i, tr, _ in rs),
            "oracle_ttft_mean": statistics.fmean(min(tr) for _, _, tr, _ in rs),
        }
        pr = [r for r in rs if r[3] is not None]
        if pr:
            d["pred_argmin_best"] = statistics.fmean(
                tr[min(range(n), key=p.__getitem__)] <= min(tr) + 1e-6 for _, _, tr, p in pr
            )
            for k in range(n):
                pairs = [(p[k], tr[k]) for _, _, tr, p in pr if tr[k] > 0]
                d[f"e{k}_mape"] = statistics.fmean(abs(p - o) / o for p, o in pairs)
                d[f"e{k}_ratio"] = statistics.median(p / o for p, o in pairs)
        out[cls] = d
    return out


def prediction_errors(a: argparse.Namespace, errors: list, n: int) -> dict:
    """Per endpoint and class, the learned prediction on the picked endpoint vs what it
    measured (requests after the warm-up): MAPE and the median ratio predicted / observed
    (< 1: the endpoint is slower than predicted)."""
    out: dict[str, dict] = {}
    for i in range(n):
        for cls in ("chat", "long"):
            rs = [r for r in errors if r[0] == i and r[1] == cls and r[2] >= a.warmup_s]
            if not rs:
                continue
            tt = [(p, o) for *_, p, o, _, _ in rs if o > 0]
            tp = [(p, o) for *_, p, o in rs if o == o and o > 0]
            out[f"e{i}/{cls}"] = {
                "n": len(rs),
                "ttft_mape": statistics.fmean(abs(p - o) / o for p, o in tt),
                "ttft_ratio": statistics.median(p / o for p, o in tt),
                "tpot_mape": statistics.fmean(abs(p - o) / o for p, o in tp) if tp else math.nan,
                "tpot_ratio": statistics.median(p / o for p, o in tp) if tp else math.nan,
            }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--setups",
        default="default,prefix,slo",
        help=f"also {NO_PREDICTOR} (config/slo.yaml without the predictor's plugins) and, "
        f"with --oracle, {ORACLE}",
    )
    p.add_argument("--setup", action="append", default=[], help="NAME=CONFIG (repeatable)")
    p.add_argument("--rates", default="6,10")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--sims", type=int, default=3)
    p.add_argument("--warmup-s", type=float, default=15.0)
    p.add_argument("--duration-s", type=float, default=60.0)
    add_workload_args(p)
    p.add_argument("--scrape-ms", type=float, default=50.0)
    p.add_argument("--refit-s", type=float, default=2.0)
    p.add_argument(
        "--oracle",
        action="store_true",
        help="compute every request's true TTFT on every endpoint (a copy of each engine "
        "run ahead): ranking regret per setup, the predictor's error on every candidate, "
        f"and setup {ORACLE!r} (routes by it)",
    )
    p.add_argument(
        "--baseline",
        default=NO_PREDICTOR,
        help="if among the setups, print every other one's TTFT mean / p99 change against it",
    )
    p.add_argument("--json", help="write every run here")
    a = p.parse_args()
    configs: dict[str, Path | None] = dict(CONFIGS)
    configs[NO_PREDICTOR] = write_without_predictor(ROOT / "config" / "slo.yaml")
    if a.oracle:
        configs[ORACLE] = None
    for spec in a.setup:
        name, sep, path = spec.partition("=")
        if not sep or not Path(path).is_file():
            p.error(f"--setup {spec!r}: expected NAME=CONFIG_PATH of an existing file")
        configs[name] = Path(path)
    setups = a.setups.split(",")
    unknown = [s for s in setups if s not in configs]
    if unknown:
        p.error(f"unknown setup(s) {unknown}; known: {', '.join(configs)}")
    rows = []
    for rate in (float(r) for r in a.rates.split(",")):
        for seed in (int(s) for s in a.seeds.split(",")):
            for setup in setups:
                rows.append(run(a, setup, configs[setup], rate, seed))
                print(json.dumps(rows[-1]), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    print(f"\nmedians over seeds {a.seeds}")
    print(
        "| rate | setup | attainment | goodput req/s | TTFT mean / p99 ms | chat attain "
        "| chat TTFT mean / p99 ms | long attain | long TTFT mean / p99 ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for rate in (float(r) for r in a.rates.split(",")):
        for setup in setups:
            rs = [r for r in rows if r["setup"] == setup and r["rate"] == rate]

            def med(k: str, rs: list[dict] = rs) -> float:
                return statistics.median(r[k] for r in rs)

            print(
                f"| {rate:g} | {setup} | {med('attainment'):.1%} | {med('goodput_rps'):.2f} "
                f"| {med('ttft_mean'):.0f} / {med('ttft_p99'):.0f} "
                f"| {med('chat_attain'):.1%} | {med('chat_ttft_mean'):.0f} / "
                f"{med('chat_ttft_p99'):.0f} | {med('long_attain'):.1%} | "
                f"{med('long_ttft_mean'):.0f} / {med('long_ttft_p99'):.0f} |"
            )
    if a.baseline in setups:
        effects(a, rows, setups)


def effects(a: argparse.Namespace, rows: list[dict], setups: list[str]) -> None:
    """Each setup against `--baseline` as llm-d's anchor states it: the change of the TTFT
    mean and p99 (all requests), per seed (same workload), median over the seeds."""
    print(f"\nagainst {a.baseline}: TTFT mean / p99 change, attainment change (points), medians")
    for setup in (s for s in setups if s != a.baseline):
        cells = []
        for rate in (float(r) for r in a.rates.split(",")):
            pairs = [
                (r, b)
                for r in rows
                for b in rows
                if r["setup"] == setup
                and b["setup"] == a.baseline
                and r["rate"] == b["rate"] == rate
                and r["seed"] == b["seed"]
            ]

            def change(k: str, pairs: list = pairs) -> float:
                return statistics.median(r[k] / b[k] - 1 for r, b in pairs)

            points = statistics.median(100 * (r["attainment"] - b["attainment"]) for r, b in pairs)
            cells.append(
                f"{rate:g}: {change('ttft_mean'):+.0%} / {change('ttft_p99'):+.0%}, {points:+.1f}"
            )
        print(f"{setup}: " + "; ".join(cells))
    # No router beats every request alone on an idle fast server: the most any setup
    # could cut the baseline's TTFT mean / p99 (same workloads, median over seeds).
    cells = []
    for rate in (float(r) for r in a.rates.split(",")):
        base = [r for r in rows if r["setup"] == a.baseline and r["rate"] == rate]
        mean = statistics.median(r["floor_ttft_mean"] / r["ttft_mean"] - 1 for r in base)
        p99 = statistics.median(r["floor_ttft_p99"] / r["ttft_p99"] - 1 for r in base)
        cells.append(f"{rate:g}: {mean:+.0%} / {p99:+.0%}")
    print("bound (every request alone on an idle fast server): " + "; ".join(cells))


if __name__ == "__main__":
    main()
