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
import threading
import urllib.request
from collections.abc import Callable

import zmq

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


def router_argv(
    router: str,
    policy: str,
    port: int,
    prom_port: int,
    worker_urls: list[str],
    timeout_s: float,
    kv_sources: list[str] | None = None,
    block_size: int | None = None,
    model: str | None = None,
) -> list[str]:
    """vllm-router's command line: `kv_sources[i]` (a ZMQ address publishing under the
    empty topic) feeds `worker_urls[i]`; static sources need the block size and the model
    (0.1.17 refuses them without `--kv-event-model`)."""
    argv = [router, "--host", "127.0.0.1", "--port", str(port), "--policy", policy]
    argv += ["--prometheus-port", str(prom_port), "--worker-urls", *worker_urls]
    argv += ["--request-timeout-secs", str(int(timeout_s) + 10), "--disable-retries"]
    if kv_sources is not None:
        if len(kv_sources) != len(worker_urls):
            raise ValueError(f"{len(kv_sources)} KV-event sources for {len(worker_urls)} workers")
        if block_size is None or not model:
            raise ValueError("KV-event sources need block_size and model")
        for url, source in zip(worker_urls, kv_sources, strict=True):
            argv += ["--kv-event-source", f"{url}={source}"]
        argv += ["--kv-event-block-size", str(block_size), "--kv-event-model", model]
    return argv


def start_router(
    pg: ProcessGroup,
    router: str,
    setup: str,
    worker_urls: list[str],
    timeout_s: float,
    kv_sources: list[str] | None = None,
    block_size: int | None = None,
    model: str | None = None,
) -> str:
    """vllm-router with `setup`'s policy in front of `worker_urls`; its proxy url (the
    router's metrics address is kept for `decisions`)."""
    policy = POLICIES[setup]
    port, prom = free_port(), free_port()
    argv = router_argv(
        router, policy, port, prom, worker_urls, timeout_s, kv_sources, block_size, model
    )
    url = f"http://127.0.0.1:{port}"
    pg.start(f"vllm-router-{policy}", argv, ready=HttpReady(url + "/health"), timeout=90)
    _METRICS[url] = f"http://127.0.0.1:{prom}/metrics"
    return url


def start(
    pg: ProcessGroup,
    setup: str,
    args: argparse.Namespace,
    start_sims: Callable[..., list[str]],
) -> tuple[str, list[str]]:
    """A fresh simulator pool and vllm-router in front of it; (proxy url, simulator urls)."""
    kv_base = free_port_range(args.servers) if setup == "vr-kv" else None
    # kv_aware subscribes with the empty topic and skips any other: publish under it.
    urls = start_sims(pg, args, kv_base, kv_bind=True, kv_extra={"topic": None})
    sources = None
    if kv_base is not None:
        sources = [f"tcp://127.0.0.1:{kv_base + i}" for i in range(len(urls))]
    url = start_router(
        pg, args.router, setup, urls, args.timeout_s, sources, SIM_BLOCK_SIZE, args.model
    )
    return url, urls


class EmptyTopicRelay:
    """Re-publishes KV events under the empty topic, for vllm-router 0.1.17 (its static
    sources read only that topic, `src/kv_index/subscriber.rs`) when the servers publish
    under llm-d's `kv@host:port@model`, which the EPP's producer needs: a vLLM server has
    one KV-events publisher and one topic (`--kv-events-config`). Source i (a bound PUB,
    dialled here) → `addresses[i]` (a PUB bound on loopback); the sequence-number and
    payload frames pass unchanged. One thread; `with` starts and stops it."""

    def __init__(self, sources: list[str]) -> None:
        self._ctx = zmq.Context()
        self._pairs: list[tuple[zmq.Socket, zmq.Socket]] = []
        self.addresses: list[str] = []
        for source in sources:
            sub = self._ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.connect(source)
            pub = self._ctx.socket(zmq.PUB)
            pub.setsockopt(zmq.LINGER, 0)
            port = pub.bind_to_random_port("tcp://127.0.0.1")
            self.addresses.append(f"tcp://127.0.0.1:{port}")
            self._pairs.append((sub, pub))
        self.forwarded = 0
        self._stop = threading.Event()
        # The sockets are used only by this thread from its start on (zmq's rule).
        self._thread = threading.Thread(target=self._run, name="kv-relay", daemon=True)

    def _run(self) -> None:
        poller = zmq.Poller()
        for sub, _ in self._pairs:
            poller.register(sub, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                ready = dict(poller.poll(100))
                for sub, pub in self._pairs:
                    if sub in ready:
                        pub.send_multipart(retopic(sub.recv_multipart()))
                        self.forwarded += 1
        finally:
            for sub, pub in self._pairs:
                sub.close(linger=0)
                pub.close(linger=0)

    def __enter__(self) -> EmptyTopicRelay:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._ctx.term()


def retopic(frames: list[bytes]) -> list[bytes]:
    """`[topic, seq, payload]` → `[b"", seq, payload]` (vLLM's default, empty topic)."""
    return [b"", *frames[1:]]


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
