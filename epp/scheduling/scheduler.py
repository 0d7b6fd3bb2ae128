"""The scheduler: a profile handler chooses profiles, each runs, the handler merges."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from epp.datastore import EndpointSnapshot
from epp.errors import EppError, internal_error, plugin_failed, unavailable
from epp.observability import PLUGIN_DURATION, SCHEDULER_E2E
from epp.request import InferenceRequest
from epp.scheduling.interfaces import DataProducer, Preparer, ProfileHandler
from epp.scheduling.profile import SchedulerProfile
from epp.scheduling.types import CycleState, ProfileResult, SchedulingResult

T = TypeVar("T")

# A handler that keeps asking for profiles is a bug; stop it rather than spin.
_MAX_ROUNDS = 16


class Scheduler:
    def __init__(
        self,
        handler: ProfileHandler,
        profiles: dict[str, SchedulerProfile],
        producers: list[DataProducer] | None = None,
    ) -> None:
        self.handler = handler
        self.profiles = profiles
        self.producers = producers or []
        self._producer_timers = [
            PLUGIN_DURATION.labels(
                extension_point="PrepareData", plugin_type=p.type_name, plugin_name=p.name
            )
            for p in self.producers
        ]
        self.preparers = [p for p in self.producers if isinstance(p, Preparer) and p.prepares]

    def prepare(self, request: InferenceRequest) -> CycleState:
        """The cycle state with every producer's request-only work done (`Preparer`);
        may run in a worker thread. Raises EppError (a plugin's error: 500 naming it)."""
        state = CycleState()
        for p in self.preparers:
            try:
                p.prepare(state, request)
            except EppError:
                raise
            except Exception as e:
                raise plugin_failed(p, type(e).__name__) from e
        return state

    def schedule(
        self,
        request: InferenceRequest,
        candidates: list[EndpointSnapshot],
        state: CycleState | None = None,
    ) -> SchedulingResult:
        """Pick endpoints for `request`; raises EppError(503) when no profile finds one.
        `state`: the one `prepare` returned for this request, if it ran."""
        t0 = time.perf_counter()
        try:
            if not candidates:
                raise unavailable("no candidate endpoints for this request")
            if state is None:
                state = CycleState()
            self._produce(state, request, candidates)
            results: dict[str, ProfileResult | None] = {}
            for _ in range(_MAX_ROUNDS):
                to_run = self._handler_call(
                    self.handler.pick_profiles, state, request, self.profiles, results
                )
                if not to_run:
                    break
                for name, profile in to_run.items():
                    results[name] = profile.run(state, request, candidates)
            else:
                raise internal_error(f"profile handler {self.handler!r} never finished")
            result = self._handler_call(self.handler.process_results, state, request, results)
            result.cycle_state = state
            return result
        finally:
            SCHEDULER_E2E.observe(time.perf_counter() - t0)

    def _produce(
        self, state: CycleState, request: InferenceRequest, candidates: list[EndpointSnapshot]
    ) -> None:
        for producer, timer in zip(self.producers, self._producer_timers, strict=True):
            t = time.perf_counter()
            try:
                state.write(producer.produces, producer.produce(state, request, candidates))
            except EppError:
                raise
            except Exception as e:
                raise plugin_failed(producer, type(e).__name__) from e
            timer.observe(time.perf_counter() - t)

    def _handler_call(self, method: Callable[..., T], *args: object) -> T:
        try:
            return method(*args)
        except EppError:
            raise
        except Exception as e:
            raise plugin_failed(self.handler, type(e).__name__) from e
