"""Turn a `bench/slo_family.py --json RUN` into a results file (docs/data/results/): one
row per workload and setup with attainment, goodput and per-class TTFT p50/p90/p99 and
TPOT p90, the pool and mix spelled out, and the predictor's error per class and endpoint
(median over runs of each setup) kept as `predictor_error`.

    .venv/bin/python bench/slo_results.py RUN.json --suite slo_tiers_reporting_virtual \
        --title "..." --command "python bench/slo_family.py ..." --notes "..."
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.results import Result  # noqa: E402

COLUMNS = [
    "workload",
    "pool and mix",
    "setup",
    "within both %",
    "goodput req/s",
    "chat within %",
    "chat TTFT p50 ms",
    "chat TTFT p90 ms",
    "chat TTFT p99 ms",
    "chat TPOT p90 ms",
    "long within %",
    "long TTFT p50 ms",
    "long TTFT p90 ms",
    "long TTFT p99 ms",
]


def mix(w: dict) -> str:
    return (
        f"{w['load']:.2f} load, {w['slow_count']}x{w['slow_factor']:.2f} slow, "
        f"{100 * w['chat_share']:.0f}% chat {w['chat_ttft_ms']:g}/{w['chat_tpot_ms']:g} ms"
    )


def rows(results: list[dict]) -> list[list[object]]:
    out: list[list[object]] = []
    for r in results:
        w = r["workload"]
        for setup, m in r["medians"].items():
            ttft = [round(m[f"{c}_ttft_p{q}"], 1) for c in ("chat",) for q in (50, 90, 99)]
            lttft = [round(m[f"long_ttft_p{q}"], 1) for q in (50, 90, 99)]
            out.append(
                [w["name"], mix(w), setup, round(100 * m["attainment"], 1),
                 round(m["goodput_rps"], 2), round(100 * m["chat_attain"], 1), *ttft,
                 round(m["chat_tpot_p90"], 1), round(100 * m["long_attain"], 1), *lttft]
            )  # fmt: skip
    return out


def predictor_error(results: list[dict], only: set[str] | None = None) -> dict:
    """{setup: {workload: {"e0/chat": {ttft_ratio, tpot_ratio, ttft_mape, n}}}}: medians
    over runs (predicted / observed on the picked endpoint; < 1 = optimistic)."""
    out: dict = {}
    for r in results:
        for setup, runs in r["runs"].items():
            if only and setup not in only:
                continue
            keys = sorted({k for run in runs for k in run.get("errors", {})})
            cell = {}
            for k in keys:
                vals = [run["errors"][k] for run in runs if k in run.get("errors", {})]
                cell[k] = {
                    f: round(statistics.median(v[f] for v in vals), 3)
                    for f in ("ttft_ratio", "tpot_ratio", "ttft_mape", "n")
                    if all(v[f] == v[f] for v in vals)
                }
            if cell:
                out.setdefault(setup, {})[r["workload"]["name"]] = cell
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run", type=Path)
    p.add_argument("--suite", required=True)
    p.add_argument("--title", required=True)
    p.add_argument("--command", required=True)
    p.add_argument("--notes", default="")
    p.add_argument(
        "--errors-for", default="", help="keep the predictor's error of these setups only (a,b)"
    )
    a = p.parse_args()
    results = json.loads(a.run.read_text())
    res = Result.measured(
        a.suite, a.title, a.command, COLUMNS, rows(results), a.notes,
        predictor_error=predictor_error(results, set(filter(None, a.errors_for.split(",")))),
    )  # fmt: skip
    print(res.write())


if __name__ == "__main__":
    main()
