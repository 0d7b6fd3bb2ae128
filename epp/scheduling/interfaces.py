"""The framework's only promise to plugins: these extension points.

A plugin instance is slotted into every extension point whose method it has, so one
class may be, say, both a scorer and a pre-request hook. Scorers return one score per
endpoint, in the order given, each in [0, 1]; the profile clamps, weights and sums.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from epp.datastore import EndpointSnapshot
from epp.request import InferenceRequest
from epp.scheduling.types import CycleState, ProfileResult, SchedulingResult, ScoredEndpoint

if TYPE_CHECKING:
    from epp.records import RequestRecord
    from epp.scheduling.profile import SchedulerProfile


class Plugin:
    """Base for every plugin: a registry `type` and an instance `name`.

    `producer_type` names the DataProducer type a consumer needs; the config loader
    creates one (with the consumer's parameters) when the config does not define it.
    """

    type_name: ClassVar[str] = ""
    producer_type: ClassVar[str | None] = None

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"{self.name}/{self.type_name}"


@runtime_checkable
class DataProducer(Protocol):
    """Computes per-request data before any profile runs (e.g. prefix matches per endpoint).

    `produce` returns its result and the scheduler writes it, once, into the CycleState
    under the key the class declares in `produces`; consumers (scorers, filters,
    deciders) read that key. The config loader refuses two producers of the same key (the
    second would silently replace the first). Producers run once per request, in config
    order; `state` holds the results of the producers before this one.
    """

    name: str
    type_name: str
    produces: ClassVar[str]

    def produce(
        self, state: CycleState, request: InferenceRequest, endpoints: list[EndpointSnapshot]
    ) -> Any: ...


@runtime_checkable
class Preparer(Protocol):
    """A producer's request-only work (no endpoints, no pool state), e.g. tokenizing the
    prompt: `prepare` fills `state` (the cycle's CycleState, created before scheduling)
    and may run in a worker thread, so it must touch nothing shared but thread-safe,
    read-only parts (a tokenizer). For a large request the ext_proc side runs it off the
    event loop (`epp/extproc/stream.py`, PREPARE_OFF_LOOP_BYTES); `produce` then finds
    its result in `state`. Small requests skip it: `produce` computes the same inline.
    `prepares` says whether this instance has such work (a producer without a tokenizer
    has none).
    """

    @property
    def prepares(self) -> bool: ...

    def prepare(self, state: CycleState, request: InferenceRequest) -> None: ...


@runtime_checkable
class Filter(Protocol):
    name: str
    type_name: str

    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: list[EndpointSnapshot]
    ) -> list[EndpointSnapshot]: ...


@runtime_checkable
class Scorer(Protocol):
    name: str
    type_name: str

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[EndpointSnapshot]
    ) -> Sequence[float]: ...


@runtime_checkable
class Picker(Protocol):
    name: str
    type_name: str

    def pick(
        self, state: CycleState, request: InferenceRequest, scored: Sequence[ScoredEndpoint]
    ) -> ProfileResult:
        """`scored` is a `ScoredEndpoints` when a profile calls (its `scores` list is the
        fast way to the numbers), any sequence of `ScoredEndpoint` otherwise."""
        ...


@runtime_checkable
class ProfileHandler(Protocol):
    name: str
    type_name: str

    def pick_profiles(
        self,
        state: CycleState,
        request: InferenceRequest,
        profiles: dict[str, SchedulerProfile],
        results: dict[str, ProfileResult | None],
    ) -> dict[str, SchedulerProfile]:
        """Profiles to run next; called until it returns none."""
        ...

    def process_results(
        self,
        state: CycleState,
        request: InferenceRequest,
        results: dict[str, ProfileResult | None],
    ) -> SchedulingResult: ...


@runtime_checkable
class Admitter(Protocol):
    """Decides, after the data producers ran and before any profile, whether the request
    is admitted at all (upstream's request-control `Admit` extension point). Returns why
    it is refused, or None to admit; a refusal is a 429 `rejected-saturated`."""

    name: str
    type_name: str

    def admit(
        self, state: CycleState, request: InferenceRequest, endpoints: list[EndpointSnapshot]
    ) -> str | None: ...


@runtime_checkable
class PreRequest(Protocol):
    name: str
    type_name: str

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None: ...


@runtime_checkable
class Lifecycle(Protocol):
    """A plugin with background work (e.g. a KV-event subscriber) starts and stops with
    the server, inside its event loop."""

    name: str

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


@runtime_checkable
class PostResponse(Protocol):
    """Called once per routed request when its response ended (or the stream did):
    `response` is what the response path measured (status, TTFT, ITL, usage),
    `endpoint` the primary pick as routing saw it. Needs a response path (`epp serve
    --response-path log`, the default, or on)."""

    name: str
    type_name: str

    def post_response(
        self, request: InferenceRequest, response: RequestRecord, endpoint: EndpointSnapshot
    ) -> None: ...
