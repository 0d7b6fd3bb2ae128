"""A config's derived variants: the same EndpointPickerConfig without its latency predictor.

The predicted-latency comparison (llm-d's predicted-latency PR: TTFT mean -56.7 %, p99
-62.8 %) is the same stack with and without the predictor. `without_predictor` builds that
second stack from any config: the same file minus `predicted-latency-producer` and the
plugins that only read its output (`slo-headroom-tier-filter`, `latency-scorer`), plugins
and profile references both; everything else (prefix producer and scorer, token-load
scorer, picker, weights) stays. Derived rather than kept as a second file, so it follows
`config/slo.yaml` when that changes.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import yaml

PREDICTOR_TYPES = frozenset(
    {"predicted-latency-producer", "slo-headroom-tier-filter", "latency-scorer"}
)


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
