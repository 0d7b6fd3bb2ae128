"""The SLO benchmarks' derived setups: `config/slo.yaml` without its predictor.

The anchor (llm-d's predicted-latency PR: TTFT mean −56.7 %, p99 −62.8 %) compares
the same stack with and without the predictor. `without_predictor` builds that second
stack from any config: the same file minus `predicted-latency-producer` and the plugins
that only read its output (`slo-headroom-tier-filter`, `latency-scorer`), plugins and
profile references both; everything else (prefix producer and scorer, token-load scorer,
picker, weights) stays. Derived rather than kept as a second file, so it follows
`config/slo.yaml` when that changes.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import yaml

PREDICTOR_TYPES = frozenset(
    {"predicted-latency-producer", "slo-headroom-tier-filter", "latency-scorer"}
)
NO_PREDICTOR = "slo-nopred"  # the setup name both SLO benchmarks give it


def without_predictor(config: dict) -> dict:
    """`config` (a parsed EndpointPickerConfig) with the predictor's plugins removed."""
    drop = {p.get("name", p["type"]) for p in config["plugins"] if p["type"] in PREDICTOR_TYPES}
    out = dict(config)
    out["plugins"] = [p for p in config["plugins"] if p.get("name", p["type"]) not in drop]
    out["schedulingProfiles"] = [
        {**prof, "plugins": [r for r in prof["plugins"] if r["pluginRef"] not in drop]}
        for prof in config["schedulingProfiles"]
    ]
    return out


def write_without_predictor(source: Path, directory: Path | None = None) -> Path:
    """Write `source` without the predictor to a new file (in `directory`, else a temp dir)."""
    config = without_predictor(yaml.safe_load(source.read_text()))
    folder = directory or Path(tempfile.mkdtemp(prefix="slo-nopred-"))
    path = folder / f"{source.stem}-no-predictor.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


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
