"""The composition root's one job: fill the plugin registry before a config is loaded.

The framework (`epp.scheduling`, `epp.config`) knows no plugin; the programs that run
configs (`epp serve`, `epp plugins`, the benchmarks, the tests) call `install_plugins()`,
which registers the built-ins (`plugins.BUILTIN_MODULES`) and every plugin published
under the `epp.plugins` entry-point group, the way GIE's `cmd/epp/runner/runner.go`
registers its plugins explicitly. An out-of-tree package declares, in its pyproject:

    [project.entry-points."epp.plugins"]
    my-plugins = "my_package.plugins"      # a module: all its @register classes

Safe to call again; a failed import leaves the registry as it was, so a retry works.
"""

from __future__ import annotations

import plugins
from epp.scheduling.registry import PLUGIN_TYPES, Registry


def install_plugins(registry: Registry = PLUGIN_TYPES) -> Registry:
    plugins.register_builtins(registry)
    registry.add_entry_points()
    return registry
