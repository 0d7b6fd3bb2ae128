"""The planner-against-the-field tables: `epp plan replay --compare --sweep-startup ...
--json` files (and single-policy runs' files, merged in by trace, rate scale and start-up
delay) turned into one markdown table per trace and rate scale, with the `epp` row
checked against the targets.

    .venv/bin/python bench/planner_fleet.py RUN.json [RUN.json ...] [--pareto-dir DIR]

`--pareto-dir` draws the Pareto view of each trace and rate scale from the merged runs
(`plots.plot_pareto`), so policies replayed in separate runs share one plot.

Each `epp` row is judged on:
- >= 99 % of requests within both SLAs, >= 95 % in every 5-minute window;
- against each of `llm-d-slo`, `keda-queue` and `dynamo`: <= 0.9x its GPU-hours at
  equal or better request attainment (the issue: a user wants to see `epp` beat all of
  them on the same traffic);
- <= 0.65x static-peak's GPU-hours where the oracle's is <= 0.65x;
- <= 1 reversal per 30 minutes of trace, 0 requests lost, 0 intervals over budget.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

BASELINES = ("llm-d-slo", "keda-queue", "dynamo")
ORDER = ("oracle", "static-peak", "static-mean", "keda-queue", "llm-d-slo", "load", "dynamo",
         "epp")  # fmt: skip


def runs_of(path: Path) -> list[dict[str, Any]]:
    """Every (start-up delay) comparison in one JSON file, with the file's trace meta."""
    doc = json.loads(path.read_text())
    meta = {k: doc.get(k) for k in ("trace", "rate_scale", "requests", "last_arrival_s")}
    if "oracle_target" in doc:  # files before `--oracle-target` have none: the p90 oracle
        meta["oracle_target"] = doc["oracle_target"]
    runs = doc.get("startup_sweep") or [doc]
    return [meta | r for r in runs]


def merge(paths: list[Path]) -> dict[tuple[str, float], dict[float, dict[str, Any]]]:
    """(trace, rate scale) -> start-up delay -> {"run": a run's setup, "policies": by name};
    a later file's policy replaces an earlier one's of the same name."""
    out: dict[tuple[str, float], dict[float, dict[str, Any]]] = defaultdict(dict)
    for path in paths:
        for run in runs_of(path):
            key = (Path(run["trace"]).name, float(run["rate_scale"]))
            slot = out[key].setdefault(float(run["startup_s"]), {"run": run, "policies": {}})
            for p in run["policies"]:
                if p["name"] == "oracle":
                    p = p | {"target": run.get("oracle_target", "p90")}
                slot["policies"][p["name"]] = p
    return out


def verdict(ps: dict[str, dict[str, Any]], minutes: float) -> list[str]:
    """What the `epp` row misses of the targets (empty: all met)."""
    e = ps.get("epp")
    if e is None:
        return ["no epp run"]
    out = []
    if e["sla_requests"] < 0.99:
        out.append(f"requests {e['sla_requests']:.1%} < 99 %")
    if e["worst_5min_requests"] < 0.95:
        out.append(f"worst 5 min {e['worst_5min_requests']:.1%} < 95 %")
    for name in BASELINES:
        b = ps.get(name)
        if b is None:
            continue
        ratio = e["gpu_hours"] / b["gpu_hours"] if b["gpu_hours"] > 0 else math.inf
        if ratio > 0.9 or e["sla_requests"] < b["sla_requests"]:
            out.append(
                f"not below {name} ({ratio:.2f}x its GPU-h at {e['sla_requests']:.1%} of "
                f"requests vs its {b['sla_requests']:.1%})"
            )
    peak, oracle = ps.get("static-peak"), ps.get("oracle")
    if peak and oracle and oracle["gpu_hours"] <= 0.65 * peak["gpu_hours"]:
        r = e["gpu_hours"] / peak["gpu_hours"]
        if r > 0.65:
            out.append(f"GPU-h {r:.2f}x static-peak > 0.65x (oracle "
                       f"{oracle['gpu_hours'] / peak['gpu_hours']:.2f}x)")  # fmt: skip
    per30 = e["reversals"] / max(minutes / 30.0, 1e-9)
    if per30 > 1.0:
        out.append(f"{per30:.1f} reversals / 30 min > 1")
    if e["lost"]:
        out.append(f"{e['lost']} lost")
    if e["intervals_over_budget"]:
        out.append(f"{e['intervals_over_budget']} intervals over budget")
    return out


def table(key: tuple[str, float], by_startup: dict[float, dict[str, Any]]) -> str:
    trace, scale = key
    any_run = next(iter(by_startup.values()))["run"]
    minutes = any_run["last_arrival_s"] / 60.0
    sla = any_run["sla"]
    lines = [
        f"**{trace} x{scale:g}** ({any_run['requests']:,} requests over {minutes:.0f} min; "
        f"SLA {_sla_words(sla)}; static-peak "
        f"{any_run['static_peak_replicas']} replicas, static-mean "
        f"{any_run['static_mean_replicas']}, budget {any_run['budget_gpus']} GPUs"
        f"{_oracle_words(by_startup)})",
        "",
        "| start-up | policy | GPU-h | vs static-peak | vs oracle | requests in SLA | "
        "intervals in SLA | worst 5 min | actions | reversals | lost | > budget | to min s |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    verdicts = []
    for startup in sorted(by_startup):
        ps = by_startup[startup]["policies"]
        peak = ps.get("static-peak", {}).get("gpu_hours")
        oracle = ps.get("oracle", {}).get("gpu_hours")
        for name in sorted(ps, key=lambda n: ORDER.index(n) if n in ORDER else len(ORDER)):
            p = ps[name]
            lag = "-" if p.get("to_min_pool_s") is None else f"{p['to_min_pool_s']:.0f}"
            lines.append(
                f"| {startup:g} s | {name} | {p['gpu_hours']:.2f} | {_r(p['gpu_hours'], peak)} | "
                f"{_r(p['gpu_hours'], oracle)} | {p['sla_requests']:.1%} | "
                f"{p['sla_intervals']:.1%} | {p['worst_5min_requests']:.1%} | {p['actions']} | "
                f"{p['reversals']} | {p['lost']} | {p['intervals_over_budget']} | {lag} |"
            )
        miss = verdict(ps, minutes)
        verdicts.append(f"- start-up {startup:g} s: " + ("all targets met" if not miss
                                                          else "; ".join(miss)))  # fmt: skip
    return "\n".join([*lines, "", "`epp` against the targets:", *verdicts, ""])


def pareto(key: tuple[str, float], by_startup: dict[float, dict[str, Any]], out: Path) -> Path:
    from epp.planner.offline.outcome import Sla
    from epp.planner.plots import ParetoPoint, plot_pareto

    trace, scale = key
    points = [
        ParetoPoint(
            name,
            startup,
            p["gpu_hours"],
            p["sla_requests"],
            static=p["actions"] == 0 and name.startswith("static"),
        )
        for startup in sorted(by_startup)
        for name, p in by_startup[startup]["policies"].items()
    ]
    sla = next(iter(by_startup.values()))["run"]["sla"]
    # the names docs/BENCHMARKS.md links: docs/planner_pareto_azure_llm_conv_2023_x3.png
    path = out / f"planner_pareto_{Path(trace).stem.replace('-', '_')}_x{scale:g}.png"
    plot_pareto(path, points, title=f"{trace} x{scale:g}", sla=Sla(sla["ttft_ms"], sla["itl_ms"]))
    return path


def _sla_words(sla: dict[str, Any]) -> str:
    """The SLA as its rule states it (files before the rule existed: p90 per interval)."""
    if sla.get("rule") == "requests":
        return (
            f"per request TTFT <= {sla['ttft_ms']:g} ms, ITL <= {sla['itl_ms']:g} ms, the "
            "tightest at which static-peak keeps >= 99 % of requests within both and >= 95 % "
            "in every 5-minute window"
        )
    return f"p90 TTFT <= {sla['ttft_ms']:g} ms, ITL <= {sla['itl_ms']:g} ms in every interval"


def _oracle_words(by_startup: dict[float, dict[str, Any]]) -> str:
    """The oracle's bar, when one was run (`--oracle-target`, laws/oracle.py)."""
    targets = {
        slot["policies"]["oracle"]["target"]
        for slot in by_startup.values()
        if "oracle" in slot["policies"]
    }
    if not targets:
        return ""
    words = [
        "p90 TTFT and ITL within in each interval"
        if t == "p90"
        else f">= {float(t[4:]):.0%} of the run's requests within both, >= 95% per 5 minutes"
        if str(t).startswith("run:")
        else f">= {float(t):.0%} of each interval's requests within both"
        for t in sorted(targets, key=str)
    ]
    return "; oracle sized at " + " / ".join(words)


def _r(x: float, base: float | None) -> str:
    return f"{x / base:.2f}" if base else "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", nargs="+", type=Path)
    ap.add_argument("--pareto-dir", type=Path, help="draw each trace's Pareto view here")
    args = ap.parse_args()
    merged = merge(args.json)
    for key in sorted(merged):
        print(table(key, merged[key]))
        if args.pareto_dir:
            print(f"(wrote {pareto(key, merged[key], args.pareto_dir)})\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
