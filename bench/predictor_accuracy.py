"""Out-of-sample accuracy of `predicted-latency-producer` per load level.

Deterministic and fast: the pool is `epp.sim.virtual.VirtualEngine` replicas (the
simulator's own scheduler and step-cost model in virtual time, the same code `epp sim`
runs), so no process, no wall clock, no noise. Per load level, a fresh pool and a fresh
model; the seeded workload of `bench/slo_routing.py` (short chats and long prompts) at a
Poisson rate; the pool of three servers, the last 2x slower, as there.

What the EPP would see, rebuilt exactly:
- scraped metrics (waiting, running, KV use) sampled every `--scrape-ms` (stale in
  between, as the real scraper's);
- the EPP's own in-flight counts per endpoint: requests, prompt tokens still waiting for
  their first token (uncached), expected output tokens until the end;
- `EndpointSnapshot`s built from both, fed to the producer's own feature functions,
  `fit` (on a ring buffer of `--max-samples`, refit every `--refit-s` of virtual time from
  the samples of finished requests) and `predict`.

Routing: the endpoint with the fewest EPP-counted in-flight requests, ties at random (a
load-aware router like the default profile's queue scorer, so the slow server gets less
and the pool stays stable up to its capacity, about 17 req/s here). Per request, at its
arrival and before it is sent, each model (FEATURES:FIT, `--sets`) predicts its TTFT and
TPOT on that endpoint; every model sees identical traffic. Once the request finishes the
prediction is compared with what the simulator measured; the sample then joins the
model's buffer exactly as the producer's `post_response` adds it. MAPE = mean
|predicted − observed| / observed over the requests arriving after `--warmup-s` with a
learned (not cold-start) prediction; every prediction uses only requests finished before
it (out of sample).

    .venv/bin/python bench/predictor_accuracy.py [--rates 4,8,12,16] [--json out.json]   # ~15 s
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import statistics
from dataclasses import dataclass, field

from epp.datastore import EndpointMetrics, EndpointSnapshot
from epp.sim.config import SimConfig
from epp.sim.epp_view import epp_view, finished_by, scrape
from epp.sim.virtual import Finished, VirtualEngine
from plugins.latency.features import FEATURE_SETS, EndpointHistory, FeatureSet
from plugins.latency.model import Coefficients, ColdStart, Sample, SampleBuffer, fit, predict


@dataclass
class Pending:
    """One routed request: where it went, what it would have been predicted."""

    endpoint: int
    snap: EndpointSnapshot  # as the scheduling cycle saw it (the producer's post_response too)
    isl: int
    osl: int
    arrival: float
    # per feature set: (ttft_x, tpot_x, predicted ttft ms, predicted tpot ms, learned)
    by_set: dict[str, tuple] = field(default_factory=dict)


@dataclass
class Learner:
    """One feature set's model: buffer, coefficients, per-endpoint history."""

    name: str
    features: FeatureSet
    relative: bool
    min_samples: int
    buffer: SampleBuffer
    cold: ColdStart
    coef: Coefficients = field(default_factory=Coefficients)
    history: EndpointHistory = field(default_factory=EndpointHistory)
    fitted_at: int = 0
    errors: dict[str, list[float]] = field(default_factory=lambda: {"ttft": [], "tpot": []})


def pool_configs(a: argparse.Namespace) -> list[SimConfig]:
    base = dict(
        max_num_seqs=a.max_num_seqs,
        enable_prefix_caching=False,  # random prompts: no hits anyway, and it is faster
        kv_capacity_tokens=a.kv_tokens,
    )
    fast = SimConfig(decode_ms_per_token=a.decode_ms, prefill_ms_per_token=a.prefill_ms, **base)
    slow = SimConfig(
        decode_ms_per_token=2 * a.decode_ms, prefill_ms_per_token=2 * a.prefill_ms, **base
    )
    return [fast] * (a.sims - 1) + [slow]


def workload(a: argparse.Namespace, rate: float) -> list[tuple[float, int, int]]:
    """(arrival s, prompt tokens, output tokens), seeded: slo_routing.py's mix."""
    rng = random.Random(a.seed)
    out, t = [], 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= a.warmup_s + a.duration_s:
            return out
        if rng.random() < a.chat_share:
            out.append((t, a.chat_tokens, a.chat_out))
        else:
            out.append((t, a.long_tokens, a.long_out))


def run_level(a: argparse.Namespace, rate: float, sets: list[str]) -> dict:
    configs = pool_configs(a)
    engines = [VirtualEngine(c) for c in configs]
    scraped = [EndpointMetrics() for _ in engines]
    learners = {
        name: Learner(
            name,
            FEATURE_SETS[name.split(":")[0]],
            name.endswith(":rel"),
            a.min_samples,
            SampleBuffer(a.max_samples),
            ColdStart(a.cold_prefill_tps, a.cold_tpot_ms),
        )
        for name in sets
    }
    rng = random.Random(a.seed + 1)
    pending: dict[int, Pending] = {}
    events: list[tuple[float, int, int]] = []  # (time, kind, payload): 0 scrape, 1 refit, 2 arrive
    reqs = workload(a, rate)
    for rid, (t, _, _) in enumerate(reqs):
        heapq.heappush(events, (t, 2, rid))
    end = a.warmup_s + a.duration_s
    k = 0
    while (t := k * a.scrape_ms / 1000) < end:
        heapq.heappush(events, (t, 0, 0))
        k += 1
    k = 1
    while (t := k * a.refit_s) < end:
        heapq.heappush(events, (t, 1, 0))
        k += 1
    routed = [0] * len(engines)

    held: list[list[Finished]] = [[] for _ in engines]

    def collect(now: float) -> None:
        for _, f in finished_by(engines, held, now):
            p = pending.pop(f.rid)
            ttft_ms = 1000 * f.ttft_s
            tpot_ms = 1000 * f.itl_s if f.osl >= 2 else math.nan
            for lr in learners.values():
                _, _, pt, pp, learned = p.by_set[lr.name]
                # As the producer's post_response: features of the snapshot at pick
                # with the history as it is now, then this response joins the history.
                h, e = lr.history, p.snap
                tx, px = lr.features.ttft(e, p.isl, h, p.arrival), lr.features.tpot(e, h)
                lr.buffer.add(Sample(e.name, tx, px, ttft_ms, tpot_ms))
                running = e.metrics.running_requests
                h.observe(e.name, ttft_ms, tpot_ms, 1000 * f.duration_s, running)
                if p.arrival >= a.warmup_s and learned:
                    lr.errors["ttft"].append(abs(pt - ttft_ms) / ttft_ms)
                    if not math.isnan(tpot_ms):
                        lr.errors["tpot"].append(abs(pp - tpot_ms) / tpot_ms)

    while events:
        now, kind, payload = heapq.heappop(events)
        collect(now)
        if kind == 0:
            scraped[:] = scrape(engines, now)
        elif kind == 1:
            for lr in learners.values():
                if lr.buffer.added != lr.fitted_at:
                    lr.fitted_at = lr.buffer.added
                    lr.coef = fit(lr.buffer.copy(), lr.min_samples, relative=lr.relative)
        else:
            _, isl, osl = reqs[payload]
            view = epp_view(engines, scraped, pending, now, held)
            # the least EPP-counted in-flight requests, ties at random (a load-aware router
            # like the default profile's queue scorer, so the slow server gets less)
            least = min(e.inflight_requests for e in view)
            i = rng.choice([k for k, e in enumerate(view) if e.inflight_requests == least])
            snap = view[i]
            p = Pending(i, snap, isl, osl, now)
            for lr in learners.values():
                tx = lr.features.ttft(snap, isl, lr.history, now)
                px = lr.features.tpot(snap, lr.history)
                pt, pp, learned = predict(lr.coef, lr.cold, snap.name, tx, px)
                p.by_set[lr.name] = (tx, px, pt, pp, learned)
            pending[payload] = p
            engines[i].add(payload, isl, osl, now)
            routed[i] += 1
    for eng in engines:  # let everything finish (arrivals stopped at `end`)
        eng.advance_to(math.inf)
    collect(math.inf)
    row: dict = {"rate": rate, "requests": len(reqs), "routed": routed}
    for name, lr in learners.items():
        for dim in ("ttft", "tpot"):
            errs = lr.errors[dim]
            row[f"{name}_{dim}_mape"] = statistics.fmean(errs) if errs else math.nan
            row[f"{name}_{dim}_n"] = len(errs)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rates", default="4,8,12,16", help="Poisson arrival rates, req/s")
    p.add_argument(
        "--sets",
        default="basic:abs,basic:rel,queue:rel",
        help="models to compare, FEATURES:FIT each (features: "
        + ", ".join(FEATURE_SETS)
        + "; fit: abs = least squares in ms, rel = on the relative error)",
    )
    p.add_argument("--sims", type=int, default=3)
    p.add_argument("--warmup-s", type=float, default=30.0)
    p.add_argument("--duration-s", type=float, default=120.0)
    p.add_argument("--chat-share", type=float, default=0.7)
    p.add_argument("--chat-tokens", type=int, default=40)
    p.add_argument("--chat-out", type=int, default=16)
    p.add_argument("--long-tokens", type=int, default=1500)
    p.add_argument("--long-out", type=int, default=32)
    p.add_argument("--decode-ms", type=float, default=10.0)
    p.add_argument("--prefill-ms", type=float, default=0.2)
    p.add_argument("--max-num-seqs", type=int, default=4)
    p.add_argument("--kv-tokens", type=int, default=65536)
    p.add_argument("--scrape-ms", type=float, default=50.0)
    p.add_argument("--refit-s", type=float, default=2.0)
    p.add_argument("--max-samples", type=int, default=4096)
    p.add_argument("--min-samples", type=int, default=32)
    p.add_argument("--cold-prefill-tps", type=float, default=15928.0)
    p.add_argument("--cold-tpot-ms", type=float, default=20.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", help="write the rows here")
    a = p.parse_args()
    sets = a.sets.split(",")
    bad = [
        s
        for s in sets
        if s.count(":") != 1
        or s.split(":")[0] not in FEATURE_SETS
        or s.split(":")[1] not in ("abs", "rel")
    ]
    if bad:
        p.error(
            f"bad model(s) {bad}: FEATURES:FIT with features in {', '.join(FEATURE_SETS)} "
            "and fit abs or rel"
        )
    rows = []
    for rate in (float(r) for r in a.rates.split(",")):
        rows.append(run_level(a, rate, sets))
        print(json.dumps(rows[-1]), flush=True)
    head = " | ".join(f"{s} TTFT / TPOT MAPE" for s in sets)
    print(f"\n| rate req/s | requests (per endpoint) | {head} |")
    print("|---|---|" + "---|" * len(sets))
    for r in rows:
        cells = " | ".join(f"{r[f'{s}_ttft_mape']:.1%} / {r[f'{s}_tpot_mape']:.1%}" for s in sets)
        print(f"| {r['rate']:g} | {r['requests']} ({'/'.join(map(str, r['routed']))}) | {cells} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
