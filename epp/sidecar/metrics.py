"""The sidecar's own Prometheus metrics (prefix `epp_sidecar_`).

Each sidecar owns a registry, so several can run in one process (tests, benchmarks).

- `epp_sidecar_requests_total{path, outcome}` (counter): requests by API path and outcome.
- `epp_sidecar_prefill_duration_seconds` (histogram): the remote prefill leg, request
  sent → whole response read (any status).
- `epp_sidecar_decode_first_byte_seconds{mode}` (histogram): the local decode leg,
  request sent → first response byte (response headers).
- `epp_sidecar_decode_duration_seconds{mode}` (histogram): the local decode leg, request
  sent → last byte relayed to the client.

`outcome`: `forwarded` (no prefill header: proxied as is), `prefill_decode` (remote
prefill, then local decode), `prefill_fallback` (the prefill server failed with 5xx,
timed out or was unreachable: decoded locally from scratch), `prefill_rejected` (the
prefill server answered 4xx: relayed to the client), `forbidden` (the header named a
server outside the allowlist: 403), `decode_error` (the local decode server could not be
reached, or its stream broke: 502 or a cut connection), `client_gone` (the client left
mid-answer). `mode` is `pd` (after a remote prefill) or `local` (everything else).

- `epp_sidecar_encodes_total{outcome}` (counter): encode legs (`x-encoder-hosts-ports`):
  `encoded`, `failed` (refused, timed out, or an error answer) or `forbidden` (not in
  the allowlist); after any of them the request goes on.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

OUTCOMES = (
    "forwarded",
    "prefill_decode",
    "prefill_fallback",
    "prefill_rejected",
    "forbidden",
    "decode_error",
    "client_gone",
)
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class SidecarMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "epp_sidecar_requests",
            "Requests through the P/D sidecar by API path and outcome.",
            ["path", "outcome"],
            registry=self.registry,
        )
        self.encodes = Counter(
            "epp_sidecar_encodes",
            "Encode legs (media sent to an encode server first) by outcome.",
            ["outcome"],
            registry=self.registry,
        )
        self.prefill_seconds = Histogram(
            "epp_sidecar_prefill_duration_seconds",
            "Remote prefill leg: request sent to the prefill server until its response is read.",
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.decode_first_byte_seconds = Histogram(
            "epp_sidecar_decode_first_byte_seconds",
            "Local decode leg: request sent until the first response byte.",
            ["mode"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.decode_seconds = Histogram(
            "epp_sidecar_decode_duration_seconds",
            "Local decode leg: request sent until the last byte is relayed to the client.",
            ["mode"],
            buckets=_BUCKETS,
            registry=self.registry,
        )

    def count(self, path: str, outcome: str) -> None:
        self.requests.labels(path, outcome).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
