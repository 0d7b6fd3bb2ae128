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
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.planner_frontier import COLUMNS, rows_of  # noqa: E402
from bench.results import Result, command_line, load_span  # noqa: E402

SERVEGEN = ROOT.parent / "shared" / "traces" / "servegen" / "language-m-small"
POLICIES = "static-peak,oracle,keda-queue,llm-d-slo,load,epp"


def epp(*args: str) -> list[str]:
    return [sys.executable, "-m", "epp.cli", *args]


def run_slice(args: argparse.Namespace, start: int, hours: int) -> dict:
    """One slice: its trace, then its comparison (or the JSON a previous run left)."""
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    trace = work / f"servegen-h{start}-{hours}h-x{args.scale:g}.jsonl"
    out = work / f"{trace.stem}-{args.preset}-{args.tag}.json"
    if not trace.exists():
        subprocess.run(
            epp("plan", "servegen", str(args.servegen), "--start-hour", str(start),
                "--hours", str(hours), "--scale", str(args.scale), "--seed", "0",
                "-o", str(trace)),
            check=True,
        )  # fmt: skip
    if not out.exists() or args.rerun:
        cmd = epp(
            "plan", "replay", "--trace", str(trace), "--preset", args.preset, "--compare",
            "--policies", args.policies, "--sweep-startup", args.startups,
            "--jobs", str(args.jobs), "--json", str(out),
        )  # fmt: skip
        if args.sweep:
            cmd.append("--sweep")
        if args.planner:
            cmd += ["--planner", args.planner]
        t0 = time.process_time()
        print(f"slice h{start}+{hours}: {' '.join(cmd[2:])}", file=sys.stderr, flush=True)
        subprocess.run(cmd, check=True)
        cpu = os.times()
        print(
            f"slice h{start}+{hours}: done ({cpu.children_user + cpu.children_system:.0f} "
            f"CPU s so far, this process {time.process_time() - t0:.0f})",
            file=sys.stderr,
            flush=True,
        )
    doc = json.loads(out.read_text())
    doc["trace"] = f"ServeGen m-small h{start}-{start + hours} x{args.scale:g}"
    return doc


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
    ap.add_argument("--suite", default="planner_heldout")
    ap.add_argument("--title", default="The planner on held-out ServeGen days")
    ap.add_argument("--notes", default="", help="markdown before the target checks")
    args = ap.parse_args()
    before = os.getloadavg()
    rows: list[list[object]] = []
    checks: list[str] = []
    for part in args.slices.split(","):
        start, hours = (int(x) for x in part.split(":"))
        r, c = rows_of(run_slice(args, start, hours))
        rows += r
        checks += c
    notes = (args.notes + "\n\n" if args.notes else "") + "\n".join(checks)
    result = Result.measured(
        args.suite, args.title, command_line(), COLUMNS, rows, notes,
        load=load_span(before, os.getloadavg()),
    )  # fmt: skip
    print(f"wrote {result.write()}")
    print("\n".join(checks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
