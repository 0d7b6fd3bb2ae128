"""Turn `epp plan replay --compare --sweep --json` files into one results table.

    .venv/bin/python bench/planner_frontier.py --suite planner_field_onehour \
        --title "..." --command "..." A.json B.json

Writes docs/data/results/<suite>.json (the schema docs/BENCHMARKS.md is generated
from): one row per trace, start-up delay and policy, with each policy's cheapest point
at >= 99 % of requests within both SLAs over its swept settings, and `epp` checked
against the targets: >= 99 % of requests and >= 95 % in every 5-minute window, 0 lost,
<= 1 reversal per 30 minutes, never over the budget, <= 0.65x static-peak's GPU-hours
and <= 0.9x the cheapest >= 99 % point of any field law's frontier. `--notes` adds the
markdown the checks cannot know (why a target is missed).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TARGET = 0.99
FIELD = ("keda-queue", "llm-d-slo", "load")
COLUMNS = [
    "trace", "startup_s", "policy", "setting", "gpu_hours", "vs_static_peak", "vs_oracle",
    "requests_within_sla", "worst_5min", "lost", "reversals", "over_budget",
    "cheapest_99_gpu_hours", "cheapest_99_setting",
]  # fmt: skip


def comparisons(doc: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(comparison, its sweep or {}) per start-up delay."""
    runs = doc.get("startup_sweep") or [doc]
    sweeps = {s["startup_s"]: s for s in doc.get("sweep", [])}
    return [(r, sweeps.get(r["startup_s"], {})) for r in runs]


def rows_of(doc: dict[str, Any]) -> tuple[list[list[Any]], list[str]]:
    name = Path(doc["trace"]).name
    if doc.get("rate_scale", 1.0) != 1.0:
        name += f" x{doc['rate_scale']:g}"
    rows: list[list[Any]] = []
    checks: list[str] = []
    for run, sweep in comparisons(doc):
        pols = sweep.get("policies", {})
        minutes = doc["last_arrival_s"] / 60.0
        for p in run["policies"]:
            best = pols.get(p["name"], {}).get("cheapest_at_target")
            setting = next(
                (
                    q["setting"]
                    for q in pols.get(p["name"], {}).get("points", [])
                    if q["documented"]
                ),
                "",
            )
            rows.append([
                name, run["startup_s"], p["name"], setting, p["gpu_hours"],
                p["gpu_hours_vs_static_peak"], p["gpu_hours_vs_oracle"], p["sla_requests"],
                p["worst_5min_requests"], p["lost"], p["reversals"],
                p["intervals_over_budget"],
                None if best is None else best["gpu_hours"],
                None if best is None else best["setting"],
            ])  # fmt: skip
        epp = next((p for p in run["policies"] if p["name"] == "epp"), None)
        if epp is not None:
            checks.append(check(name, run, epp, pols, minutes))
        for why in doc.get("refused", {}).values():
            rows.append([name, run["startup_s"], "dynamo", "not run: " + why] + [None] * 10)
    return rows, checks


def check(name: str, run: dict[str, Any], epp: dict[str, Any], pols: dict, minutes: float) -> str:
    field = [
        pols[n]["cheapest_at_target"]["gpu_hours"]
        for n in FIELD
        if pols.get(n, {}).get("cheapest_at_target")
    ]
    cheapest = min(field) if field else None
    allowed = max(1, int(minutes // 30))
    parts = [
        f"requests {epp['sla_requests']:.2%} "
        f"({'met' if epp['sla_requests'] >= TARGET else 'MISSED'})",
        f"worst 5 min {epp['worst_5min_requests']:.1%} "
        f"({'met' if epp['worst_5min_requests'] >= 0.95 else 'MISSED'})",
        f"lost {epp['lost']}",
        f"reversals {epp['reversals']} (<= {allowed}: "
        f"{'met' if epp['reversals'] <= allowed else 'MISSED'})",
        f"over budget {epp['intervals_over_budget']}",
        f"{epp['gpu_hours_vs_static_peak']:.2f}x static-peak "
        f"({'met' if epp['gpu_hours_vs_static_peak'] <= 0.65 else 'MISSED'} <= 0.65x)",
    ]
    peak = next((p for p in run["policies"] if p["name"] == "static-peak"), None)
    if peak is not None:
        gap = 100 * (peak["sla_requests"] - epp["sla_requests"])
        cheaper = epp["gpu_hours"] <= peak["gpu_hours"]
        ok = gap <= 0.5 and cheaper
        parts.append(
            f"{gap:+.1f} points below static-peak at {'fewer' if cheaper else 'more'} GPU-hours "
            f"({'met' if ok else 'MISSED'}: <= 0.5 at equal or fewer)"
        )
    if cheapest:
        r = epp["gpu_hours"] / cheapest
        parts.append(
            f"{r:.2f}x the cheapest field point at >= 99 % ({'met' if r <= 0.9 else 'MISSED'} "
            "<= 0.9x)"
        )
    elif not pols:
        parts.append("the laws were not swept")
    else:
        parts.append("no field law reaches 99 % at any swept setting")
    return f"- {name}, start-up {run['startup_s']:g} s{CHECKED}" + "; ".join(parts)


CHECKED = ", epp: "  # ends the head of a `check` line: the slice and delay it is about


def checked(line: str) -> str | None:
    """The slice and delay a `check` line is about (None for any other line)."""
    head, sep, _ = line.partition(CHECKED)
    return head if sep and line.startswith("- ") else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--suite", required=True)
    ap.add_argument("--title", required=True)
    ap.add_argument("--command", required=True)
    ap.add_argument("--notes", default="")
    args = ap.parse_args()
    rows: list[list[Any]] = []
    checks: list[str] = []
    for f in args.files:
        r, c = rows_of(json.loads(f.read_text()))
        rows += r
        checks += c
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    load = os.getloadavg()[0]
    doc = {
        "suite": args.suite,
        "title": args.title,
        "command": args.command,
        "git_commit": commit,
        "machine": f"2 cores shared with other sessions (load average {load:.0f} when written)",
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "columns": COLUMNS,
        "rows": rows,
        "notes": (args.notes + "\n\n" if args.notes else "") + "\n".join(checks),
    }
    out = ROOT / "docs" / "data" / "results" / f"{args.suite}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}")
    print("\n".join(checks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
