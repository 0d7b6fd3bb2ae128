"""The planner's observation read from a Prometheus server instead of the EPP's own
datastore and response path: what `epp planner --prometheus URL` (the planner alone,
outside `epp serve`) decides on.

Dynamo SLA-v1 reads its frontend's histograms with one PromQL query per value
(reference §1.3, `planner/utils/prometheus.py`): `increase(<m>_sum[Is]) /
increase(<m>_count[Is])` over the adjustment interval `I`, and `increase(requests_total
[Is])` for the demand. The same queries here, on the metric names this EPP exports
(`epp/observability.py`, GIE's names), with three changes:

- series are summed before dividing (`sum(increase(_sum)) / sum(increase(_count))`,
  as Dynamo's later router source does, #6500), so several EPP replicas weigh by their
  traffic instead of Dynamo's unweighted mean of per-series ratios;
- the demand is `inference_objective_request_total`, counted when a request is
  admitted (routed), not completed: Dynamo's #11693 found completion counters hide
  the backlog under backpressure;
- p50/p90/p99 come from the histograms' buckets (`histogram_quantile`), since this
  project's SLA mode compares a percentile (`sla-percentile`), not the mean; they are
  as coarse as the buckets (GIE's).

The pool load of the load-based rules (Dynamo's planner) comes from the per-role pool gauges
(`inference_pool_role_*{name=<pool>}`), one instant query each per
`metric-pulling-interval`; several EPPs exporting the same pool give one series each,
folded with `max by (role)`. Not available from Prometheus: the ISL sample (left
empty: the forecast takes the interval's mean ISL) and per-endpoint in-flight work (drain victims
are the connector's choice, as with the virtual and Kubernetes connectors).

I/O (HTTP to Prometheus, blocking): called on the planner thread only.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from epp.planner.core.types import Role, Stats
from epp.planner.core.window import PoolSample

QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))

# Observation field -> (histogram, scale to the field's unit)
HISTOGRAMS: Mapping[str, tuple[str, float]] = {
    "ttft_ms": ("inference_objective_request_ttft_seconds", 1000.0),
    "itl_ms": ("inference_objective_request_tpot_seconds", 1000.0),
    "duration_s": ("inference_objective_request_duration_seconds", 1.0),
    "isl": ("inference_objective_input_tokens", 1.0),
    "osl": ("inference_objective_output_tokens", 1.0),
    "cached_tokens": ("inference_objective_prompt_cached_tokens", 1.0),
}
ADMITTED = "inference_objective_request_total"
POOL_GAUGES = {
    "waiting": "inference_pool_role_queue_size",
    "running": "inference_pool_role_running_requests",
    "kv_mean": "inference_pool_role_average_kv_cache_utilization",
    "ready": "inference_pool_role_ready_pods",
}
_ROLES = {r.value: r for r in Role}


class SourceError(RuntimeError):
    """Prometheus did not answer, or answered something else than a vector."""


@dataclass(frozen=True)
class PrometheusSource:
    """`url`: the server (`http://prometheus:9090`); `pool`: the `name` label of the pool
    gauges (`epp serve --pool-name`); `match`: extra label matchers for every series
    (`job="epp"`), so one Prometheus can hold several pools' EPPs."""

    url: str
    pool: str = "default"
    match: str = ""
    timeout_s: float = 5.0

    # ---- queries -----------------------------------------------------------
    def _selector(self, *extra: str) -> str:
        parts = [m for m in (*extra, self.match) if m]
        return "{" + ",".join(parts) + "}" if parts else ""

    def queries(self, interval_s: float) -> dict[str, str]:
        """Every interval query by name (`<field>.<stat>`, `arrivals`)."""
        i = f"{_duration(interval_s)}"
        sel = self._selector()
        out = {"arrivals": f"sum(increase({ADMITTED}{sel}[{i}]))"}
        for name, (metric, _) in HISTOGRAMS.items():
            out[f"{name}.count"] = f"sum(increase({metric}_count{sel}[{i}]))"
            out[f"{name}.mean"] = (
                f"sum(increase({metric}_sum{sel}[{i}])) / sum(increase({metric}_count{sel}[{i}]))"
            )
            for stat, q in QUANTILES:
                out[f"{name}.{stat}"] = (
                    f"histogram_quantile({q}, sum by (le) (increase({metric}_bucket{sel}[{i}])))"
                )
        return out

    def pool_queries(self) -> dict[str, str]:
        sel = self._selector(f'name="{_escape(self.pool)}"')
        return {key: f"max by (role) ({metric}{sel})" for key, metric in POOL_GAUGES.items()}

    # ---- what the planner reads ---------------------------------------------
    def pool_samples(self) -> list[PoolSample]:
        """One sample per role the pool gauges show now."""
        values: dict[str, dict[str, float]] = {}
        for key, promql in self.pool_queries().items():
            for labels, value in self.query(promql):
                values.setdefault(labels.get("role", ""), {})[key] = value
        out = []
        for role_name, v in sorted(values.items()):
            role = _ROLES.get(role_name)
            if role is None or not v.get("ready"):
                continue
            out.append(
                PoolSample(
                    role=role,
                    waiting=round(_num(v.get("waiting"))),
                    running=round(_num(v.get("running"))),
                    kv_mean=_num(v.get("kv_mean")),
                    ready=round(v["ready"]),
                )
            )
        return out

    def requests(self, interval_s: float) -> dict[str, Any]:
        """The request fields of an `Observation` over the last `interval_s` seconds:
        `arrivals`, `completions` and a `Stats` per histogram (`failures` stays 0: the
        EPP exports no count of failed responses)."""
        got: dict[str, float] = {}
        for name, promql in self.queries(interval_s).items():
            result = self.query(promql)
            got[name] = result[0][1] if result else math.nan
        out: dict[str, Any] = {
            "arrivals": round(_num(got["arrivals"])),
            "completions": round(_num(got["duration_s.count"])),
        }
        for name, (_, scale) in HISTOGRAMS.items():
            count = round(_num(got[f"{name}.count"]))
            if count == 0:
                out[name] = Stats()
                continue
            stats = {stat: got[f"{name}.{stat}"] * scale for stat, _ in QUANTILES}
            out[name] = Stats(count, got[f"{name}.mean"] * scale, **stats)
        return out

    # ---- the HTTP API -------------------------------------------------------
    def query(self, promql: str) -> list[tuple[dict[str, str], float]]:
        """`GET /api/v1/query?query=...`: the instant vector as (labels, value) pairs."""
        url = f"{self.url.rstrip('/')}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as r:
                body = json.loads(r.read())
        except urllib.error.HTTPError as e:  # Prometheus explains a bad query in the body
            raise SourceError(f"{self.url}: HTTP {e.code} for {promql!r}: {_error_of(e)}") from None
        except (OSError, ValueError) as e:
            raise SourceError(f"{self.url}: {e} (query {promql!r})") from None
        if not isinstance(body, dict) or body.get("status") != "success":
            why = body.get("error", body) if isinstance(body, dict) else body
            raise SourceError(f"{self.url}: {why!r} for {promql!r}")
        data = body.get("data")
        if not isinstance(data, dict):
            raise SourceError(f"{self.url}: no data for {promql!r}")
        if data.get("resultType") != "vector":
            raise SourceError(f"{self.url}: expected a vector for {promql!r}, got {data!r}")
        try:
            return [(dict(s["metric"]), float(s["value"][1])) for s in data["result"]]
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise SourceError(f"{self.url}: malformed sample ({e}) for {promql!r}") from None


def _duration(seconds: float) -> str:
    """A PromQL range: whole milliseconds (`30s`, `1500ms`)."""
    ms = max(1, round(seconds * 1000))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _num(value: float | None) -> float:
    """Prometheus says NaN for 0/0 (no requests); a count of nothing is 0 here."""
    return 0.0 if value is None or math.isnan(value) else value


def _error_of(e: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(e.read()).get("error", ""))
    except (OSError, ValueError, AttributeError):
        return ""
