"""The benchmarks: one module per suite, each runnable as `epp bench NAME [its flags]`
(or `python -m bench.NAME`), listed by `epp bench --list`.

`SUITES` registers every suite once. The package ships with `epp`, so a suite that needs
nothing but the code runs from an install; `checkout` names what else a suite reads from
a source checkout (config/, deploy/envoy/ through the local-stack harness, tests/ fakes,
the traces in ../shared beside it) and `needs` what it wants beyond `make .venv/.installed`.
The modules not in `SUITES` are parts of suites: the routing suites' setups and scenarios
(`routing_matrix`, `routing_trace`, `routing_vr`, `routing_real`, `routing_agent`), the SLO
suites' configs (`slo_configs`), the minimal ext_proc server `overhead` compares with
(`minimal_extproc`) and the one result schema (`results`): a suite that records a headline
writes it with `bench.results`.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Suite:
    module: str  # bench/<module>.py
    needs: str = ""  # beyond the dev venv; "" = nothing
    checkout: str = ""  # what it reads from a source checkout; "" = runs from an install

    @property
    def path(self) -> Path:
        return HERE / f"{self.module}.py"

    def summary(self) -> str:
        """The module docstring's first sentence, read without importing the module."""
        doc = ast.get_docstring(ast.parse(self.path.read_text(encoding="utf-8"))) or ""
        first = " ".join(doc.split("\n\n")[0].split()).split(". ")[0].rstrip(".")
        return first if len(first) <= 90 else first[:89].rsplit(" ", 1)[0] + " …"


ENVOY = "deploy/envoy/"
TRACES = "../shared/traces"
SUITES: dict[str, Suite] = {
    "agent-routing": Suite("agent_routing", checkout="config/"),
    "body-flood": Suite("body_flood", checkout=ENVOY),
    "cold-start": Suite("cold_start", checkout=ENVOY),
    "epp-replicas": Suite("epp_replicas", checkout=ENVOY),
    "extproc-cpu": Suite("extproc_cpu", checkout=ENVOY),
    "k8s-discovery": Suite("k8s_discovery", checkout="tests/ (the fake API server)"),
    "leader-failover": Suite("leader_failover", checkout="tests/ (the fake API server)"),
    "multimodal-prefix": Suite("multimodal_prefix"),
    "overhead": Suite("overhead", "py-spy for --py-spy", ENVOY),
    "overload": Suite("overload", checkout=f"config/, {ENVOY}"),
    "parse-offload": Suite("parse_offload"),
    "pd": Suite("pd", checkout=f"config/, {ENVOY}"),
    "planner-ablation": Suite("planner_ablation", "a profile from `epp profile` and a trace"),
    "planner-fleet": Suite("planner_fleet", "the JSON files of `epp plan replay --compare`"),
    "planner-pick": Suite(
        "planner_pick", "a profile from `epp profile` and a trace", f"{TRACES} (default trace)"
    ),
    "planner-frontier": Suite(
        "planner_frontier", "the --json files of `epp plan replay --compare --sweep`"
    ),
    "planner-heldout": Suite("planner_heldout", checkout=f"{TRACES}/servegen"),
    "planner-heldout-field": Suite("planner_heldout_field", checkout=f"{TRACES}/servegen"),
    "planner-replay": Suite("planner_replay", "a trace (--trace)"),
    "planner-step": Suite("planner_step", checkout=TRACES),
    "predictor-accuracy": Suite("predictor_accuracy"),
    "predictors": Suite("predictors", checkout=TRACES),
    "prefix-index": Suite("prefix_index"),
    "profiler": Suite("profiler"),
    "prompt-render": Suite("prompt_render"),
    "request-cpu": Suite("request_cpu", "valgrind for --instructions", "config/"),
    "response-chunk": Suite("response_chunk"),
    "response-log": Suite("response_log", checkout=ENVOY),
    "rewrite-split": Suite("rewrite_split", checkout=ENVOY),
    "route-instructions": Suite(
        "route_instructions", "valgrind (run by request-cpu)", "the checkout it measures (TREE)"
    ),
    "routing": Suite(
        "routing",
        "vllm-router for the vr-* setups (--router); real vLLM for --real-vllm "
        "(make test-vllm's environment)",
        f"config/, {ENVOY}, {TRACES} (trace scenarios)",
    ),
    "routing-virtual": Suite("routing_virtual", checkout="config/"),
    "scheduler": Suite("scheduler"),
    "scrape-cost": Suite("scrape_cost"),
    "scrape-cpu": Suite("scrape_cpu"),
    "sim-calibration": Suite("sim_calibration"),
    "slo-family": Suite("slo_family", checkout="config/"),
    "slo-results": Suite("slo_results"),
    "slo-routing": Suite("slo_routing", checkout=f"config/, {ENVOY}"),
    "slo-virtual": Suite("slo_virtual", checkout="config/"),
}
