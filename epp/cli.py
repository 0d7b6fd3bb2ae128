"""The `epp` command: serve, sim, demo, bench, profile, plan, plugins, sidecar.

Each subcommand's flags and logic live in its own module (`add_arguments`, `run`);
this file only wires them, so `epp --help` stays the one index of what the tool does.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module, one-line help). Modules are imported lazily so `epp sim` never
# loads the EPP and `epp serve` never loads the simulator.
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("epp.serve", "run the endpoint picker (Envoy ext_proc gRPC server)"),
    "sim": ("epp.sim.cli", "run vLLM-compatible model-server simulators"),
    "demo": (
        "epp.harness.demo",
        "start simulators, the EPP and Envoy, send traffic, print a table",
    ),
    "plugins": ("epp.plugins_cli", "list plugin types, their aliases and parameters"),
    "sidecar": ("epp.sidecar.cli", "P/D sidecar of a decode server: remote prefill, then decode"),
    "profile": (
        "epp.planner.profiler.cli",
        "measure OpenAI endpoints for the planner: TTFT/ITL sweeps, NPZ data, recommendation",
    ),
    "bench": ("epp.harness.bench_cli", "run a benchmark suite of bench/ (epp bench --list)"),
    "plan": ("epp.planner.plan_cli", "planner what-ifs: replay a trace through scaling policies"),
    "planner": (
        "epp.planner.live.standalone",
        "the planner alone: observe through Prometheus, act through a virtual/kubernetes connector",
    ),
    "planner-client": (
        "epp.planner.live.connectors.reference_client",
        "reference environment for a virtual planner: carry decisions out with epp sim",
    ),
}


def build_parser(argv: list[str]) -> tuple[argparse.ArgumentParser, object]:
    parser = argparse.ArgumentParser(prog="epp", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chosen = argv[0] if argv and argv[0] in COMMANDS else None
    module = None
    for name, (mod_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            module = importlib.import_module(mod_name)
            module.add_arguments(p)
    return parser, module


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, module = build_parser(argv)
    args = parser.parse_args(argv)
    assert module is not None
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
