"""Route N requests over bench/scheduler.py's pool, for instruction counting.

Wall-clock timings are noisy on a shared machine; instructions are not. Run it under
cachegrind with two request counts and subtract, so start-up cancels out:

    for n in 100 1100; do
      PYTHONPATH=$TREE valgrind --tool=cachegrind --cache-sim=no \\
        --cachegrind-out-file=/dev/null python bench/route_instructions.py $TREE $n [--status-ring]
    done   # (I refs at 1100 - I refs at 100) / 1000 = instructions per request

`TREE` is the checkout whose code is measured (its bench/scheduler.py builds the pool), so
two trees compare side by side with one interpreter. Results: docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import sys


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tree", help="checkout to measure (its bench/ and epp/ are used)")
    ap.add_argument("requests", type=int)
    ap.add_argument("--endpoints", type=int, default=10)
    ap.add_argument("--status-ring", action="store_true", help="add the status page's ring")
    args = ap.parse_args()
    sys.path.insert(0, f"{args.tree}/bench")
    from scheduler import build  # the tree's own pool builder

    from epp.headers import REQUEST_ID
    from epp.request import new_request, parse_body

    director = build(args.endpoints)
    if args.status_ring:
        from epp.status.ring import DecisionRing

        director.decision_sinks.append(DecisionRing().record)
    body = json.dumps({"model": "m", "prompt": "hello " * 200}).encode()
    for _ in range(args.requests):
        req = parse_body(new_request({REQUEST_ID: "r"}, "/v1/completions", "POST"), body)
        director.release(director.route(req, None))


if __name__ == "__main__":
    main()
