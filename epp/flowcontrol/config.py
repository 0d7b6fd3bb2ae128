"""The config's `flowControl:` section (GIE's shape, gie-epp.md §2.1, §5.4) → FlowControlConfig.

    featureGates: [flowControl]          # as upstream: the section counts only with the gate
    flowControl:
      maxRequests: 5000                  # in the whole queue; k8s quantities ("1k") accepted
      maxBytes: 1Gi                      # raw request-body bytes held
      defaultRequestTTL: 30s             # a request waiting longer gets 503 (0 = no limit);
                                         # x-llm-d-inference-ttl may shorten it per request
      defaultPriorityBand: {maxRequests: 0, maxBytes: 1Gi, fairnessPolicyRef: rr}
      priorityBands:
      - {priority: 100, maxRequests: 500, fairnessPolicyRef: rr,
         orderingPolicyRef: fcfs-ordering-policy}
      usageLimitPolicyPluginRef: static-usage-limit-policy
      enableEviction: false              # true: running sheddable requests are stopped
                                         # for waiting higher-priority ones (eviction.py)

Policy references name a plugin under `plugins:` or, as upstream's defaulting does, a
policy type used with its defaults. Defaults live in the `param()`s below; they differ
from upstream's where upstream leaves memory unbounded: the whole queue holds at most
5000 requests and 1 GiB (upstream: unlimited unless set), and a request waits at most
30 s (upstream: no TTL, only the client's deadline), so a stalled pool cannot grow the
EPP without bound. Sheddable requests (priority < 0) never wait ("when the pool
is saturated, requests with negative priority get 429; others wait"), so bands are for
priorities ≥ 0.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from epp.config.errors import ConfigError
from epp.config.params import param, parse_params
from epp.flowcontrol.queue import FCFS, ROUND_ROBIN, BandLimits
from epp.scheduling.registry import NOT_YET_IMPLEMENTED, Handle, Registry

GiB = 1 << 30


@dataclass(frozen=True, kw_only=True)
class BandParams:
    max_requests: int | str = param(0, doc="requests the band holds (0 = only the global bound)")
    max_bytes: int | str = param(GiB, doc="body bytes the band holds (upstream 1 GB; 0 = none)")
    fairness_policy_ref: str = param(
        "", doc="a fairness policy plugin or type (default round-robin-fairness-policy)"
    )
    ordering_policy_ref: str = param(
        "",
        doc="an ordering policy plugin or type (default fcfs-ordering-policy; "
        "edf-ordering-policy, slo-deadline-ordering-policy)",
    )


@dataclass(frozen=True, kw_only=True)
class PriorityBandParams(BandParams):
    priority: int = param(min=0, doc="the objective priority this band holds")


@dataclass(frozen=True)
class FlowControlParams:
    max_requests: int | str = param(5000, doc="requests the whole queue holds (> 0)")
    max_bytes: int | str = param(GiB, doc="body bytes the whole queue holds (> 0)")
    default_request_ttl: float | str = param(
        30.0,
        aliases=("defaultRequestTTL",),
        doc="seconds (or '30s', '500ms') a request may wait; 0 = no limit",
    )
    default_priority_band: BandParams = param(
        default_factory=BandParams, doc="limits of bands not listed in priorityBands"
    )
    priority_bands: list[PriorityBandParams] = param(
        default_factory=list, doc="per-priority limits"
    )
    usage_limit_policy_plugin_ref: str = param(
        "", doc="static-usage-limit-policy (threshold 1.0: dispatch while saturation < 1)"
    )
    enable_eviction: bool = param(
        False,
        doc="stop running sheddable requests (priority < 0) when requests of higher "
        "priority wait on a saturated pool (llm-d-router's enableEviction)",
    )


@dataclass(frozen=True)
class FlowControlConfig:
    """What the controller runs with, every value checked and in base units."""

    max_requests: int = 5000
    max_bytes: int = GiB
    ttl: float = 30.0
    bands: dict[int, BandLimits] = field(default_factory=dict)
    default_band: BandLimits = field(default_factory=BandLimits)
    # Dispatch while the pool's saturation is below this (static-usage-limit-policy);
    # a sheddable request passes only below `sheddable_ceiling` (≤ ceiling).
    ceiling: float = 1.0
    sheddable_ceiling: float = 1.0
    enable_eviction: bool = False


_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?$")
_SCALE = {None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_SCALE |= {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def quantity(value: int | str, path: str) -> int:
    """An integer or a Kubernetes quantity ("1k", "10Gi") → int, ≥ 0."""
    if isinstance(value, int):
        n = value
    else:
        m = _QUANTITY.match(value.strip())
        if m is None:
            raise ConfigError(
                path, f"must be an integer or a quantity like 1k or 10Gi, got {value!r}"
            )
        n = int(float(m.group(1)) * _SCALE[m.group(2)])
    if n < 0:
        raise ConfigError(path, f"must be at least 0, got {value!r}")
    return n


def duration(value: float | str, path: str) -> float:
    """Seconds, or a Go duration ("60s", "200ms", "1m30s") → seconds, ≥ 0."""
    if isinstance(value, float):
        s = value
    else:
        text = value.strip()
        parts = _DURATION_PART.findall(text)
        if not parts or "".join(n + u for n, u in parts) != text:
            raise ConfigError(
                path, f"must be seconds or a duration like 30s or 500ms, got {value!r}"
            )
        s = sum(float(n) * _UNIT_S[u] for n, u in parts)
    if s < 0:
        raise ConfigError(path, f"must be at least 0, got {value!r}")
    return s


def parse_flow_control(
    section: Any,
    gate_on: bool,
    plugins: Mapping[str, Any],
    handle: Handle,
    registry: Registry,
) -> FlowControlConfig | None:
    """The section (or its defaults when only the gate is on); None when flow control is off."""
    if section is not None and not gate_on:
        raise ConfigError(
            "flowControl",
            "is set but flow control is off: add `featureGates: [flowControl]` (upstream "
            "honours the section only with that gate)",
        )
    if not gate_on:
        return None
    p: FlowControlParams = parse_params(FlowControlParams, section, "flowControl")
    max_requests = quantity(p.max_requests, "flowControl.maxRequests")
    max_bytes = quantity(p.max_bytes, "flowControl.maxBytes")
    for name, v in (("maxRequests", max_requests), ("maxBytes", max_bytes)):
        if v == 0:
            raise ConfigError(
                f"flowControl.{name}",
                "must be > 0: the queue is bounded (upstream's 0 = unlimited is not accepted)",
            )
    resolve = _PolicyResolver(plugins, handle, registry)
    bands: dict[int, BandLimits] = {}
    for i, b in enumerate(p.priority_bands):
        path = f"flowControl.priorityBands[{i}]"
        if b.priority in bands:
            raise ConfigError(f"{path}.priority", f"priority {b.priority} is listed twice")
        bands[b.priority] = _band(b, path, resolve)
    ceiling = sheddable = 1.0
    if p.usage_limit_policy_plugin_ref:
        limit = resolve(
            p.usage_limit_policy_plugin_ref, "usage-limit", "flowControl.usageLimitPolicyPluginRef"
        ).params
        ceiling = limit.threshold
        sheddable = limit.sheddable_threshold or limit.threshold
    return FlowControlConfig(
        max_requests=max_requests,
        max_bytes=max_bytes,
        ttl=duration(p.default_request_ttl, "flowControl.defaultRequestTTL"),
        bands=bands,
        default_band=_band(p.default_priority_band, "flowControl.defaultPriorityBand", resolve),
        ceiling=ceiling,
        sheddable_ceiling=sheddable,
        enable_eviction=p.enable_eviction,
    )


def _band(b: BandParams, path: str, resolve: _PolicyResolver) -> BandLimits:
    fairness, ordering = ROUND_ROBIN, FCFS
    if b.fairness_policy_ref:
        fairness = resolve(b.fairness_policy_ref, "fairness", f"{path}.fairnessPolicyRef").fairness
    if b.ordering_policy_ref:
        ordering = resolve(b.ordering_policy_ref, "ordering", f"{path}.orderingPolicyRef").ordering
    return BandLimits(
        max_requests=quantity(b.max_requests, f"{path}.maxRequests"),
        max_bytes=quantity(b.max_bytes, f"{path}.maxBytes"),
        fairness=fairness,
        ordering=ordering,
    )


class _PolicyResolver:
    """A reference → the plugin under `plugins:` of that name, else a policy type with its
    defaults (upstream's defaulting makes `fcfs-ordering-policy` etc. exist by name)."""

    def __init__(self, plugins: Mapping[str, Any], handle: Handle, registry: Registry) -> None:
        self.plugins, self.handle, self.registry = plugins, handle, registry

    def __call__(self, ref: str, kind: str, path: str) -> Any:
        plugin = self.plugins.get(ref)
        if plugin is None:
            spec = self.registry.lookup(ref)
            if spec is not None and getattr(spec.cls, "policy_kind", None):
                plugin = spec.build(ref, spec.params(), self.handle)
            elif ref in NOT_YET_IMPLEMENTED:
                raise ConfigError(
                    path,
                    f"{ref!r} is not implemented yet (planned with {NOT_YET_IMPLEMENTED[ref]})",
                )
        if plugin is None:
            raise ConfigError(
                path,
                f"refers to {ref!r}, which is neither a plugin under 'plugins' nor a "
                f"{kind} policy type; {kind} policies: {', '.join(self._types(kind))}",
            )
        if getattr(plugin, "policy_kind", None) != kind:
            raise ConfigError(
                path,
                f"{plugin!r} is not {'an' if kind[0] in 'aeiou' else 'a'} {kind} policy; "
                f"use one of {', '.join(self._types(kind))}",
            )
        return plugin

    def _types(self, kind: str) -> list[str]:
        out = []
        for name in self.registry.all_types():
            spec = self.registry.lookup(name)
            if spec is not None and getattr(spec.cls, "policy_kind", None) == kind:
                out.append(name)
        return out
