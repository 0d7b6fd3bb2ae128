"""One switch at a time: `epp` replayed with a base planner file plus one flipped key per
row, the markdown table an ablation recorded in docs/BENCHMARKS.md@a73a134 shows.

    .venv/bin/python bench/planner_ablation.py --trace T [--rate-scale K] --ttft MS --itl MS \
        --profile DIR [--startup-s S] [--base 'max-gpu-budget: 14'] \
        --flip 'rise-headroom: 1' --flip 'emergency-scale-up: true' ... [--out DIR]

Each row is one `epp plan replay --policy epp --planner FILE --json` process (the
replays are deterministic: the figures are exact whatever the machine's load); the
first row is the base file alone. `--out` keeps each run's JSON and stdout. The SLA
is given (`--ttft/--itl`), so every row is judged on the same one; pick it with the
comparison first (its per-request pick), as the tables do.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", required=True)
    p.add_argument("--rate-scale", type=float)
    p.add_argument("--ttft", type=float, required=True)
    p.add_argument("--itl", type=float, required=True)
    p.add_argument("--profile", required=True)
    p.add_argument("--startup-s", type=float, default=100.0)
    p.add_argument("--time-limit")
    p.add_argument("--base", action="append", default=[], help="a planner-file line for all")
    p.add_argument("--flip", action="append", default=[], help="'key: value', one row each")
    p.add_argument("--out", type=Path, help="keep each run's JSON and output here")
    args = p.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="ablation-"))
    out.mkdir(parents=True, exist_ok=True)
    base = ["mode: sla", *args.base]
    print(
        "| flipped | GPU-h | requests in SLA | worst 5 min | intervals in SLA | actions "
        "| reversals | lost | > budget |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    for k, flip in enumerate(["", *args.flip]):
        planner = out / f"row{k}.yaml"
        planner.write_text("\n".join(base + ([flip] if flip else [])) + "\n")
        result = out / f"row{k}.json"
        cmd = [sys.executable, "-m", "epp.cli", "plan", "replay", "--trace", args.trace,
               "--policy", "epp", "--planner", str(planner), "--profile", args.profile,
               "--ttft", f"{args.ttft:g}", "--itl", f"{args.itl:g}",
               "--startup-s", f"{args.startup_s:g}", "--quiet", "--json", str(result)]  # fmt: skip
        if args.rate_scale is not None:
            cmd += ["--rate-scale", f"{args.rate_scale:g}"]
        if args.time_limit:
            cmd += ["--time-limit", args.time_limit]
        with open(out / f"row{k}.txt", "w") as log:
            done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False)
        if done.returncode != 0:
            print(
                f"| `{flip or 'none'}` | failed (exit {done.returncode}, {out / f'row{k}.txt'}) |"
            )
            continue
        e = json.loads(result.read_text())["policies"][0]
        print(
            f"| {f'`{flip}`' if flip else 'none (the base)'} | {e['gpu_hours']:.2f} "
            f"| {e['sla_requests']:.1%} | {e['worst_5min_requests']:.1%} "
            f"| {e['sla_intervals']:.1%} | {e['actions']} | {e['reversals']} | {e['lost']} "
            f"| {e['intervals_over_budget']} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
