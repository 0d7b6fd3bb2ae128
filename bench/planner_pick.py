"""The SLA pick's static sizing at fleet scale: the busiest segments sized one by one (each
its own search, as the pick first did) against `Sizer.smallest_for_all` (the
largest size so far checked on the next segment with one measurement), side by side in
one process, each on a fresh `Sizer` (nothing cached between them).

    .venv/bin/python bench/planner_pick.py --rate-scale 20 --time-limit 10m [--repeats 1]

Prints, per way: the sizes found (they must agree), the sizing replays run (exact) and
their CPU seconds (process time; noisy on a shared machine, so compare the ratio of
one run). `Sizer.default_sla` (the interval pick's doubling) runs first in each, as in
`epp plan replay`, and is reported apart.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from epp.planner.offline.pool import PoolShape, Spares
from epp.planner.offline.static import Sizer, mean_segment, peak_segments
from epp.planner.offline.tracegen import scale_rate
from epp.planner.plan_cli import parse_duration
from epp.planner.tracefile import load_trace
from epp.sim import presets

TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "azure-llm-conv-2023.csv"


def one(arrivals, shape, interval: float, together: bool) -> dict:
    sizer = Sizer(arrivals, shape, Spares())
    t0 = time.process_time()
    sla = sizer.default_sla(interval)
    t1, n1 = time.process_time(), len(sizer._seen)
    segs = peak_segments(arrivals, interval)
    if together:
        peak = sizer.smallest_for_all(sla, segs).replicas
    else:
        peak = max(sizer.smallest_pool(sla, seg).replicas for seg in segs)
    mean = sizer.smallest_pool(sla, mean_segment(arrivals, interval)).replicas
    t2 = time.process_time()
    return {
        "sla": f"{sla.ttft_ms:g} ms / {sla.itl_ms:g} ms",
        "peak": peak,
        "mean": mean,
        "pick_cpu": t1 - t0,
        "pick_replays": n1,
        "size_cpu": t2 - t1,
        "size_replays": len(sizer._seen) - n1,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", default=str(TRACE))
    p.add_argument("--rate-scale", type=float, default=20.0)
    p.add_argument("--time-limit", default="10m")
    p.add_argument("--interval", type=float, default=60.0)
    p.add_argument("--repeats", type=int, default=1)
    args = p.parse_args()
    limit = parse_duration(args.time_limit)
    arrivals = [
        a for a in scale_rate(load_trace(args.trace), args.rate_scale, seed=0) if a.t_s < limit
    ]
    sim = presets.config_for("llama-3.1-8b-h100", enable_prefix_caching=False)
    shape = PoolShape(sim, gpus_per_replica=1, startup_s=100.0)
    print(f"{len(arrivals)} requests over {arrivals[-1].t_s / 60:.1f} min, x{args.rate_scale:g}")
    print("| way | SLA (interval pick) | static-peak | static-mean | sizing replays | sizing CPU s "
          "| pick replays | pick CPU s |\n|---|---|---:|---:|---:|---:|---:|---:|")  # fmt: skip
    for _ in range(args.repeats):
        for together, name in ((False, "each segment searched"), (True, "smallest_for_all")):
            r = one(arrivals, shape, args.interval, together)
            print(
                f"| {name} | {r['sla']} | {r['peak']} | {r['mean']} | {r['size_replays']} "
                f"| {r['size_cpu']:.1f} | {r['pick_replays']} | {r['pick_cpu']:.1f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
