"""The field's laws by name, built for one comparison (`epp plan replay`).

Every law gets what the comparison fixes for all policies: the SLA (llm-d's `S_ttft` /
`S_tpot`; the oracle's target), and as its `maxReplicaCount` the planners' GPU budget
in whole replicas (KEDA's default of 100 when there is none), so no law can use more
GPUs than `epp` may. Everything else is the law's published default.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from epp.planner.core.types import Policy
from epp.planner.offline.laws.keda_queue import KedaQueue, KedaQueueParams
from epp.planner.offline.laws.llmd_slo import LlmdSlo, LlmdSloParams
from epp.planner.offline.laws.oracle import DEFAULT_TARGET, Oracle, OracleTarget, oracle_sizes
from epp.planner.offline.outcome import Sla
from epp.planner.offline.pool import PoolShape
from epp.planner.offline.replay import Arrival
from epp.planner.offline.static import Sizer

LAW_NAMES = ("oracle", "keda-queue", "llm-d-slo")
KEDA_MAX_REPLICAS = 100  # KEDA's default maxReplicaCount


def max_replicas(budget_gpus: int | None, shape: PoolShape) -> int:
    if budget_gpus is None:
        return KEDA_MAX_REPLICAS
    return max(1, budget_gpus // shape.gpus_per_replica)


def law_factories(
    names: Sequence[str],
    arrivals: Sequence[Arrival],
    *,
    sla: Sla,
    interval_s: float,
    shape: PoolShape,
    budget_gpus: int | None,
    sizer: Sizer,
    oracle_target: OracleTarget = DEFAULT_TARGET,
    progress: Callable[[str], Callable[[float, float], None] | None] | None = None,
) -> dict[str, Callable[[], Policy]]:
    """name -> a fresh policy (policies keep state between steps). The oracle's sizes
    are measured once, on its first build, at `oracle_target` (`laws/oracle.py`);
    `progress("oracle sizing")` hears of each interval sized."""
    top = max_replicas(budget_gpus, shape)
    out: dict[str, Callable[[], Policy]] = {}
    for name in names:
        if name == "keda-queue":
            out[name] = lambda: KedaQueue(KedaQueueParams(max_replicas=top))
        elif name == "llm-d-slo":
            params = LlmdSloParams(
                ttft_slo_ms=sla.ttft_ms, tpot_slo_ms=sla.itl_ms, max_replicas=top
            )
            out[name] = lambda params=params: LlmdSlo(params)
        elif name == "oracle":
            sizes: list[int] = []

            def oracle(sizes: list[int] = sizes) -> Policy:
                if not sizes:
                    hook = progress("oracle sizing") if progress else None
                    sizes.extend(
                        oracle_sizes(
                            sizer, sla, arrivals, interval_s, target=oracle_target, progress=hook
                        )
                    )
                return Oracle(sizes, interval_s)

            out[name] = oracle
        else:
            raise ValueError(f"unknown law {name!r}; choose one of {', '.join(LAW_NAMES)}")
    return out
