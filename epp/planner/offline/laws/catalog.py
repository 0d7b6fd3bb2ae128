"""The field's laws by name, built for one comparison (`epp plan replay`).

Every law gets what the comparison fixes for all policies: the SLA (llm-d's `S_ttft` /
`S_tpot`; the oracle's target), and as its `maxReplicaCount` the planners' GPU budget
in whole replicas (KEDA's default of 100 when there is none), so no law can use more
GPUs than `epp` may. Everything else is the set-up the law's own documentation
prescribes:

- `llm-d-slo` (llm-d `guides/workload-autoscaling/README.slo-aware.md`): the band
  θ_up 0.55 / θ_dn 0.40 ("under healthy load the signal sits around 0.2-0.45 of the
  SLO"; the guide raises the band only "if your SLO is close to your base latency",
  which the product SLA is not: the preset's unloaded ITL is a fifth of 50 ms),
  `minReplicaCount` 3 as its benchmark sets it (bounds 3-8), at most the budget;
- `keda-queue` (vLLM production-stack `autoscaling-keda.rst`): 5 waiting requests per
  replica.

`SWEEPS` holds each law's main knob for `--compare --sweep` (`sweep.py`): llm-d-slo's
band (its width, 0.15, kept) and keda-queue's per-replica target (the recipe's 5 and
lower).
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
LLMD_MIN_REPLICAS = 3  # the slo-aware guide's benchmark: bounds 3-8
LLMD_BAND = (0.55, 0.40)  # the guide's theta_up / theta_dn
KEDA_TARGET = 5.0  # the production-stack recipe's threshold

# The main knob of each law, swept by `--compare --sweep`: (label, value) pairs, the
# documented set-up first.
LLMD_BANDS = ((0.55, 0.40), (0.40, 0.25), (0.70, 0.55), (0.85, 0.70), (1.00, 0.85), (1.3, 1.15))
KEDA_TARGETS = (5.0, 3.0, 2.0, 1.0, 0.5)


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
            out[name] = keda_queue(top)
        elif name == "llm-d-slo":
            out[name] = llmd_slo(sla, top)
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


def keda_queue(top: int, target: float = KEDA_TARGET) -> Callable[[], Policy]:
    params = KedaQueueParams(target=target, max_replicas=top)
    return lambda: KedaQueue(params)


def llmd_slo(sla: Sla, top: int, band: tuple[float, float] = LLMD_BAND) -> Callable[[], Policy]:
    """The guide's set-up: its band, min 3 replicas (no more than `top`), max `top`."""
    theta_up, theta_down = band
    params = LlmdSloParams(
        ttft_slo_ms=sla.ttft_ms,
        tpot_slo_ms=sla.itl_ms,
        theta_up=theta_up,
        theta_down=theta_down,
        clamp=max(2.0, 2 * theta_up),  # the guide: C "must exceed theta_up"
        min_replicas=min(LLMD_MIN_REPLICAS, top),
        max_replicas=top,
    )
    return lambda: LlmdSlo(params)


def law_sweeps(
    names: Sequence[str], *, sla: Sla, shape: PoolShape, budget_gpus: int | None
) -> dict[str, list[tuple[str, Callable[[], Policy]]]]:
    """name -> [(setting, fresh policy)] over its main knob, the documented one first."""
    top = max_replicas(budget_gpus, shape)
    out: dict[str, list[tuple[str, Callable[[], Policy]]]] = {}
    if "llm-d-slo" in names:
        out["llm-d-slo"] = [
            (f"band {u:g}/{d:g}", llmd_slo(sla, top, (u, d))) for u, d in LLMD_BANDS
        ]
    if "keda-queue" in names:
        out["keda-queue"] = [(f"target {t:g}", keda_queue(top, t)) for t in KEDA_TARGETS]
    return out
