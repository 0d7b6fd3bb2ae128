"""Small builders shared by tests: endpoints, snapshots, requests."""

from __future__ import annotations

import random
from dataclasses import replace

from epp.datastore import Endpoint, EndpointMetrics, EndpointSnapshot
from epp.request import InferenceRequest, new_request, parse_body
from epp.scheduling.registry import PLUGIN_TYPES, Handle


def snap(
    name: str,
    *,
    queue: int = 0,
    running: int = 0,
    kv: float = 0.0,
    labels: dict[str, str] | None = None,
    inflight_tokens: int = 0,
    inflight_prefill_tokens: int = 0,
    port: int | None = None,
    healthy: bool = True,
) -> EndpointSnapshot:
    idx = sum(map(ord, name)) % 250 + 1
    return EndpointSnapshot(
        endpoint=Endpoint(name, f"10.0.0.{idx}", port or 8000, labels or {}),
        metrics=EndpointMetrics(
            waiting_queue_size=queue, running_requests=running, kv_cache_usage=kv
        ),
        inflight_tokens=inflight_tokens,
        inflight_prefill_tokens=inflight_prefill_tokens,
        healthy=healthy,
    )


def completion(prompt: str = "hello", model: str = "m", **extra: object) -> InferenceRequest:
    import json

    body = {"model": model, "prompt": prompt, **extra}
    return parse_body(new_request({}, "/v1/completions", "POST"), json.dumps(body).encode())


def plugin(type_name: str, params: object = None, seed: int = 0, name: str | None = None):
    spec = PLUGIN_TYPES.lookup(type_name)
    assert spec is not None, type_name
    from epp.config.params import parse_params

    return spec.build(
        name or type_name, parse_params(spec.params, params), Handle(rng=random.Random(seed))
    )


def with_metrics(snap: EndpointSnapshot, **changes: object) -> EndpointSnapshot:
    """A copy of `snap` with some metric fields changed."""
    return replace(snap, metrics=replace(snap.metrics, **changes))  # type: ignore[arg-type]
