"""Every built-in plugin, one folder per kind, and the one list that registers them.

Adding a plugin: mark its class with `@register("my-type")` and, if it lives in a new
module, add the module to `BUILTIN_MODULES`. tests/unit/test_registry.py fails if a
module under plugins/ defines a registered class and is missing here. Importing this
package imports no plugin; `register_builtins` does, for the composition root.
Find a plugin by its YAML type: `grep -rn 'register("TYPE"' plugins/`.
"""

from __future__ import annotations

from epp.scheduling.registry import Registry

BUILTIN_MODULES: tuple[str, ...] = (
    "plugins.admission.detectors",
    "plugins.datalayer.sources",
    "plugins.deciders.always",
    "plugins.deciders.multimodal",
    "plugins.deciders.prefix_based",
    "plugins.filters.label_selector",
    "plugins.flowcontrol.policies",
    "plugins.filters.prefix_affinity",
    "plugins.filters.roles",
    "plugins.latency.admitter",
    "plugins.latency.calibrated",
    "plugins.latency.externality",
    "plugins.latency.producer",
    "plugins.latency.scorer",
    "plugins.latency.slack",
    "plugins.latency.tier_filter",
    "plugins.latency.tiers",
    "plugins.pickers.dp_rank",
    "plugins.pickers.max_score",
    "plugins.pickers.random_picker",
    "plugins.pickers.round_robin",
    "plugins.pickers.weighted_random",
    "plugins.prefix.approx_producer",
    "plugins.prefix.precise_producer",
    "plugins.prefix.precise_scorer",
    "plugins.prefix.prefix_scorer",
    "plugins.profile_handlers.disagg",
    "plugins.profile_handlers.single",
    "plugins.scorers.kv_cache",
    "plugins.scorers.lora_affinity",
    "plugins.scorers.no_hit_lru",
    "plugins.scorers.queue_depth",
    "plugins.scorers.running_requests",
    "plugins.scorers.encoder_cache",
    "plugins.scorers.session_affinity",
    "plugins.scorers.token_load",
)


def register_builtins(registry: Registry) -> None:
    """Add every built-in plugin type to `registry` (all or nothing; safe to repeat)."""
    registry.add_modules(BUILTIN_MODULES)
