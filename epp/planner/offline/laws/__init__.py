"""The field's autoscaling laws, replayed beside this planner.

Each is a `types.Policy` with its published defaults, pure like every planner module:

- `hpa.py`: the Kubernetes HorizontalPodAutoscaler's arithmetic both KEDA laws end in
  (the replica calculator's 10 % tolerance, stabilization windows, rate policies);
- `keda_queue.py`: `keda-queue`, the vLLM production-stack recipe (KEDA on
  `vllm:num_requests_waiting`, target 5 per replica);
- `llmd_slo.py`: `llm-d-slo`, llm-d's SLO-aware KEDA control law on p90 TTFT/TPOT;
- `oracle.py`: `oracle`, perfect foresight and instant start: the floor, not deployable;
- `catalog.py`: the names and how `epp plan replay` builds each from a comparison's setup.

They live apart from `load_mode` / `sla_mode` / `faithful` because they are not modes of
this planner: they do not go through `planner.Planner` (its budget fit, floors and
drain choice), since each law brings its own bounds (HPA min/max replicas) and the
comparison must show what the law itself does, not what this planner's wrapper would.
"""
