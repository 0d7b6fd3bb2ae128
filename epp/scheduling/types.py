"""Data that flows through one scheduling cycle."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, overload

from epp.datastore import EndpointSnapshot


class CycleState:
    """Scratch space shared by the plugins of one scheduling cycle, and nothing else.

    It is created per request and dropped with it, so nothing here can leak across
    requests. Keys are plugin-chosen strings (use the plugin's name to avoid clashes).
    """

    __slots__ = ("_data",)

    def __init__(self) -> None:
        self._data: dict[str, Any] = {}

    def write(self, key: str, value: Any) -> None:
        self._data[key] = value

    def read(self, key: str, default: Any = None) -> Any:
        return self._data.get(key, default)

    def __contains__(self, key: str) -> bool:
        return key in self._data


# The key prefix producers write their match under (plugins/prefix/match_info.py). The
# framework reads one thing from it, through `CachedPrompt`: how many prompt tokens the
# picked endpoint will serve from its cache, so in-flight prefill work counts only the
# uncached part (llm-d subtracts it the same way).
PREFIX_MATCH_KEY = "prefix-match"


class CachedPrompt(Protocol):
    def cached_tokens(self, endpoint_name: str) -> int: ...


@dataclass(slots=True)
class ScoredEndpoint:
    endpoint: EndpointSnapshot
    score: float


class ScoredEndpoints(Sequence[ScoredEndpoint]):
    """What a profile hands its picker: endpoints and their total scores as two parallel
    lists, seen as a sequence of `ScoredEndpoint` (made on access).

    Why not a list of `ScoredEndpoint`: at 1,000 endpoints building one object per
    endpoint per request cost more than the whole max-score pick. A picker that only
    needs the numbers reads `scores` (and `endpoints`) directly; any other picker
    iterates or indexes as before.
    """

    __slots__ = ("endpoints", "scores")

    def __init__(self, endpoints: list[EndpointSnapshot], scores: list[float]) -> None:
        if len(endpoints) != len(scores):
            raise ValueError(f"{len(endpoints)} endpoints but {len(scores)} scores")
        self.endpoints = endpoints
        self.scores = scores

    def __len__(self) -> int:
        return len(self.endpoints)

    @overload
    def __getitem__(self, i: int) -> ScoredEndpoint: ...

    @overload
    def __getitem__(self, i: slice) -> list[ScoredEndpoint]: ...

    def __getitem__(self, i: int | slice) -> ScoredEndpoint | list[ScoredEndpoint]:
        if isinstance(i, slice):
            return list(map(ScoredEndpoint, self.endpoints[i], self.scores[i]))
        return ScoredEndpoint(self.endpoints[i], self.scores[i])

    def __iter__(self) -> Iterator[ScoredEndpoint]:
        return map(ScoredEndpoint, self.endpoints, self.scores)


@dataclass(slots=True)
class ProfileResult:
    """A profile's pick: targets best first; the first is primary, the rest fallbacks."""

    targets: list[EndpointSnapshot]


@dataclass(slots=True)
class SchedulingResult:
    """Results per profile that ran (None if it found no endpoint) and which is primary."""

    profile_results: dict[str, ProfileResult | None]
    primary_profile: str
    headers: dict[str, str] = field(default_factory=dict)
    # The cycle's scratch space, so pre-request hooks see what producers computed.
    cycle_state: CycleState = field(default_factory=CycleState)

    @property
    def primary(self) -> ProfileResult:
        result = self.profile_results[self.primary_profile]
        assert result is not None
        return result

    @property
    def targets(self) -> list[EndpointSnapshot]:
        return self.primary.targets
