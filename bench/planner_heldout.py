"""The planner on production days it was not tuned on: ServeGen slices against the field.

    python bench/planner_heldout.py --slices 172:12,213:12 --scale 0.015 \
        --preset llama-3.1-70b-4xh100 --startups 100,300 --suite planner_heldout

Generates each slice with `epp plan servegen` (ServeGen's `language-m-small`, seed 0;
`START:HOURS` in hours from the data's first window), replays it with `epp plan replay
--compare` (static-peak, the oracle, the field's laws at their documented set-up, `epp`;
`--sweep` adds each law's swept frontier) once per start-up delay, and writes
docs/data/results/<suite>.json through `bench/planner_frontier.py`'s rows and checks
(`epp` against the targets: >= 99 % of requests within both SLAs, >= 95 % in every
5-minute window, 0 lost, <= 1 reversal per 30 minutes, never over the budget,
<= 0.65x static-peak's GPU-hours, <= 0.9x the field's cheapest >= 99 % point).

`--reuse TAG` reads static-peak, the oracle and the laws from TAG's JSON of the same
traces (they do not depend on `epp`'s settings) and replays `epp` alone, with
static-peak once at TAG's size beside it as a check.

`--append` keeps the suite's existing rows, command and notes and adds this run's
(a row of the same trace, start-up and policy is replaced): slices whose peaks differ
are run each at its own `--scale` and recorded in one file.

Days 7-13 (`--start-hour` 168 and later) are the held-out set of docs/planner.md; days
0-6 the training set. The scale is what this machine can replay: docs/planner.md says
how far it is from the ~10 and ~40 replica pools and what those would cost.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.planner_frontier import COLUMNS, rows_of  # noqa: E402
from bench.results import RESULTS, Result, load_span  # noqa: E402

SERVEGEN = ROOT.parent / "shared" / "traces" / "servegen" / "language-m-small"
POLICIES = "static-peak,oracle,keda-queue,llm-d-slo,load,epp"
BASELINES = {"static-peak": 0, "oracle": 1}  # first in each comparison's rows


def epp(*args: str) -> list[str]:
    return [sys.executable, "-m", "epp.cli", *args]


def replay(args: argparse.Namespace, trace: Path, out: Path, policies: str, extra: list[str]):
    if out.exists() and not args.rerun:
        return json.loads(out.read_text())
    cmd = epp(
        "plan", "replay", "--trace", str(trace), "--preset", args.preset, "--compare",
        "--policies", policies, "--jobs", str(args.jobs), "--json", str(out), *extra,
    )  # fmt: skip
    if args.planner:
        cmd += ["--planner", args.planner]
    print(f"{trace.name}: {' '.join(cmd[2:])}", file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True)
    cpu = os.times()
    print(
        f"{trace.name}: done ({cpu.children_user + cpu.children_system:.0f} CPU s so far)",
        file=sys.stderr,
        flush=True,
    )
    return json.loads(out.read_text())


def run_slice(args: argparse.Namespace, start: int, hours: int) -> dict:
    """One slice: its trace, then its replays (or the JSON a previous run left). The
    first start-up delay runs `--policies`; each later one `epp` (and the oracle, once,
    when `--policies` left it out) with static-peak's size from the first, so the
    search is not repeated; the comparisons are merged into one document."""
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    trace = work / f"servegen-h{start}-{hours}h-x{args.scale:g}.jsonl"
    if not trace.exists():
        subprocess.run(
            epp("plan", "servegen", str(args.servegen), "--start-hour", str(start),
                "--hours", str(hours), "--scale", str(args.scale), "--seed", "0",
                "-o", str(trace)),
            check=True,
        )  # fmt: skip
    startups = [s.strip() for s in args.startups.split(",")]
    stem = f"{trace.stem}-{args.preset}-{args.tag}"
    reused = [work / f"{trace.stem}-{args.preset}-{args.reuse}-{s}.json" for s in startups]
    if args.reuse and all(p.exists() for p in reused):
        doc = run_epp_only(args, trace, stem, startups, reused)
    else:
        doc = run_all(args, trace, stem, startups)
    doc["trace"] = f"ServeGen m-small h{start}-{start + hours} x{args.scale:g}"
    return doc


def run_all(args: argparse.Namespace, trace: Path, stem: str, startups: list[str]) -> dict:
    work = Path(args.workdir)
    docs = [
        replay(args, trace, work / f"{stem}-{startups[0]}.json", args.policies,
               ["--startup-s", startups[0]] + (["--sweep"] if args.sweep else []))
    ]  # fmt: skip
    peak = policy(docs[0], "static-peak")["initial_replicas"]
    oracle = "oracle" in args.policies.split(",")
    for s in startups[1:]:
        more = "static-peak,epp" + ("" if oracle else ",oracle")
        oracle = True
        docs.append(
            replay(args, trace, work / f"{stem}-{s}.json", more,
                   ["--startup-s", s, "--static-peak", str(peak)])
        )  # fmt: skip
    return merge(docs)


def run_epp_only(
    args: argparse.Namespace, trace: Path, stem: str, startups: list[str], reused: list[Path]
) -> dict:
    """`--reuse TAG`: the baselines (static-peak, the oracle, the field's laws) do not
    depend on `epp`'s settings, so they are read from TAG's comparisons of the same
    trace and `epp` alone is replayed at each start-up delay, with static-peak replayed
    once at TAG's size beside it (the check that the replay still gives TAG's figure)."""
    docs: list[dict] = []
    peak = policy(json.loads(reused[0].read_text()), "static-peak")["initial_replicas"]
    for s, old_path in zip(startups, reused, strict=True):
        old = json.loads(old_path.read_text())
        pols = "static-peak,epp" if not docs else "epp"
        doc = replay(args, trace, Path(args.workdir) / f"{stem}-{s}.json", pols,
                     ["--startup-s", s, "--static-peak", str(peak)])  # fmt: skip
        have = {p["name"] for p in doc["policies"]}
        kept = [p for p in old["policies"] if p["name"] not in have and p["name"] != "epp"]
        docs.append(doc | {"policies": doc["policies"] + kept})
    return merge(docs)


def policy(doc: dict, name: str) -> dict:
    return next(p for p in doc["policies"] if p["name"] == name)


def merge(docs: list[dict]) -> dict:
    """One document with a comparison per start-up delay (the `startup_sweep` form
    `planner_frontier.rows_of` reads): static-peak and the oracle do not depend on the
    delay, so each comparison gets them from whichever run has them, and its ratios
    are recomputed against them."""
    fixed: dict[str, dict] = {}
    for d in docs:
        for p in d["policies"]:
            if p["name"] in ("static-peak", "oracle"):
                fixed.setdefault(p["name"], p)
    runs = []
    for d in docs:
        names = {p["name"] for p in d["policies"]}
        pols = [fixed[n] for n in ("static-peak", "oracle") if n in fixed and n not in names]
        pols = sorted(pols + d["policies"], key=lambda p: BASELINES.get(p["name"], 2))
        base = {n: fixed[n]["gpu_hours"] for n in fixed}
        pols = [
            p | {
                "gpu_hours_vs_static_peak": _ratio(p["gpu_hours"], base.get("static-peak")),
                "gpu_hours_vs_oracle": _ratio(p["gpu_hours"], base.get("oracle")),
            }
            for p in pols
        ]  # fmt: skip
        runs.append(d | {"policies": pols, "startup_s": d["startup_s"]})
    return docs[0] | {"startup_sweep": runs, "sweep": [s for d in docs for s in d.get("sweep", [])]}


def appended(
    old: dict, rows: list[list[object]], command: str, notes: str
) -> tuple[list[list[object]], str, str]:
    """`old`'s rows, command and notes followed by this run's: a row keyed as one of the
    new ones (trace, start-up, policy) gives way to it, a command already there is not
    repeated, and the notes are paragraphs one after the other."""
    key = slice(0, 3)
    new = {tuple(r[key]) for r in rows}
    kept = [r for r in old["rows"] if tuple(r[key]) not in new]
    commands = old["command"].split(" && ")
    command = " && ".join(commands + ([command] if command not in commands else []))
    notes = "\n\n".join(n for n in (old["notes"].strip(), notes.strip()) if n)
    return kept + rows, command, notes


def _ratio(x: float, of: float | None) -> float | None:
    return round(x / of, 4) if of else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slices", default="172:12,213:12", metavar="START:HOURS,...")
    ap.add_argument("--scale", type=float, default=0.015)
    ap.add_argument("--preset", default="llama-3.1-70b-4xh100")
    ap.add_argument("--startups", default="100,300", metavar="S1,S2")
    ap.add_argument("--policies", default=POLICIES)
    ap.add_argument("--sweep", action="store_true", help="also each law's swept frontier")
    ap.add_argument("--planner", metavar="FILE", help="the planner file epp runs with")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--servegen", type=Path, default=SERVEGEN)
    ap.add_argument("--workdir", default="planner-heldout", help="traces and replay JSON")
    ap.add_argument("--tag", default="default", help="names this set-up's JSON files")
    ap.add_argument("--rerun", action="store_true", help="replay even where JSON exists")
    ap.add_argument(
        "--reuse",
        metavar="TAG",
        help="read static-peak, the oracle and the laws from TAG's JSON of the same slices "
        "and replay epp alone (after a change to epp's settings)",
    )
    ap.add_argument(
        "--append",
        action="store_true",
        help="add this run's rows, command and notes to the suite's existing file",
    )
    ap.add_argument("--suite", default="planner_heldout")
    ap.add_argument("--title", default="The planner on held-out ServeGen days")
    ap.add_argument("--notes", default="", help="markdown before the target checks (or @FILE)")
    args = ap.parse_args()
    before = os.getloadavg()
    rows: list[list[object]] = []
    checks: list[str] = []
    for part in args.slices.split(","):
        start, hours = (int(x) for x in part.split(":"))
        r, c = rows_of(run_slice(args, start, hours))
        rows += r
        checks += c
    text = Path(args.notes[1:]).read_text() if args.notes.startswith("@") else args.notes
    notes = (text.strip() + "\n\n" if text else "") + "\n".join(checks)
    command = (
        f"python bench/planner_heldout.py --slices {args.slices} --scale {args.scale:g} "
        f"--preset {args.preset} --startups {args.startups} --policies {args.policies}"
        + (" --sweep" if args.sweep else "")
        + (f" --reuse {args.reuse}" if args.reuse else "")
        + (" --append" if args.append else "")
    )
    if args.append and (old := RESULTS / f"{args.suite}.json").exists():
        rows, command, notes = appended(json.loads(old.read_text()), rows, command, notes)
    result = Result.measured(
        args.suite, args.title, command, COLUMNS, rows, notes,
        load=load_span(before, os.getloadavg()),
    )  # fmt: skip
    print(f"wrote {result.write()}")
    print("\n".join(checks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
