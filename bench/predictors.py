"""Load-predictor accuracy and cost: each model forecasts the next interval's request
count, mean ISL and mean OSL on each trace, walking forward one interval at a time as
the SLA planner does (add the interval, predict the next; the constant fallback of the
first points is scored too, because the planner lives through it).

Scores per (trace, interval, model):
- count MAPE: mean |pred - actual| / actual over intervals with actual > 0;
- count WAPE: sum |pred - actual| / sum actual (defined with zero intervals);
- count RMSE; under: share of intervals predicted > 20 % below the actual (too few
  replicas); ISL/OSL MAPE over intervals with requests, with idle intervals held
  (`hold-idle-lengths`, the default) and fed as 0 (ISLz/OSLz, Dynamo's rule);
- cov90: share of intervals whose count stayed at or under `predict_upper(1, 0.9)`
  (a calibrated model gives ~90 %); up90: mean upper / actual over intervals with
  requests (what provisioning to the upper quantile costs over the actual load);
- cost: median µs of one `add` + `predict` of the request-count model.
The last interval of each trace is cut short by the trace's end and is dropped.

Run: `.venv/bin/python bench/predictors.py` (add `--models constant,kalman` to skip
some, `--json FILE` for the raw numbers). Traces: ../shared/traces (beside the repo)
and `tracegen.bursty(seed=1, 7200 s, 5 req/s)`.
"""

from __future__ import annotations

import os

# Before numpy loads: OpenBLAS's spinning threads make ARIMA fits ~10x slower on a
# shared 2-core machine (tests/conftest.py).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from epp.planner.core.predictors import PredictorParams, build_predictor
from epp.planner.offline.tracegen import bursty
from epp.planner.offline.traces import Arrival, IntervalLoad, bucket
from epp.planner.tracefile import load_trace

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
MODELS = {
    "constant": PredictorParams(load_predictor="constant"),
    "kalman": PredictorParams(load_predictor="kalman"),
    "kalman-log1p": PredictorParams(load_predictor="kalman", load_predictor_log1p=True),
    "arima": PredictorParams(load_predictor="arima"),
    "arima-log1p": PredictorParams(load_predictor="arima", load_predictor_log1p=True),
    "prophet": PredictorParams(load_predictor="prophet"),
}
DEFAULT_MODELS = "constant,kalman,kalman-log1p,arima,prophet"


@dataclass
class Score:
    trace: str
    interval_s: float
    model: str
    n: int
    mape: float
    wape: float
    rmse: float
    under: float
    isl_mape: float
    osl_mape: float
    isl_mape_zero: float
    osl_mape_zero: float
    cov90: float
    up90: float
    us_per_step: float


def walk(params: PredictorParams, buckets: list[IntervalLoad], interval_s: float):
    """Forecasts after each interval: (count, ISL, OSL, count's q90 upper, ISL and OSL
    when idle intervals feed 0 as in Dynamo)."""
    models = [build_predictor(params, interval_s=interval_s) for _ in range(5)]
    preds: list[tuple[float, ...]] = []
    costs: list[float] = []
    for b in buckets[:-1]:
        t0 = time.perf_counter()
        models[0].add(b.count)
        p_count = models[0].predict()
        costs.append(time.perf_counter() - t0)
        if b.count:  # hold-idle-lengths (the default): no request, no length evidence
            models[1].add(b.mean_isl)
            models[2].add(b.mean_osl)
        models[3].add(b.mean_isl)  # Dynamo: NaN -> 0
        models[4].add(b.mean_osl)
        upper = models[0].predict_upper(1, 0.9)
        held = (models[1].predict(), models[2].predict())
        zero = (models[3].predict(), models[4].predict())
        preds.append((p_count, *held, upper, *zero))
    return preds, costs


def mape(pairs: list[tuple[float, float]]) -> float:
    pairs = [(p, a) for p, a in pairs if a > 0 and not math.isnan(a)]
    return 100 * statistics.fmean(abs(p - a) / a for p, a in pairs) if pairs else math.nan


def score(trace: str, interval_s: float, model: str, buckets: list[IntervalLoad]) -> Score:
    preds, costs = walk(MODELS[model], buckets, interval_s)
    actual = buckets[1:]
    pairs = list(zip(preds, actual, strict=True))
    count = [(p[0], a.count) for p, a in zip(preds, actual, strict=True)]
    return Score(
        trace=trace,
        interval_s=interval_s,
        model=model,
        n=len(count),
        mape=mape(count),
        wape=100 * sum(abs(p - a) for p, a in count) / max(1, sum(a for _, a in count)),
        rmse=math.sqrt(statistics.fmean((p - a) ** 2 for p, a in count)),
        under=100 * statistics.fmean(1.0 if p < 0.8 * a else 0.0 for p, a in count),
        isl_mape=mape([(p[1], a.mean_isl) for p, a in zip(preds, actual, strict=True)]),
        osl_mape=mape([(p[2], a.mean_osl) for p, a in zip(preds, actual, strict=True)]),
        isl_mape_zero=mape([(p[4], a.mean_isl) for p, a in pairs]),
        osl_mape_zero=mape([(p[5], a.mean_osl) for p, a in pairs]),
        cov90=100 * statistics.fmean(1.0 if a.count <= p[3] else 0.0 for p, a in pairs),
        up90=statistics.fmean([p[3] / a.count for p, a in pairs if a.count > 0] or [math.nan]),
        us_per_step=1e6 * statistics.median(costs),
    )


def traces() -> dict[str, list[Arrival]]:
    for name in ("mooncake-synthetic.jsonl", "azure-llm-conv-2023.csv"):
        if not (TRACES / name).exists():
            sys.exit(f"missing {TRACES / name}: the shared traces must sit beside the repo")
    return {
        "mooncake": load_trace(TRACES / "mooncake-synthetic.jsonl"),
        "azure": load_trace(TRACES / "azure-llm-conv-2023.csv"),
        "bursty": bursty(seed=1, duration_s=7200, mean_rate=5.0),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=DEFAULT_MODELS, help=f"of {', '.join(MODELS)}")
    ap.add_argument(
        "--intervals",
        default="60,180",
        help="seconds; traces shorter than 30 min also get 30 s (Mooncake spans 17 min)",
    )
    ap.add_argument("--json", help="write the scores here")
    args = ap.parse_args()
    models = args.models.split(",")
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        sys.exit(f"unknown model(s) {unknown}; choose from {', '.join(MODELS)}")
    rows: list[Score] = []
    print(
        f"{'trace':9} {'int':>4} {'model':13} {'n':>4} {'MAPE%':>7} {'WAPE%':>7} {'RMSE':>8} "
        f"{'under%':>7} {'ISL%':>6} {'OSL%':>6} {'ISLz%':>6} {'OSLz%':>6} {'cov90':>6} "
        f"{'up90':>5} {'us/step':>9}"
    )
    for trace, arrivals in traces().items():
        intervals = [float(x) for x in args.intervals.split(",")]
        if arrivals[-1].t_s < 1800 and 30.0 not in intervals:
            intervals.insert(0, 30.0)
        for interval in intervals:
            # The last interval ends at the last arrival, not a full interval: drop it.
            buckets = bucket(arrivals, interval)[:-1]
            if len(buckets) < 9:
                print(f"{trace:9} {interval:4.0f} skipped: {len(buckets)} intervals")
                continue
            for model in models:
                s = score(trace, interval, model, buckets)
                rows.append(s)
                print(
                    f"{s.trace:9} {s.interval_s:4.0f} {s.model:13} {s.n:4d} {s.mape:7.1f} "
                    f"{s.wape:7.1f} {s.rmse:8.1f} {s.under:7.1f} {s.isl_mape:6.1f} "
                    f"{s.osl_mape:6.1f} {s.isl_mape_zero:6.1f} {s.osl_mape_zero:6.1f} "
                    f"{s.cov90:6.1f} {s.up90:5.2f} {s.us_per_step:9.0f}",
                    flush=True,
                )
    if args.json:
        Path(args.json).write_text(json.dumps([s.__dict__ for s in rows], indent=1))


if __name__ == "__main__":
    main()
