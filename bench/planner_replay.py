"""How fast `epp plan replay` replays: an hour of the Azure trace through static pools
of the 8B preset, and macro-stepping against single-stepping on the same slice.

    .venv/bin/python bench/planner_replay.py                 # the table in docs/BENCHMARKS.md
    .venv/bin/python bench/planner_replay.py --repeats 1     # quicker
    .venv/bin/python bench/planner_replay.py --rate-scale 17 --time-limit 120 \
        --replicas 50 --repeats 1 --no-slice                 # fleet scale

Each run replays the whole trace (every request, every engine step) through a static
pool of N replicas (`static-peak`-like: no scaling, so the figure is the pool model's
and the engines' cost, not a policy's). Reported: wall and CPU seconds (median of
`--repeats`; CPU time is the steadier figure on a shared machine), engine steps
simulated, and simulated seconds per wall second. The single-stepping comparison runs
the trace's first `--slice` seconds both ways in one process, alternating, so the ratio
is measured side by side.

Before and after: `--baseline DIR` measures the same trace and pools with the code of
another source tree (a checkout of an earlier commit) in a child process, and `--json`
writes both as a results table (docs/data/results/planner_replay_speed.json):

    .venv/bin/epp plan servegen ../shared/traces/servegen/language-m-small --hours 24 \
        --scale 0.02 --seed 0 -o /tmp/day0.jsonl
    git worktree add --detach /tmp/before <commit>
    .venv/bin/python bench/planner_replay.py --trace /tmp/day0.jsonl --replicas 4,10 \
        --repeats 1 --no-slice --baseline /tmp/before \
        --json docs/data/results/planner_replay_speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

# EPP_SOURCE_TREE: measure another checkout's code (--baseline runs this file that way)
ROOT = Path(os.environ.get("EPP_SOURCE_TREE") or Path(__file__).resolve().parent.parent)
sys.path.insert(0, str(ROOT))

from bench.results import Result  # noqa: E402
from epp.planner.offline.pool import PoolShape, Spares  # noqa: E402
from epp.planner.offline.replay import replay  # noqa: E402
from epp.planner.offline.static import StaticPolicy  # noqa: E402
from epp.planner.offline.tracegen import scale_rate  # noqa: E402
from epp.planner.tracefile import load_trace  # noqa: E402
from epp.sim import presets  # noqa: E402

TRACES = Path("/work/shared/traces")


def timed(arrivals, shape, n: int, spares: Spares) -> tuple[float, float, int]:
    wall, cpu = time.perf_counter(), time.process_time()
    run = replay(arrivals, StaticPolicy("static", n, 60.0), shape, initial=n, spares=spares)
    assert run.lost == 0
    return time.perf_counter() - wall, time.process_time() - cpu, run.steps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=TRACES / "azure-llm-conv-2023.csv")
    ap.add_argument("--replicas", default="4,8,16", help="pool sizes (comma-separated)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--slice", type=float, default=300.0, help="seconds for the ratio run")
    ap.add_argument("--no-slice", action="store_true", help="skip the macro/single ratio run")
    ap.add_argument("--rate-scale", type=float, default=1.0, help="tracegen.scale_rate's k")
    ap.add_argument("--time-limit", type=float, help="replay only the first S seconds")
    ap.add_argument("--baseline", type=Path, help="another source tree to measure the same way")
    ap.add_argument("--json", type=Path, help="write the rows (with --baseline's) here")
    ap.add_argument("--rows-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    arrivals = scale_rate(load_trace(args.trace), args.rate_scale)
    if args.time_limit is not None:
        arrivals = [a for a in arrivals if a.t_s < args.time_limit]
    caching = any(a.hash_ids for a in arrivals)
    sim = presets.config_for("llama-3.1-8b-h100", enable_prefix_caching=caching)
    shape = PoolShape(sim)
    span = arrivals[-1].t_s
    out = sys.stderr if args.rows_only else sys.stdout
    print(f"{args.trace.name}: {len(arrivals)} requests over {span / 60:.1f} min, "
          f"llama-3.1-8b-h100, static pools ({ROOT})", file=out)  # fmt: skip
    print(f"{'replicas':>8} {'wall s':>8} {'CPU s':>8} {'steps':>10} {'sim s / wall s':>15} "
          f"{'requests/s':>11}", file=out)  # fmt: skip
    spares = Spares()
    table = []
    for n in (int(x) for x in args.replicas.split(",")):
        rows = [timed(arrivals, shape, n, spares) for _ in range(args.repeats)]
        wall = statistics.median(r[0] for r in rows)
        cpu = statistics.median(r[1] for r in rows)
        rate = len(arrivals) / cpu
        print(f"{n:8d} {wall:8.1f} {cpu:8.1f} {rows[0][2]:10d} {span / wall:15.0f} "
              f"{rate:11,.0f}", file=out)  # fmt: skip
        table.append([n, len(arrivals), round(cpu, 2), rows[0][2], round(rate)])
    if args.rows_only:
        print(json.dumps(table))
        return 0
    if args.json:
        write_json(args, table, baseline_rows(args) if args.baseline else None)

    if args.no_slice:
        return 0
    part = [a for a in arrivals if a.t_s < args.slice]
    n = 4
    fast, slow = Spares(), Spares(macro=False)
    pairs = [(timed(part, shape, n, fast), timed(part, shape, n, slow)) for _ in range(3)]
    f = statistics.median(p[0][1] for p in pairs)
    s = statistics.median(p[1][1] for p in pairs)
    assert pairs[0][0][2] == pairs[0][1][2], "macro and single stepping simulated different steps"
    print(f"\nfirst {args.slice:g} s ({len(part)} requests), {n} replicas, {pairs[0][0][2]} steps: "
          f"macro-stepping {f:.2f} s CPU, single-stepping {s:.2f} s CPU: {s / f:.1f}x")  # fmt: skip
    return 0


def baseline_rows(args: argparse.Namespace) -> list:
    """The same measurement with `--baseline`'s code, in a child process."""
    argv = [sys.executable, __file__, "--trace", str(args.trace), "--replicas", args.replicas,
            "--repeats", str(args.repeats), "--rate-scale", str(args.rate_scale),
            "--rows-only"]  # fmt: skip
    if args.time_limit is not None:
        argv += ["--time-limit", str(args.time_limit)]
    env = dict(os.environ, EPP_SOURCE_TREE=str(args.baseline.resolve()))
    env["PYTHONPATH"] = str(args.baseline.resolve())
    done = subprocess.run(argv, env=env, check=True, stdout=subprocess.PIPE, text=True)
    return json.loads(done.stdout.splitlines()[-1])


def _git(*argv: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *argv], cwd=cwd, capture_output=True, text=True).stdout.strip()


def write_json(args: argparse.Namespace, after: list, before: list | None) -> None:
    rows = [[_git("rev-parse", "--short", "HEAD"), *r] for r in after]
    if before is not None:
        base = _git("rev-parse", "--short", "HEAD", cwd=args.baseline)
        rows = [[base, *r] for r in before] + rows
    load = f"load average {os.getloadavg()[0]:.1f} at the end"
    Result.measured(
        "planner_replay_speed",
        "Replay speed: a ServeGen day through static pools, requests per CPU second",
        " ".join(["python", "bench/planner_replay.py", *sys.argv[1:]]),
        ["code", "replicas", "requests", "CPU s", "engine steps", "requests/s"],
        rows,
        load=load,
    ).write(args.json)


if __name__ == "__main__":
    sys.exit(main())
