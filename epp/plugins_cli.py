"""`epp plugins`: every plugin type, its upstream aliases and parameters with defaults."""

from __future__ import annotations

import argparse
import sys

from epp.composition import install_plugins
from epp.config.params import describe
from epp.scheduling.registry import NOT_YET_IMPLEMENTED, PluginImportError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("type", nargs="?", help="show only this plugin type (or alias)")


def render(type_name: str | None = None) -> str:
    registry = install_plugins()
    specs = registry.all_specs()
    if type_name:
        spec = registry.lookup(type_name)
        if spec is None:
            planned = NOT_YET_IMPLEMENTED.get(type_name)
            if planned:
                return f"{type_name}: known upstream plugin, not implemented yet ({planned})"
            return f"{type_name}: unknown plugin type"
        specs = [spec]
    lines = []
    for spec in specs:
        alias = f"  (upstream: {', '.join(spec.aliases)})" if spec.aliases else ""
        doc = (spec.cls.__module__ or "").replace(".", "/") + ".py"
        lines.append(f"{spec.type_name}{alias}  [{doc}]")
        for name, typ, default, help_text in describe(spec.params):
            lines.append(f"    {name}: {typ} = {default!r}  {help_text}".rstrip())
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        print(render(args.type))
    except PluginImportError as e:
        print(f"epp plugins: {e}", file=sys.stderr)
        return 2
    return 0
