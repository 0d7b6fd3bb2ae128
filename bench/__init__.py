"""The benchmarks: one module per suite, each runnable as `epp bench NAME [its flags]`
(or `python bench/NAME.py`), listed by `epp bench --list`.

`SUITES` registers every suite once. All of them run from a source checkout (they read
config/, deploy/ and start this checkout's `epp`); `needs` says what else a suite wants
beyond `make .venv/.installed`. The modules not in `SUITES` are shared parts of the
routing suites (`routing_matrix`, `routing_trace`, `routing_vr`, `routing_real`), the SLO
suites' configs (`slo_configs`) and the minimal ext_proc server `overhead` compares with
(`minimal_extproc`). A suite that records a headline writes it with `bench.results`.
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

    @property
    def path(self) -> Path:
        return HERE / f"{self.module}.py"

    def summary(self) -> str:
        """The module docstring's first sentence, read without importing the module."""
        doc = ast.get_docstring(ast.parse(self.path.read_text(encoding="utf-8"))) or ""
        first = " ".join(doc.split("\n\n")[0].split()).split(". ")[0].rstrip(".")
        return first if len(first) <= 90 else first[:89].rsplit(" ", 1)[0] + " …"


SUITES: dict[str, Suite] = {
    "cold-start": Suite("cold_start"),
    "epp-replicas": Suite("epp_replicas"),
    "extproc-cpu": Suite("extproc_cpu"),
    "k8s-discovery": Suite("k8s_discovery"),
    "leader-failover": Suite("leader_failover"),
    "overhead": Suite("overhead", "py-spy for --py-spy"),
    "overload": Suite("overload"),
    "parse-offload": Suite("parse_offload"),
    "pd": Suite("pd"),
    "planner-ablation": Suite("planner_ablation", "a profile from `epp profile` and a trace"),
    "planner-fleet": Suite("planner_fleet", "the JSON files of `epp plan replay --compare`"),
    "planner-pick": Suite("planner_pick", "a profile from `epp profile` and a trace"),
    "planner-replay": Suite("planner_replay", "a trace (--trace)"),
    "planner-step": Suite("planner_step"),
    "predictor-accuracy": Suite("predictor_accuracy"),
    "predictors": Suite("predictors"),
    "prefix-index": Suite("prefix_index"),
    "profiler": Suite("profiler"),
    "prompt-render": Suite("prompt_render"),
    "request-cpu": Suite("request_cpu", "valgrind for --instructions"),
    "response-chunk": Suite("response_chunk"),
    "route-instructions": Suite("route_instructions", "valgrind (run by request-cpu)"),
    "routing": Suite(
        "routing",
        "vllm-router for the vr-* setups (--router); real vLLM for --real-vllm "
        "(make test-vllm's environment)",
    ),
    "routing-virtual": Suite("routing_virtual"),
    "scheduler": Suite("scheduler"),
    "scrape-cost": Suite("scrape_cost"),
    "scrape-cpu": Suite("scrape_cpu"),
    "sim-calibration": Suite("sim_calibration"),
    "slo-routing": Suite("slo_routing"),
    "slo-virtual": Suite("slo_virtual"),
}
