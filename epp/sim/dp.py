"""Data-parallel ranks of one simulated server (vLLM's `--data-parallel-size` with one
API server): which rank runs a request, and one /metrics page for all ranks.

vLLM's API server reads `X-data-parallel-rank` (`OpenAIServing._get_data_parallel_rank`:
an int, anything else ignored) and runs the request on that rank; without it its DP
client (`DPLBAsyncMPClient.get_core_engine_for_request`) takes the rank with the lowest
`waiting * 4 + running`, scanning from a rotating start so empty ranks share the work.
A rank outside [0, N) is refused (vLLM raises on it; here a 400 names the range).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric

from epp.headers import DATA_PARALLEL_RANK
from epp.sim.engine import EngineSnapshot


class RankChoiceError(ValueError):
    """The header named a rank this server does not have."""


class RankChooser:
    def __init__(self, loads: Sequence[Callable[[], EngineSnapshot]]) -> None:
        self.loads = loads
        self._start = 0

    def choose(self, headers: dict[str, str] | object) -> int:
        n = len(self.loads)
        raw = headers.get(DATA_PARALLEL_RANK)  # type: ignore[attr-defined]
        if raw is not None:
            try:
                rank = int(raw)
            except ValueError:
                rank = None  # vLLM ignores a header that is not an int
            if rank is not None:
                if not 0 <= rank < n:
                    raise RankChoiceError(f"{DATA_PARALLEL_RANK}: {rank} is out of range [0, {n})")
                return rank
        if n == 1:
            return 0
        best, best_score = 0, None
        for i in range(n):
            idx = (self._start + i) % n
            snap = self.loads[idx]()
            score = snap.waiting * 4 + snap.running
            if best_score is None or score < best_score:
                best, best_score = idx, score
        self._start = (self._start + 1) % n
        return best


class _Merged:
    """One exposition of several ranks' registries: each family once, every rank's
    samples under it (as vLLM's one /metrics page lists every `engine` label)."""

    def __init__(self, registries: Sequence[CollectorRegistry]) -> None:
        self.registries = registries

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for registry in self.registries:
            for metric in registry.collect():
                seen = families.get(metric.name)
                if seen is None:
                    families[metric.name] = metric
                else:
                    seen.samples.extend(metric.samples)
        return iter(families.values())


def render_ranks(registries: Sequence[CollectorRegistry]) -> bytes:
    if len(registries) == 1:
        return generate_latest(registries[0])
    return generate_latest(_Merged(registries))  # type: ignore[arg-type]
