"""vllm-router setups of `epp bench routing` (loaded by path from bench/routing.py).

- `vr-cache`: `--policy cache_aware` (its approximate radix tree of what it routed where);
- `vr-kv`: `--policy kv_aware`, fed by every simulator's KV events (`--kv-event-source
  WORKER_URL=tcp://127.0.0.1:PORT` per worker, each replica binding its own port and
  publishing under the empty topic, vLLM's default: 0.1.17's static sources subscribe to
  exactly that topic and skip messages under any other, such as the llm-d convention
  `kv@host:port@model` the simulator uses by default);
- `vr-p2`: `--policy power_of_two` (load only).

vllm-router 0.1.17 does not tokenize an HTTP worker's requests itself: it asks the
worker's `/v1/completions/render` route for the token ids (the simulator has it,
epp/sim/render_routes.py). Whether it then routed on prefixes is read from its own
Prometheus port after the run (`vllm_router_prefix_routing_decisions_total` by outcome:
`prefix_hit` / `prefix_miss` for cache_aware, `prefix_cost` for kv_aware; `missing_tokens`
= no token ids, i.e. load balancing; for kv_aware also `kv_lookup_hit` / `kv_lookup_miss`
from `vllm_router_kv_placement_lookups_total`: did its KV-event index hold the blocks)
and reported beside the setup's rows.
"""

from __future__ import annotations

import argparse
import re
import urllib.request
from collections.abc import Callable

from epp.harness.procs import HttpReady, ProcessGroup, free_port, free_port_range

POLICIES = {"vr-cache": "cache_aware", "vr-kv": "kv_aware", "vr-p2": "power_of_two"}
SIM_BLOCK_SIZE = 16  # the llama-3.1-8b-h100 preset's block size (epp/sim/presets.py)
_DECISION = re.compile(
    r'^vllm_router_prefix_routing_decisions_total\{[^}]*outcome="([^"]+)"[^}]*\}\s+([0-9.eE+-]+)',
    re.MULTILINE,
)
# kv_aware: whether its KV-event index held the request's blocks (hit / miss per lookup)
_LOOKUP = re.compile(
    r'^vllm_router_kv_placement_lookups_total\{[^}]*result="([^"]+)"[^}]*\}\s+([0-9.eE+-]+)',
    re.MULTILINE,
)
_METRICS: dict[str, str] = {}  # proxy url -> the router's Prometheus url


def start(
    pg: ProcessGroup,
    setup: str,
    args: argparse.Namespace,
    start_sims: Callable[..., list[str]],
) -> tuple[str, list[str]]:
    """A fresh pool and vllm-router in front of it; (proxy url, simulator urls)."""
    policy = POLICIES[setup]
    kv_base = free_port_range(args.servers) if setup == "vr-kv" else None
    # kv_aware subscribes with the empty topic and skips any other: publish under it.
    urls = start_sims(pg, args, kv_base, kv_bind=True, kv_extra={"topic": None})
    port, prom = free_port(), free_port()
    argv = [args.router, "--host", "127.0.0.1", "--port", str(port), "--policy", policy]
    argv += ["--prometheus-port", str(prom), "--worker-urls", *urls]
    argv += ["--request-timeout-secs", str(int(args.timeout_s) + 10), "--disable-retries"]
    if kv_base is not None:
        for i, u in enumerate(urls):
            argv += ["--kv-event-source", f"{u}=tcp://127.0.0.1:{kv_base + i}"]
        argv += ["--kv-event-block-size", str(SIM_BLOCK_SIZE), "--kv-event-model", args.model]
    url = f"http://127.0.0.1:{port}"
    pg.start(f"vllm-router-{policy}", argv, ready=HttpReady(url + "/health"), timeout=90)
    _METRICS[url] = f"http://127.0.0.1:{prom}/metrics"
    return url, urls


def decisions(url: str) -> dict[str, float]:
    """The router behind `url`: its prefix-routing decisions by outcome (empty if it has
    none or its metrics do not answer)."""
    metrics = _METRICS.get(url)
    if metrics is None:
        return {}
    try:
        with urllib.request.urlopen(metrics, timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for outcome, value in _DECISION.findall(text):
        out[outcome] = out.get(outcome, 0.0) + float(value)
    for result, value in _LOOKUP.findall(text):
        key = f"kv_lookup_{result}"
        out[key] = out.get(key, 0.0) + float(value)
    return out
