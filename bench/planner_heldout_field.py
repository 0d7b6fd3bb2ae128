"""The field's laws on held-out ServeGen days, each over its main knob, judged as frontiers.

    python bench/planner_heldout_field.py --slices 172:12,213:12 --scale 0.015 \
        --preset llama-3.1-70b-4xh100 --startups 100,300 --static-peak 2,3

Per slice and start-up delay: `epp plan replay --compare --sweep` of static-peak and
the field's laws at the set-up their documentation prescribes (`laws/catalog.py`,
`load` at `epp profile`'s recommended thresholds), plus each law's main knob swept:
`keda-queue` its per-replica target (5 down to 0.5), `llm-d-slo` its band (the guide's
0.55/0.40, tighter and looser; min 3 replicas, max the planner's budget), `load` its KV
band around the profiler's and below its floor (`LOAD_LOW_KV`). `dynamo` is refused on
an aggregated pool, as upstream's aggregated planner refuses SLA scaling. Writes
docs/data/results/<suite>.json: per law
its frontier and cheapest point keeping >= 99 % of requests within both SLAs, and
`epp`'s GPU-hours as a ratio to the cheapest of those, `epp` taken from the held-out
table at these pools (docs/data/results/planner_heldout_small.json).

`--ratio-only` recomputes the `epp` rows from the two results files without replaying
(after the held-out table is re-measured).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.planner_frontier import FIELD, TARGET  # noqa: E402
from bench.planner_heldout import SERVEGEN, replay, slice_trace  # noqa: E402
from bench.results import RESULTS, Result, load_span  # noqa: E402
from epp.planner.offline.sweep import Point, cheapest_at, frontier  # noqa: E402

# one replay process per part of a comparison: static-peak (and dynamo's refusal) with
# keda-queue, then each other law, every part with its law's sweep
PARTS = {"keda": "static-peak,keda-queue,dynamo", "llmd": "llm-d-slo", "load": "load"}
# `load` below the profiler's KV floor (its formula never goes under 0.1): on short
# requests the KV use stays under it and the law never leaves min-endpoint. Each band
# is one replay of `load` with a planner file (up, down; the prefill queue thresholds
# left at their defaults: an aggregated pool does not read them), added to its points.
LOAD_LOW_KV = ((0.1, 0.05), (0.05, 0.02), (0.02, 0.01))
COLUMNS = [
    "trace", "startup_s", "policy", "setting", "gpu_hours", "vs_static_peak",
    "requests_within_sla", "worst_5min", "on_frontier", "cheapest_99", "epp_vs_cheapest_99",
]  # fmt: skip
POLICY, SETTING, GPU_HOURS, SHARE, FRONTIER, CHEAPEST, RATIO = 2, 3, 4, 6, 8, 9, 10
EPP_SETTING = "as shipped (planner_heldout_small.json)"
SUMMARY = "**Per slice and start-up delay** (cheapest point at >= 99 % of requests):"


def sweep_rows(doc: dict[str, Any], trace: str) -> list[list[Any]]:
    """Every swept point of one comparison (one start-up delay), static-peak first."""
    peak = next(p for p in doc["policies"] if p["name"] == "static-peak")
    (sweep,) = doc["sweep"]
    rows = [
        [trace, doc["startup_s"], "static-peak", f"{peak['initial_replicas']} replicas",
         peak["gpu_hours"], 1.0, peak["sla_requests"], peak["worst_5min_requests"], True,
         peak["sla_requests"] >= TARGET, None],
    ]  # fmt: skip
    for name, law in sweep["policies"].items():
        if name not in FIELD:
            continue
        best = law["cheapest_at_target"]
        for q in sorted(law["points"], key=lambda q: q["gpu_hours"]):
            setting = q["setting"] + (" (documented)" if q["documented"] else "")
            rows.append([
                trace, doc["startup_s"], name, setting, q["gpu_hours"],
                round(q["gpu_hours"] / peak["gpu_hours"], 4), q["sla_requests"],
                q["worst_5min_requests"], q["setting"] in law["frontier"],
                best is not None and best["setting"] == q["setting"], None,
            ])  # fmt: skip
    for why in doc.get("refused", {}).values():
        rows.append([trace, doc["startup_s"], "dynamo", "not run: " + why] + [None] * 7)
    return rows


def epp_rows(field: list[list[Any]], heldout: dict[str, Any]) -> list[list[Any]]:
    """`epp`'s row of the held-out table per (trace, start-up) the field was swept on,
    with its GPU-hours over the cheapest field point at >= 99 %."""
    cols = heldout["columns"]
    out = []
    for r in heldout["rows"]:
        row = dict(zip(cols, r, strict=True))
        if row["policy"] != "epp":
            continue
        key = (row["trace"], row["startup_s"])
        field_best = [
            f[GPU_HOURS] for f in field if (f[0], f[1]) == key and f[CHEAPEST] and f[2] in FIELD
        ]
        if not any((f[0], f[1]) == key for f in field):
            continue
        ratio = round(row["gpu_hours"] / min(field_best), 4) if field_best else None
        out.append([
            row["trace"], row["startup_s"], "epp", EPP_SETTING, row["gpu_hours"],
            row["vs_static_peak"], row["requests_within_sla"], row["worst_5min"], None, None,
            ratio,
        ])  # fmt: skip
    return out


def merged(field: list[list[Any]], epp: list[list[Any]]) -> list[list[Any]]:
    """Field rows with each (trace, start-up)'s epp row after them."""
    out: list[list[Any]] = []
    keys = list(dict.fromkeys((r[0], r[1]) for r in field))
    for k in keys:
        out += [r for r in field if (r[0], r[1]) == k]
        out += [r for r in epp if (r[0], r[1]) == k]
    return out


def summary_lines(rows: list[list[Any]]) -> list[str]:
    """Per (trace, start-up): each law's cheapest >= 99 % point (or its best share) and
    epp's ratio to the cheapest of them."""
    lines = []
    for key in dict.fromkeys((r[0], r[1]) for r in rows):
        at = [r for r in rows if (r[0], r[1]) == key and r[GPU_HOURS] is not None]
        peak = next(r for r in at if r[POLICY] == "static-peak")
        cells = []
        for law in FIELD:
            pts = [r for r in at if r[POLICY] == law]
            if not pts:
                continue
            best = next((r for r in pts if r[CHEAPEST]), None)
            if best is None:
                top = max(pts, key=lambda r: r[SHARE])
                cells.append(
                    f"`{law}` never reaches 99 % ({len(pts)} settings; best {top[SHARE]:.2%} "
                    f"at {top[SETTING]}, {top[GPU_HOURS] / peak[GPU_HOURS]:.2f}x static-peak)"
                )
            else:
                cells.append(
                    f"`{law}` {best[GPU_HOURS]:.1f} GPU-h ({best[GPU_HOURS] / peak[GPU_HOURS]:.2f}x"
                    f" static-peak) at {best[SETTING]}"
                )
        e = next((r for r in at if r[POLICY] == "epp"), None)
        if e is not None:
            if e[RATIO] is None:
                cells.append("`epp` has no field point at >= 99 % to compare against")
            else:
                # the target compares two points that both reach 99 %
                met = "met" if e[RATIO] <= 0.9 and e[SHARE] >= 0.99 else "MISSED"
                if e[RATIO] <= 0.9 and e[SHARE] < 0.99:
                    met = "MISSED: epp itself is below 99 %"
                cells.append(
                    f"`epp` {e[GPU_HOURS]:.1f} GPU-h at {e[SHARE]:.2%} = {e[RATIO]:.2f}x the "
                    f"cheapest ({met}: <= 0.9x)"
                )
        lines.append(f"- {key[0]}, start-up {key[1]:g} s: " + "; ".join(cells))
    return lines


def notes_with(text: str, rows: list[list[Any]]) -> str:
    """`text`, then the per-slice summary (what `--ratio-only` rewrites)."""
    return (text + "\n\n" if text else "") + SUMMARY + "\n" + "\n".join(summary_lines(rows))


def run(args: argparse.Namespace) -> list[list[Any]]:
    """Every slice at the first start-up, then every slice at the next (a run cut short
    has the first delay complete). Each comparison is split by law (`PARTS`), every part
    of every slice of one delay its own replay process, side by side: a law's JSON is
    kept when another's run is cut short, and the parts of one comparison share its
    set-up (the same trace, SLA, budget and static-peak size), so they merge into it.
    `--existing`: only the parts whose JSON a run left, none replayed."""
    slices = [tuple(int(x) for x in s.split(":")) for s in args.slices.split(",")]
    peaks = args.static_peak.split(",") if args.static_peak else [None] * len(slices)
    traces = [slice_trace(args, start, hours) for start, hours in slices]
    docs: dict[tuple[int, str], list[dict[str, Any]]] = {}
    parts = args.parts.split(",")
    for startup in args.startups.split(","):
        # `loadkv` after the others: it takes the budget the load part's replay set
        for phase in ([p for p in parts if p != "loadkv"], [p for p in parts if p == "loadkv"]):
            jobs = []
            for k, (trace, peak) in enumerate(zip(traces, peaks, strict=True)):
                extra = ["--sweep", "--startup-s", startup]
                extra += ["--static-peak", peak] if peak else []
                stem = Path(args.workdir) / f"{trace.stem}-{args.preset}-field-{startup}"
                for part in phase:
                    out = Path(f"{stem}-{part}.json")
                    if part == "loadkv":
                        budget = json.loads(Path(f"{stem}-load.json").read_text())["budget_gpus"]
                        jobs.append(((k, startup), ("loadkv", trace, str(stem), extra, budget)))
                    elif out.exists() or not args.existing:
                        jobs.append(((k, startup), (trace, out, PARTS[part], extra)))
            with ThreadPoolExecutor(max(1, len(jobs))) as pool:
                done = list(pool.map(lambda j: run_part(args, j[1]), jobs))
            for (key, _), doc in zip(jobs, done, strict=True):
                docs.setdefault(key, []).append(doc)
    rows: list[list[Any]] = []
    for (k, _), parts in docs.items():
        start, hours = slices[k]
        name = f"ServeGen m-small h{start}-{start + hours} x{args.scale:g}"
        peak = [p for (i, _), ds in docs.items() if i == k for d in ds for p in d["policies"]]
        rows += sweep_rows(merge_parts(parts, peak), name)
    return rows


def run_part(args: argparse.Namespace, job: tuple) -> dict[str, Any]:
    if job[0] == "loadkv":
        _, trace, stem, extra, budget = job
        return low_kv(argparse.Namespace(**vars(args) | {"budget": budget}), trace, stem, extra)
    return replay(args, *job)


def judged(points: list[dict[str, Any]]) -> dict[str, Any]:
    """A law's swept points with its frontier and cheapest point at >= 99 % (as
    `offline.sweep` judges them)."""
    pts = [
        Point(q["policy"], q["setting"], q["gpu_hours"], q["sla_requests"],
              q["worst_5min_requests"], q["documented"])
        for q in points
    ]  # fmt: skip
    best = cheapest_at(pts, TARGET)
    return {
        "points": points,
        "frontier": [p.setting for p in frontier(pts)],
        "cheapest_at_target": None if best is None else best.as_json(),
    }


def low_kv(args: argparse.Namespace, trace: Path, stem: str, extra: list[str]) -> dict:
    """`load` at each of `LOAD_LOW_KV`, as a part: the budget (`args.budget`, what the
    load part's replay set) and GPUs per replica a replay without a planner file gives,
    the product SLA given as the file would otherwise set it."""
    gpus, per = int(args.budget), 4
    points = []
    for up, down in LOAD_LOW_KV:
        planner = Path(f"{stem}-loadkv-{up:g}.yaml")
        planner.write_text(
            f"max-gpu-budget: {gpus}\ndecode-engine-num-gpu: {per}\n"
            f"prefill-engine-num-gpu: {per}\ndecode-kv-scale-up-threshold: {up}\n"
            f"decode-kv-scale-down-threshold: {down}\n"
        )
        one = argparse.Namespace(**vars(args) | {"planner": str(planner)})
        out = Path(f"{stem}-loadkv-{up:g}.json")
        once = [a for a in extra if a != "--sweep"] + ["--ttft", "500", "--itl", "50"]
        doc = replay(one, trace, out, "load", once)
        (p,) = doc["policies"]
        points.append({
            "policy": "load", "setting": f"kv {up:g}/{down:g}", "gpu_hours": p["gpu_hours"],
            "sla_requests": p["sla_requests"], "worst_5min_requests": p["worst_5min_requests"],
            "documented": False,
        })  # fmt: skip
    law = {"points": points, "frontier": [], "cheapest_at_target": None}
    return {"startup_s": doc["startup_s"], "policies": [], "sweep": [{"policies": {"load": law}}]}


def merge_parts(
    docs: list[dict[str, Any]], others: Sequence[dict[str, Any]] = ()
) -> dict[str, Any]:
    """One comparison from its parts: every part's policies and swept points, the first
    part's refusals. A comparison whose parts left static-peak out takes it from
    `others` (the same slice at another delay: a static pool does not depend on it)."""
    first = docs[0]
    laws: dict[str, list[dict[str, Any]]] = {}
    for d in docs:
        for name, law in d["sweep"][0]["policies"].items():
            laws.setdefault(name, []).extend(law["points"])
    sweep = first["sweep"][0] | {"policies": {k: judged(v) for k, v in laws.items()}}
    pols = [p for d in docs for p in d["policies"]]
    if not any(p["name"] == "static-peak" for p in pols):
        pols = [next(p for p in others if p["name"] == "static-peak"), *pols]
    return first | {"policies": pols, "sweep": [sweep]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slices", default="172:12,213:12", metavar="START:HOURS,...")
    ap.add_argument("--scale", type=float, default=0.015)
    ap.add_argument("--preset", default="llama-3.1-70b-4xh100")
    ap.add_argument("--startups", default="100,300", metavar="S1,S2")
    ap.add_argument(
        "--static-peak", metavar="N1,N2",
        help="static-peak's replicas per slice, from the held-out table (else searched)",
    )  # fmt: skip
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--existing", action="store_true", help="only the parts already replayed")
    ap.add_argument(
        "--parts", default=",".join([*PARTS, "loadkv"]),
        help="which parts of each comparison to replay (the first holds static-peak)",
    )  # fmt: skip
    ap.add_argument("--servegen", type=Path, default=SERVEGEN)
    ap.add_argument("--workdir", default="planner-heldout", help="traces and replay JSON")
    ap.add_argument("--rerun", action="store_true", help="replay even where JSON exists")
    ap.add_argument("--suite", default="planner_heldout_field")
    ap.add_argument("--epp", type=Path, default=RESULTS / "planner_heldout_small.json")
    ap.add_argument(
        "--ratio-only", action="store_true",
        help="recompute the epp rows from the results files, without replaying",
    )  # fmt: skip
    ap.add_argument("--notes", default="", help="markdown before the summary (or @FILE)")
    ap.add_argument("--load", default="", help="the machine's load when the replays ran")
    args = ap.parse_args()
    args.planner = None
    heldout = json.loads(args.epp.read_text())
    out = RESULTS / f"{args.suite}.json"
    if args.ratio_only:
        doc = json.loads(out.read_text())
        field = [r for r in doc["rows"] if r[POLICY] != "epp"]
        doc["rows"] = merged(field, epp_rows(field, heldout))
        doc["notes"] = notes_with(doc["notes"].split(SUMMARY)[0].strip(), doc["rows"])
        out.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
        print("\n".join(summary_lines(doc["rows"])))
        return 0
    before = os.getloadavg()
    field = run(args)
    rows = merged(field, epp_rows(field, heldout))
    text = Path(args.notes[1:]).read_text() if args.notes.startswith("@") else args.notes
    lines = summary_lines(rows)
    notes = notes_with(text.strip(), rows)
    command = (
        f"python bench/planner_heldout_field.py --slices {args.slices} --scale {args.scale:g} "
        f"--preset {args.preset} --startups {args.startups}"
        + (f" --static-peak {args.static_peak}" if args.static_peak else "")
    )
    result = Result.measured(
        args.suite, "The field's frontiers on held-out ServeGen days", command, COLUMNS, rows,
        notes, load=args.load or load_span(before, os.getloadavg()),
    )  # fmt: skip
    print(f"wrote {result.write()}")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
