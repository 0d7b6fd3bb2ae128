"""bench/slo_results.py: a slo_family --json run becomes schema rows and per-setup errors."""

import math

from bench.results import check
from bench.slo_results import COLUMNS, predictor_error, rows

FIGS = {
    "attainment": 0.8, "goodput_rps": 5.0, "chat_attain": 0.75, "long_attain": 0.9,
    "chat_tpot_p90": 21.0,
    **{f"{c}_ttft_p{q}": float(q) for c in ("chat", "long") for q in (50, 90, 99)},
}  # fmt: skip
WORKLOAD = {
    "name": "w00", "load": 0.72, "slow_count": 1, "slow_factor": 2.55, "chat_share": 0.58,
    "chat_ttft_ms": 200.0, "chat_tpot_ms": 30.0,
}  # fmt: skip


def run(errors: dict) -> dict:
    return {"errors": errors}


def test_rows_fit_the_schema_and_spell_out_the_pool():
    results = [{"workload": WORKLOAD, "medians": {"default": FIGS}, "runs": {"default": []}}]
    out = rows(results)
    check({"suite": "s", "title": "t", "command": "c", "git_commit": "g", "machine": "m",
           "date": "d", "columns": COLUMNS, "rows": out, "notes": ""}, "x.json")  # fmt: skip
    assert out[0][:4] == ["w00", "0.72 load, 1x2.55 slow, 58% chat 200/30 ms", "default", 80.0]


def test_predictor_error_is_the_median_over_runs_and_skips_nan_fields():
    e = {"ttft_ratio": 0.9, "tpot_ratio": math.nan, "ttft_mape": 0.2, "n": 10}
    runs = [run({"e0/chat": {**e, "ttft_ratio": r}}) for r in (0.5, 0.9, 1.0)]
    results = [{"workload": WORKLOAD, "runs": {"a": runs, "b": runs}}]
    got = predictor_error(results, {"a"})
    assert list(got) == ["a"]
    assert got["a"]["w00"]["e0/chat"] == {"ttft_ratio": 0.9, "ttft_mape": 0.2, "n": 10}
