"""The SLO benchmarks' shared setup: the no-predictor setup's name and the mixed workload's
flags. The config without the predictor is derived by `epp.config.variants`.
"""

from __future__ import annotations

import argparse

NO_PREDICTOR = "slo-nopred"  # the setup name both SLO benchmarks give it


def add_workload_args(p: argparse.ArgumentParser) -> None:
    """The mixed SLO workload and the heterogeneous pool, shared by the real-stack
    (slo_routing.py) and virtual-time (slo_virtual.py) benchmarks so both run the same
    thing by default."""
    p.add_argument("--chat-share", type=float, default=0.7)
    p.add_argument("--chat-words", type=int, default=40)
    p.add_argument("--chat-out", type=int, default=16)
    p.add_argument("--chat-ttft-ms", type=float, default=150.0)
    p.add_argument("--chat-tpot-ms", type=float, default=30.0)
    p.add_argument("--long-words", type=int, default=1500)
    p.add_argument("--long-out", type=int, default=32)
    p.add_argument("--long-ttft-ms", type=float, default=2000.0)
    p.add_argument("--decode-ms", type=float, default=10.0)
    p.add_argument("--prefill-ms", type=float, default=0.2)
    p.add_argument("--max-num-seqs", type=int, default=4)
    p.add_argument(
        "--slow-factor",
        type=float,
        default=2.0,
        help="the slow servers' prefill and decode ms per token are this times the others'",
    )
    p.add_argument("--slow-count", type=int, default=1, help="how many of --sims are slow")
