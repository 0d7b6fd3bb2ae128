"""EndpointPickerConfig (the Gateway API Inference Extension's format) → a runnable setup.

Phases, as upstream: parse YAML → instantiate plugins by type (strict parameters) →
apply defaults (one profile without a handler gets `single-profile-handler`; a profile
without a picker gets the first defined picker or a new `max-score-picker`; scorer
weight 1.0) → validate references → build profiles and the scheduler. Every problem is
a ConfigError naming the file, the field path and what would be accepted.
"""

from __future__ import annotations

import difflib
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from epp.admission import SaturationDetector
from epp.config.errors import ConfigError
from epp.config.params import parse_params
from epp.flowcontrol.config import FlowControlConfig, parse_flow_control
from epp.scheduling.interfaces import (
    Admitter,
    DataProducer,
    Filter,
    Picker,
    Plugin,
    PostResponse,
    PreRequest,
    ProfileHandler,
    Scorer,
)
from epp.scheduling.profile import SchedulerProfile, WeightedScorer
from epp.scheduling.registry import (
    NOT_YET_IMPLEMENTED,
    PLUGIN_TYPES,
    Handle,
    PluginSpec,
    Registry,
)
from epp.scheduling.scheduler import Scheduler

API_VERSIONS = ("inference.networking.x-k8s.io/v1alpha1",)
KIND = "EndpointPickerConfig"
TOP_LEVEL_KEYS = (
    "apiVersion",
    "kind",
    "plugins",
    "schedulingProfiles",
    "featureGates",
    "saturationDetector",
    "dataLayer",
    "flowControl",
    "parser",
)
# Upstream's gates; the ones this project has no use for are accepted and ignored.
FEATURE_GATES = {
    "dataLayer": None,  # upstream: deprecated no-op
    "enableLegacyMetrics": None,  # this project has one metrics path
    "flowControl": None,  # turns flow control on (epp/flowcontrol/config.py)
}

# The built-in profile when no --config is given, identical to config/default.yaml (in its
# plugins config/slo-calibrated.yaml: config/prefix-aware.yaml plus the SLO pair, which a
# request without targets leaves neutral): "sticky until saturated", llm-d's token-aware
# default. Upstream GIE's weighted blend (queue 2, kv 2, prefix 3) is
# config/prefix-weighted.yaml.
DEFAULT_CONFIG = """\
# The EPP's default scheduling, the same as running `epp serve` without --config:
# "sticky until saturated" (config/prefix-aware.yaml, where each parameter is explained):
# the prefix-cache affinity filter keeps the endpoints that already hold the prompt while
# their first token would come no more than maxTTFTPenaltyMs later than a cold server's,
# the token-load scorer spreads by the tokens the EPP has in flight (a burst is balanced
# before any scrape reports it) plus what this request would prefill there. A request
# that carries its targets (x-slo-ttft-ms / x-slo-tpot-ms) is also placed by them
# (config/slo-calibrated.yaml, explained in docs/plugins.md): predictions that know the
# queue, corrected by what each endpoint measured; a request without targets scores the
# same on every endpoint there, so it routes exactly as config/prefix-aware.yaml would.
# The default of upstream (GIE `pkg/epp/config/loader/defaults.go`: queue 2, KV cache 2,
# prefix 3) is config/prefix-weighted.yaml; docs/BENCHMARKS.md compares them ("Routing vs
# Envoy round-robin on named workloads").
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: approx-prefix-cache-producer
  parameters:
    blockSizeTokens: 16           # vLLM's default block size; autoTune reads the real one
    maxPrefixBlocksToMatch: 256   # 256 × 16 tokens ≈ the first 4K tokens
    maxPrefixTokensToMatch: 0     # > 0 overrides the cap above (in tokens)
    lruCapacityPerServer: 31250   # blocks per endpoint when num_gpu_blocks is unknown
    autoTune: true                # block_size / num_gpu_blocks from vllm:cache_config_info
- type: calibrated-latency-producer  # requests with targets only; defaults chosen on a tuning set
- type: prefix-cache-affinity-filter
  parameters:
    affinityThreshold: 0.8
    loadSignal: live
    queuedRequestTokens: 1024
    peakPrefillThroughput: 15928
    maxTTFTPenaltyMs: 250
    includeRequest: true
    cachedPenaltyFactor: 2
    evictionCost: true
- type: slo-calibrated-scorer
  parameters:
    harmWeight: 0.1
- type: token-load-scorer
  parameters:
    perRequestTokens: 128
    evictionCost: true
- type: prefix-cache-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-affinity-filter
  - pluginRef: slo-calibrated-scorer
    weight: 2
  - pluginRef: token-load-scorer
    weight: 1
  - pluginRef: prefix-cache-scorer
    weight: 0.0000001
  - pluginRef: max-score-picker
"""


@dataclass
class LoadedConfig:
    """Everything the server needs from a config, built and validated."""

    scheduler: Scheduler
    plugins: dict[str, Plugin]
    pre_request: list[PreRequest] = field(default_factory=list)
    post_response: list[PostResponse] = field(default_factory=list)
    source: str = "<built-in default>"
    handle: Handle = field(default_factory=Handle)
    # `saturationDetector.pluginRef`, else a `utilization-detector` with upstream's
    # defaults (GIE creates one the same way); admission sheds sheddable requests by it.
    saturation_detector: SaturationDetector | None = None
    # `featureGates: [flowControl]` (+ the `flowControl:` section): requests of priority
    # >= 0 wait in the EPP while the detector says saturated (epp/flowcontrol/).
    flow_control: FlowControlConfig | None = None

    def plugins_of(self, cls: type) -> list[Any]:
        return [p for p in self.plugins.values() if isinstance(p, cls)]

    def describe(self) -> str:
        lines = [f"config {self.source}: handler {self.scheduler.handler!r}"]
        lines += [f"  profile {p.describe()}" for p in self.scheduler.profiles.values()]
        return "\n".join(lines)


def load_config_file(
    path: str | Path, handle: Handle | None = None, registry: Registry = PLUGIN_TYPES
) -> LoadedConfig:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError("", f"cannot read config file: {e.strerror or e}", str(p)) from None
    return load_config_text(text, str(p), handle, registry)


def load_default_config(
    handle: Handle | None = None, registry: Registry = PLUGIN_TYPES
) -> LoadedConfig:
    return load_config_text(DEFAULT_CONFIG, "<built-in default>", handle, registry)


def load_config_text(
    text: str,
    source: str = "<config text>",
    handle: Handle | None = None,
    registry: Registry = PLUGIN_TYPES,
) -> LoadedConfig:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError("", f"invalid YAML{where}: {problem}", source) from None
    try:
        return build(data, handle or Handle(rng=random.Random()), source, registry)
    except ConfigError as e:
        raise e.in_file(source) from None


def _unknown_type(type_name: str, registry: Registry) -> str:
    types = registry.all_types()
    if not types:
        return (
            f"unknown plugin type {type_name!r}: no plugin types are registered (the program "
            "must call epp.composition.install_plugins() before loading a config)"
        )
    return (
        f"unknown plugin type {type_name!r}.{_did_you_mean(type_name, registry.all_names())} "
        f"Known types: {', '.join(types)}"
    )


def _builtin(registry: Registry, type_name: str) -> PluginSpec:
    """A plugin type the loader's upstream defaults name (a picker, a profile handler)."""
    spec = registry.lookup(type_name)
    if spec is None:
        raise ConfigError("plugins", _unknown_type(type_name, registry))
    return spec


def _did_you_mean(word: str, options: list[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1)
    return f" Did you mean '{close[0]}'?" if close else ""


def build(
    data: Any, handle: Handle, source: str = "", registry: Registry = PLUGIN_TYPES
) -> LoadedConfig:
    """Build a config whose plugin types come from `registry` (filled by the composition
    root, `epp.composition.install_plugins`)."""
    if not isinstance(data, Mapping):
        raise ConfigError("", f"the config must be a YAML mapping ({KIND}), got {data!r}")
    for key in data:
        if key not in TOP_LEVEL_KEYS:
            raise ConfigError(
                str(key),
                f"unknown field.{_did_you_mean(str(key), list(TOP_LEVEL_KEYS))} "
                f"Accepted fields: {', '.join(TOP_LEVEL_KEYS)}",
            )
    api = data.get("apiVersion")
    if api is not None and api not in API_VERSIONS:
        raise ConfigError("apiVersion", f"must be {' or '.join(API_VERSIONS)}; got {api!r}")
    kind = data.get("kind")
    if kind is not None and kind != KIND:
        raise ConfigError("kind", f"must be {KIND}; got {kind!r}")
    _check_feature_gates(data.get("featureGates"))

    plugins = _instantiate_plugins(data.get("plugins"), handle, registry)
    configured = len(plugins)
    created_for = _create_missing_producers(plugins, handle, registry)
    _check_producer_keys(plugins, configured, created_for)
    handle.plugins.update(plugins)
    _check_plugin_references(plugins)
    for ref_field in ("saturationDetector", "parser"):
        section = data.get(ref_field)
        if section is not None:
            _check_ref_section(section, ref_field, plugins)
    _check_data_layer(data.get("dataLayer"), plugins)
    detector = _saturation_detector(data.get("saturationDetector"), plugins, handle, registry)
    flow_control = parse_flow_control(
        data.get("flowControl"),
        "flowControl" in (data.get("featureGates") or []),
        plugins,
        handle,
        registry,
    )
    if flow_control is not None and detector is None:
        raise ConfigError(
            "saturationDetector", "flow control needs a saturation detector; name one"
        )

    profiles = _build_profiles(data.get("schedulingProfiles"), plugins, handle, registry)
    handler = _profile_handler(plugins, profiles, handle, registry)
    producers = [p for p in plugins.values() if isinstance(p, DataProducer)]
    return LoadedConfig(
        scheduler=Scheduler(
            handler, profiles, producers, [p for p in plugins.values() if isinstance(p, Admitter)]
        ),
        plugins=plugins,
        pre_request=[p for p in plugins.values() if isinstance(p, PreRequest)],
        post_response=[p for p in plugins.values() if isinstance(p, PostResponse)],
        source=source,
        handle=handle,
        saturation_detector=detector,
        flow_control=flow_control,
    )


def _check_feature_gates(gates: Any) -> None:
    if gates is None:
        return
    if not isinstance(gates, list):
        raise ConfigError("featureGates", f"must be a list of gate names, got {gates!r}")
    for i, gate in enumerate(gates):
        if gate not in FEATURE_GATES:
            raise ConfigError(
                f"featureGates[{i}]",
                f"unknown feature gate {gate!r}. Known gates: {', '.join(FEATURE_GATES)}",
            )
        if FEATURE_GATES[gate]:
            raise ConfigError(f"featureGates[{i}]", f"{gate}: {FEATURE_GATES[gate]}")


def _instantiate_plugins(specs: Any, handle: Handle, registry: Registry) -> dict[str, Plugin]:
    if specs is None:
        return {}
    if not isinstance(specs, list):
        raise ConfigError("plugins", f"must be a list of {{type, name, parameters}}, got {specs!r}")
    out: dict[str, Plugin] = {}
    for i, spec in enumerate(specs):
        path = f"plugins[{i}]"
        if not isinstance(spec, Mapping):
            raise ConfigError(path, f"must be a mapping with 'type', got {spec!r}")
        for key in spec:
            if key not in ("type", "name", "parameters"):
                raise ConfigError(
                    f"{path}.{key}",
                    f"unknown field.{_did_you_mean(str(key), ['type', 'name', 'parameters'])} "
                    "Accepted fields: type, name, parameters",
                )
        type_name = spec.get("type")
        if not isinstance(type_name, str) or not type_name:
            raise ConfigError(f"{path}.type", "is required (the plugin's registered type)")
        name = spec.get("name", type_name)
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{path}.name", f"must be a non-empty string, got {name!r}")
        if name in out:
            raise ConfigError(
                f"{path}.name", f"duplicate plugin name {name!r}; names must be unique"
            )
        plugin_spec = registry.lookup(type_name)
        if plugin_spec is None:
            planned = NOT_YET_IMPLEMENTED.get(type_name)
            if planned:
                raise ConfigError(
                    f"{path}.type",
                    f"plugin type {type_name!r} is an upstream plugin that epp does not "
                    f"implement yet (planned with {planned}); remove it from the config",
                )
            raise ConfigError(f"{path}.type", _unknown_type(type_name, registry))
        params = parse_params(plugin_spec.params, spec.get("parameters"), f"{path}.parameters")
        try:
            out[name] = plugin_spec.build(name, params, handle)
        except ValueError as e:
            raise ConfigError(f"{path}.parameters", str(e)) from None
    return out


def _create_missing_producers(
    plugins: dict[str, Plugin], handle: Handle, registry: Registry
) -> dict[str, Plugin]:
    """A consumer configured without its producer gets one, with the consumer's parameters.

    Upstream does the same (configs written before producers existed put the prefix
    parameters on the scorer); here those parameters configure the producer instead of
    being silently dropped. When a producer of that type IS configured, parameters on the
    consumer would configure nothing, so they must equal the producer's or be absent.
    """
    index = {name: i for i, name in enumerate(plugins)}
    created_for: dict[str, Plugin] = {}
    for consumer in list(plugins.values()):
        wanted = getattr(consumer, "producer_type", None)
        if not wanted:
            continue
        spec = registry.lookup(wanted)
        if spec is None:
            raise ConfigError("plugins", f"{consumer!r} needs producer type {wanted!r}, unknown")
        params = getattr(consumer, "params", None)
        given = isinstance(params, spec.params) and params != spec.params()
        producers = [p for p in plugins.values() if p.type_name == spec.type_name]
        for producer in producers:
            if given and getattr(producer, "params", None) != params:
                raise ConfigError(
                    f"plugins[{index[consumer.name]}].parameters",
                    f"{consumer!r} has parameters that its producer {producer!r} would ignore; "
                    f"put them on the {spec.type_name} plugin (a consumer's parameters "
                    "configure its producer only when the config defines none)",
                )
        if producers:
            continue
        name = spec.type_name if spec.type_name not in plugins else f"{spec.type_name}-auto"
        plugins[name] = spec.build(name, params if given else spec.params(), handle)
        created_for[name] = consumer
    return created_for


def _check_producer_keys(
    plugins: dict[str, Plugin], configured: int, created_for: dict[str, Plugin]
) -> None:
    """Each producer declares the one CycleState key it writes; two writing one key would
    silently overwrite each other, so that is refused here, at start."""
    writers: dict[str, Plugin] = {}
    for i, plugin in enumerate(plugins.values()):
        if not callable(getattr(plugin, "produce", None)):
            continue
        path = f"plugins[{i}]" if i < configured else "plugins"
        key = getattr(plugin, "produces", None)
        if not isinstance(key, str) or not key:
            raise ConfigError(
                path,
                f"data producer {plugin!r} declares no `produces` key (the CycleState key "
                "its result is written under); set the class attribute `produces`",
            )
        first = writers.setdefault(key, plugin)
        if first is not plugin:
            raise ConfigError(
                path,
                f"{_producer_label(plugin, created_for)} and "
                f"{_producer_label(first, created_for)} both produce {key!r}; a scheduling "
                "cycle holds one value per key, so one would silently replace the other. "
                "Keep one producer of that key (and the consumers that need that producer)",
            )


def _check_plugin_references(plugins: dict[str, Plugin]) -> None:
    """A plugin that names another by a parameter (`check_references`) resolves it now, so
    a wrong name fails at start with the field's path instead of at the first request."""
    for i, plugin in enumerate(plugins.values()):
        check = getattr(plugin, "check_references", None)
        if not callable(check):
            continue
        try:
            check()
        except ValueError as e:
            raise ConfigError(f"plugins[{i}].parameters", str(e)) from None


def _producer_label(plugin: Plugin, created_for: dict[str, Plugin]) -> str:
    consumer = created_for.get(plugin.name)
    return f"{plugin!r} (created for {consumer!r})" if consumer is not None else repr(plugin)


def _check_ref_section(section: Any, path: str, plugins: dict[str, Plugin]) -> None:
    if not isinstance(section, Mapping) or set(section) - {"pluginRef"}:
        raise ConfigError(path, "must be a mapping with only 'pluginRef'")
    _resolve_ref(section.get("pluginRef"), f"{path}.pluginRef", plugins)


def _saturation_detector(
    section: Any, plugins: dict[str, Plugin], handle: Handle, registry: Registry
) -> SaturationDetector | None:
    if section is None:
        spec = registry.lookup("utilization-detector")
        return spec.build("utilization-detector", spec.params(), handle) if spec else None  # type: ignore[return-value]
    plugin = plugins[section["pluginRef"]]  # checked by _check_ref_section
    if not isinstance(plugin, SaturationDetector):
        raise ConfigError(
            "saturationDetector.pluginRef",
            f"{plugin!r} is not a saturation detector; use utilization-detector or "
            "concurrency-detector",
        )
    return plugin


def _check_data_layer(section: Any, plugins: dict[str, Plugin]) -> None:
    if section is None:
        return
    if not isinstance(section, Mapping) or set(section) - {"sources"}:
        raise ConfigError("dataLayer", "must be a mapping with only 'sources'")
    sources = section.get("sources") or []
    if not isinstance(sources, list):
        raise ConfigError("dataLayer.sources", "must be a list")
    for i, src in enumerate(sources):
        path = f"dataLayer.sources[{i}]"
        if not isinstance(src, Mapping) or set(src) - {"pluginRef", "extractors"}:
            raise ConfigError(path, "must be a mapping with 'pluginRef' and 'extractors'")
        _resolve_ref(src.get("pluginRef"), f"{path}.pluginRef", plugins)
        for j, ex in enumerate(src.get("extractors") or []):
            if not isinstance(ex, Mapping) or set(ex) - {"pluginRef"}:
                raise ConfigError(f"{path}.extractors[{j}]", "must be a mapping with 'pluginRef'")
            _resolve_ref(ex.get("pluginRef"), f"{path}.extractors[{j}].pluginRef", plugins)


def _resolve_ref(ref: Any, path: str, plugins: dict[str, Plugin]) -> Plugin:
    if not isinstance(ref, str) or not ref:
        raise ConfigError(path, "is required: the name of a plugin defined under 'plugins'")
    plugin = plugins.get(ref)
    if plugin is None:
        names = sorted(plugins)
        raise ConfigError(
            path,
            f"refers to {ref!r}, which is not defined under 'plugins'."
            f"{_did_you_mean(ref, names)} Defined plugins: {', '.join(names) or 'none'}",
        )
    return plugin


def _build_profiles(
    specs: Any, plugins: dict[str, Plugin], handle: Handle, registry: Registry
) -> dict[str, SchedulerProfile]:
    if specs is None or specs == []:
        # Upstream default: one profile holding every filter, scorer and picker defined.
        specs = [
            {
                "name": "default",
                "plugins": [{"pluginRef": n} for n, p in plugins.items() if _slot(p)],
            }
        ]
    if not isinstance(specs, list):
        raise ConfigError("schedulingProfiles", "must be a list of {name, plugins}")
    profiles: dict[str, SchedulerProfile] = {}
    for i, spec in enumerate(specs):
        path = f"schedulingProfiles[{i}]"
        if not isinstance(spec, Mapping):
            raise ConfigError(path, "must be a mapping with 'name' and 'plugins'")
        for key in spec:
            if key not in ("name", "plugins"):
                raise ConfigError(f"{path}.{key}", "unknown field. Accepted fields: name, plugins")
        name = spec.get("name")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{path}.name", "is required and must be a non-empty string")
        if name in profiles:
            raise ConfigError(f"{path}.name", f"duplicate profile name {name!r}")
        profiles[name] = _build_profile(name, spec.get("plugins"), path, plugins, handle, registry)
    return profiles


def _slot(plugin: Plugin) -> str | None:
    if isinstance(plugin, Picker):
        return "picker"
    if isinstance(plugin, Scorer):
        return "scorer"
    if isinstance(plugin, Filter):
        return "filter"
    return None


def _build_profile(
    name: str,
    refs: Any,
    path: str,
    plugins: dict[str, Plugin],
    handle: Handle,
    registry: Registry,
) -> SchedulerProfile:
    if not isinstance(refs, list):
        raise ConfigError(f"{path}.plugins", "must be a list of {pluginRef, weight?}")
    filters: list[Filter] = []
    scorers: list[WeightedScorer] = []
    picker: Picker | None = None
    for j, ref in enumerate(refs):
        rpath = f"{path}.plugins[{j}]"
        if not isinstance(ref, Mapping) or set(ref) - {"pluginRef", "weight"}:
            raise ConfigError(rpath, "must be a mapping with 'pluginRef' and optional 'weight'")
        plugin = _resolve_ref(ref.get("pluginRef"), f"{rpath}.pluginRef", plugins)
        slot = _slot(plugin)
        weight = ref.get("weight")
        if slot is None and isinstance(plugin, Admitter) and weight is None:
            # Upstream's examples list an admitter in a profile; it runs for every request,
            # before the profiles (Scheduler._admit), wherever it is listed.
            continue
        if slot is None:
            raise ConfigError(
                f"{rpath}.pluginRef",
                f"plugin {plugin!r} is not a filter, scorer or picker, so it cannot be "
                "part of a scheduling profile",
            )
        if weight is not None and slot != "scorer":
            raise ConfigError(
                f"{rpath}.weight", f"only scorers take a weight; {plugin!r} is a {slot}"
            )
        if slot == "picker":
            if picker is not None:
                raise ConfigError(
                    f"{rpath}.pluginRef",
                    f"profile {name!r} already has picker {picker!r}; a profile has one picker",
                )
            picker = plugin  # type: ignore[assignment]
        elif slot == "scorer":
            w = 1.0 if weight is None else weight
            if isinstance(w, bool) or not isinstance(w, (int, float)) or w < 0:
                raise ConfigError(f"{rpath}.weight", f"must be a number >= 0, got {weight!r}")
            scorers.append(WeightedScorer(plugin, float(w)))  # type: ignore[arg-type]
        else:
            filters.append(plugin)  # type: ignore[arg-type]
    if picker is None:
        picker = next((p for p in plugins.values() if isinstance(p, Picker)), None)
        if picker is None:
            spec = _builtin(registry, "max-score-picker")
            picker = spec.build("max-score-picker", spec.params(), handle)  # type: ignore[assignment]
            plugins.setdefault("max-score-picker", picker)  # type: ignore[arg-type]
    return SchedulerProfile(name, filters, scorers, picker)  # type: ignore[arg-type]


def _profile_handler(
    plugins: dict[str, Plugin],
    profiles: dict[str, SchedulerProfile],
    handle: Handle,
    registry: Registry,
) -> ProfileHandler:
    handlers = [p for p in plugins.values() if isinstance(p, ProfileHandler)]
    if len(handlers) > 1:
        raise ConfigError(
            "plugins",
            f"only one profile handler may be defined; found {', '.join(map(repr, handlers))}",
        )
    if not profiles:
        raise ConfigError("schedulingProfiles", "at least one scheduling profile is needed")
    if handlers:
        handler = handlers[0]
    else:
        if len(profiles) > 1:
            raise ConfigError(
                "plugins",
                f"{len(profiles)} scheduling profiles need a profile handler that runs several "
                "(e.g. disagg-profile-handler); single-profile-handler runs exactly one",
            )
        spec = _builtin(registry, "single-profile-handler")
        handler = spec.build("single-profile-handler", spec.params(), handle)  # type: ignore[assignment]
        plugins["single-profile-handler"] = handler  # type: ignore[assignment]
    if getattr(handler, "type_name", "") == "single-profile-handler" and len(profiles) != 1:
        raise ConfigError(
            "schedulingProfiles",
            f"single-profile-handler runs exactly one profile; {len(profiles)} are defined",
        )
    # A handler that refers to profiles or other plugins by name checks them now, at
    # start, rather than on the first request.
    validate = getattr(handler, "validate_profiles", None)
    if validate is not None:
        try:
            validate(profiles)
        except ValueError as e:
            index = list(plugins).index(handler.name) if handler.name in plugins else None
            path = f"plugins[{index}].parameters" if index is not None else "plugins"
            raise ConfigError(path, str(e)) from None
    return handler
