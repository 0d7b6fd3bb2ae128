"""Plugin registry keyed by YAML `type`, with upstream names as aliases.

Find any plugin by its YAML name: `grep -r 'type_name = "queue-depth-scorer"' plugins/`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from epp.datastore import Endpoint
from epp.scheduling.interfaces import Plugin
from epp.scheduling.params import NoParams


def _no_endpoints() -> list[Endpoint]:
    return []


def _no_subscription(fn: Callable[[], None]) -> Callable[[], None]:
    return lambda: None


@dataclass
class Handle:
    """What a plugin may ask of the running EPP: injectable randomness and time, peers,
    and the pool's membership (not its metrics: those arrive in each cycle's snapshot).

    `pool()` lists the configured endpoints; `on_pool_change(fn)` calls `fn` after the
    membership changes and returns an unsubscribe function. The server wires both to
    its datastore; outside a server they describe an empty pool.
    """

    rng: random.Random = field(default_factory=random.Random)
    clock: Callable[[], float] = time.monotonic
    plugins: dict[str, Plugin] = field(default_factory=dict)
    pool: Callable[[], list[Endpoint]] = _no_endpoints
    on_pool_change: Callable[[Callable[[], None]], Callable[[], None]] = _no_subscription

    def plugin(self, name: str) -> Plugin | None:
        return self.plugins.get(name)


@dataclass(frozen=True)
class PluginSpec:
    type_name: str
    cls: type
    params: type
    aliases: tuple[str, ...]

    def build(self, name: str, params: Any, handle: Handle) -> Plugin:
        return self.cls(name, params, handle)


_REGISTRY: dict[str, PluginSpec] = {}
_ALIASES: dict[str, str] = {}

# Upstream (GIE EPP, llm-d) plugin types this project knows of but does not run yet,
# with where they are planned; a config naming one fails with this text, not a crash.
NOT_YET_IMPLEMENTED: dict[str, str] = {
    "pd-profile-handler": "its successor disagg-profile-handler: use that with "
    "prefix-based-pd-decider",
    "encode-filter": "encode/prefill/decode disaggregation",
    "utilization-detector": "saturation detection and shedding",
    "concurrency-detector": "saturation detection and shedding",
    "latency-scorer": "latency-predictor routing",
    "predicted-latency-producer": "latency-predictor routing",
    "slo-headroom-tier-filter": "latency-predictor routing",
    "latency-slo-admitter": "latency-predictor routing",
    "load-aware-scorer": "llm-d load-aware scoring",
    "active-request-scorer": "llm-d active-request scoring",
    "context-length-aware": "context-length-aware routing",
    "inflight-load-producer": "in-flight load is counted by the EPP itself; no producer needed",
    "vllmgrpc-parser": "the vLLM gRPC protocol",
    "passthrough-parser": "raw passthrough parsing",
}


def register(type_name: str, *, aliases: tuple[str, ...] = ()) -> Callable[[type], type]:
    """Class decorator: `@register("queue-depth-scorer", aliases=("queue-scorer",))`.

    The class takes `(name, params, handle)` and declares `Params` (a dataclass) unless
    it takes no parameters.
    """

    def wrap(cls: type) -> type:
        cls.type_name = type_name  # type: ignore[attr-defined]
        spec = PluginSpec(type_name, cls, getattr(cls, "Params", NoParams), aliases)
        for key in (type_name, *aliases):
            if key in _REGISTRY or key in _ALIASES:
                raise ValueError(f"plugin type {key!r} registered twice")
        _REGISTRY[type_name] = spec
        for alias in aliases:
            _ALIASES[alias] = type_name
        return cls

    return wrap


def lookup(type_name: str) -> PluginSpec | None:
    _load_builtin_plugins()
    return _REGISTRY.get(_ALIASES.get(type_name, type_name))


def canonical(type_name: str) -> str:
    return _ALIASES.get(type_name, type_name)


def all_types() -> list[str]:
    _load_builtin_plugins()
    return sorted(_REGISTRY)


def all_names() -> list[str]:
    """Types and their upstream aliases: what a config may name."""
    _load_builtin_plugins()
    return sorted([*_REGISTRY, *_ALIASES])


def all_specs() -> list[PluginSpec]:
    _load_builtin_plugins()
    return [_REGISTRY[k] for k in sorted(_REGISTRY)]


_loaded = False


def _load_builtin_plugins() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        import plugins  # noqa: F401  (registers every built-in plugin)
