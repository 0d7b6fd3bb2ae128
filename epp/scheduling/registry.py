"""Plugin registry keyed by YAML `type`, with upstream names as aliases.

The framework knows no plugin: `PLUGIN_TYPES` starts empty and the composition root
(`epp.composition.install_plugins`) fills it with the built-ins (`plugins.BUILTIN_MODULES`)
and out-of-tree plugins from the `epp.plugins` entry-point group.
Find a built-in by its YAML name: `grep -rn 'register("queue-depth-scorer"' plugins/`.
"""

from __future__ import annotations

import importlib
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from types import ModuleType
from typing import Any

from epp.config.params import NoParams
from epp.datastore import Endpoint
from epp.scheduling.interfaces import Plugin


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


# Upstream (GIE EPP, llm-d) plugin types this project knows of but does not run yet,
# with where they are planned; a config naming one fails with this text, not a crash.
NOT_YET_IMPLEMENTED: dict[str, str] = {
    "pd-profile-handler": "its successor disagg-profile-handler: use that with "
    "prefix-based-pd-decider",
    "load-aware-scorer": "llm-d load-aware scoring",
    "active-request-scorer": "llm-d active-request scoring",
    "context-length-aware": "context-length-aware routing",
    "inflight-load-producer": "in-flight load is counted by the EPP itself; no producer needed",
    "vllmgrpc-parser": "the vLLM gRPC protocol",
    "passthrough-parser": "raw passthrough parsing",
}

ENTRY_POINT_GROUP = "epp.plugins"


class PluginImportError(Exception):
    """A plugin module could not be imported; the registry is left as it was."""


def register(type_name: str, *, aliases: tuple[str, ...] = ()) -> Callable[[type], type]:
    """Class decorator: `@register("queue-depth-scorer", aliases=("queue-scorer",))`.

    It only marks the class; a registry takes it in when its module is registered
    (`Registry.add_modules`). The class takes `(name, params, handle)` and declares
    `Params` (a dataclass) unless it takes no parameters.
    """

    def wrap(cls: type) -> type:
        cls.type_name = type_name  # type: ignore[attr-defined]
        cls.type_aliases = aliases  # type: ignore[attr-defined]
        return cls

    return wrap


def plugin_classes(module: ModuleType) -> list[type]:
    """The `@register`-marked classes a module defines (not ones it merely imports)."""
    return [
        obj
        for obj in vars(module).values()
        if isinstance(obj, type)
        and obj.__module__ == module.__name__
        and "type_aliases" in vars(obj)
    ]


class Registry:
    """Plugin types by YAML `type`, with upstream names as aliases.

    The framework ships it empty: the composition root (`epp.composition`) adds the
    built-ins and the `epp.plugins` entry points, as GIE's `cmd/epp/runner/runner.go`
    calls `plugins.Register(type, factory)` for each of its own.
    """

    def __init__(self) -> None:
        self._specs: dict[str, PluginSpec] = {}
        self._aliases: dict[str, str] = {}

    def add(self, cls: type) -> None:
        """Register one `@register`-marked class; a type or alias taken twice is an error."""
        self._add_all([cls])

    def add_modules(self, names: Iterable[str]) -> None:
        """Import each module and register its plugin classes, all or nothing.

        An import that fails leaves the registry unchanged, so the caller may fix the
        cause and call again (no half-filled registry that hides the failure).
        """
        classes: list[type] = []
        for name in names:
            try:
                module = importlib.import_module(name)
            except Exception as e:
                raise PluginImportError(f"plugin module {name!r} failed to import: {e!r}") from e
            classes += plugin_classes(module)
        self._add_all(classes)

    def add_entry_points(self, group: str = ENTRY_POINT_GROUP) -> list[str]:
        """Register out-of-tree plugins: each entry point of `group` names a module (all
        its `@register` classes) or one class. All or nothing, like `add_modules`.
        Returns the entry points' names."""
        classes: list[type] = []
        found = sorted(entry_points(group=group), key=lambda ep: ep.name)
        for ep in found:
            try:
                obj = ep.load()
            except Exception as e:
                raise PluginImportError(
                    f"entry point {ep.name!r} ({ep.value}) of group {group!r} failed to "
                    f"import: {e!r}"
                ) from e
            if isinstance(obj, ModuleType):
                classes += plugin_classes(obj)
            elif isinstance(obj, type) and "type_aliases" in vars(obj):
                classes.append(obj)
            else:
                raise PluginImportError(
                    f"entry point {ep.name!r} ({ep.value}) of group {group!r} must name a "
                    "module or a class marked with @register"
                )
        self._add_all(classes)
        return [ep.name for ep in found]

    def _add_all(self, classes: list[type]) -> None:
        specs: dict[str, PluginSpec] = {}
        aliases: dict[str, str] = {}
        for cls in classes:
            known = self._specs.get(cls.type_name) or specs.get(cls.type_name)  # type: ignore[attr-defined]
            if known is not None and known.cls is cls:
                continue  # the same class again: registering a module twice is harmless
            spec = PluginSpec(
                cls.type_name,  # type: ignore[attr-defined]
                cls,
                getattr(cls, "Params", NoParams),
                tuple(cls.type_aliases),  # type: ignore[attr-defined]
            )
            for key in (spec.type_name, *spec.aliases):
                if key in self._specs or key in self._aliases or key in specs or key in aliases:
                    raise ValueError(f"plugin type {key!r} registered twice ({cls.__module__})")
            specs[spec.type_name] = spec
            aliases.update(dict.fromkeys(spec.aliases, spec.type_name))
        self._specs.update(specs)
        self._aliases.update(aliases)

    def lookup(self, type_name: str) -> PluginSpec | None:
        return self._specs.get(self._aliases.get(type_name, type_name))

    def canonical(self, type_name: str) -> str:
        return self._aliases.get(type_name, type_name)

    def all_types(self) -> list[str]:
        return sorted(self._specs)

    def all_names(self) -> list[str]:
        """Types and their upstream aliases: what a config may name."""
        return sorted([*self._specs, *self._aliases])

    def all_specs(self) -> list[PluginSpec]:
        return [self._specs[k] for k in sorted(self._specs)]


# The process's registry: empty until a composition root fills it.
PLUGIN_TYPES = Registry()
