"""The scheduler: a profile handler chooses profiles, each runs, the handler merges."""

from __future__ import annotations

import time

from epp.datastore import EndpointSnapshot
from epp.errors import SATURATED, EppError, internal_error, plugin_failed, unavailable
from epp.observability import SCHEDULER_E2E, UNTIMED, plugin_timer
from epp.request import InferenceRequest
from epp.scheduling.interfaces import Admitter, DataProducer, Preparer, ProfileHandler
from epp.scheduling.profile import SchedulerProfile
from epp.scheduling.types import CycleState, ProfileResult, SchedulingResult

_perf = time.perf_counter

# A handler that keeps asking for profiles is a bug; stop it rather than spin.
_MAX_ROUNDS = 16


class Scheduler:
    def __init__(
        self,
        handler: ProfileHandler,
        profiles: dict[str, SchedulerProfile],
        producers: list[DataProducer] | None = None,
        admitters: list[Admitter] | None = None,
    ) -> None:
        self.handler = handler
        self.profiles = profiles
        self.producers = producers or []
        self._producer_timers = [plugin_timer("PrepareData", p) for p in self.producers]
        self.admitters = admitters or []
        self._admit_timers = [plugin_timer("Admission", p) for p in self.admitters]
        # GIE scheduler.go times the handler's two calls under these extension points.
        self._pick_timer = plugin_timer("ProfilePicker", handler)
        self._results_timer = plugin_timer("ProcessProfilesResults", handler)
        self.preparers = [p for p in self.producers if isinstance(p, Preparer) and p.prepares]

    def stop_timing(self) -> None:
        """Record no plugin durations from here on (every profile's too): for a caller
        that reads none, such as the planner's replay, which schedules a day of requests
        in virtual time, where wall-clock plugin timings would mean nothing."""
        self._producer_timers = [UNTIMED] * len(self.producers)
        self._admit_timers = [UNTIMED] * len(self.admitters)
        self._pick_timer = self._results_timer = UNTIMED
        for profile in self.profiles.values():
            profile.stop_timing()

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
        t0 = _perf()
        try:
            if not candidates:
                raise unavailable("no candidate endpoints for this request")
            if state is None:
                state = CycleState()
            self._produce(state, request, candidates)
            if self.admitters:
                self._admit(state, request, candidates)
            results: dict[str, ProfileResult | None] = {}
            handler, profiles = self.handler, self.profiles
            for _ in range(_MAX_ROUNDS):
                t = _perf()
                try:
                    to_run = handler.pick_profiles(state, request, profiles, results)
                except EppError:
                    raise
                except Exception as e:
                    raise plugin_failed(handler, type(e).__name__) from e
                self._pick_timer.observe(_perf() - t)
                if not to_run:
                    break
                for name, profile in to_run.items():
                    results[name] = profile.run(state, request, candidates)
            else:
                raise internal_error(f"profile handler {self.handler!r} never finished")
            t = _perf()
            try:
                result = handler.process_results(state, request, results)
            except EppError:
                raise
            except Exception as e:
                raise plugin_failed(handler, type(e).__name__) from e
            self._results_timer.observe(_perf() - t)
            result.cycle_state = state
            return result
        finally:
            SCHEDULER_E2E.observe(_perf() - t0)

    def _admit(
        self, state: CycleState, request: InferenceRequest, candidates: list[EndpointSnapshot]
    ) -> None:
        """Each admitter in turn; the first refusal ends the request with a 429 (upstream
        answers an `Admit` refusal with a 500, "Internal", which tells a client neither
        that the pool is busy nor that a retry may succeed)."""
        for admitter, timer in zip(self.admitters, self._admit_timers, strict=True):
            t = _perf()
            try:
                why = admitter.admit(state, request, candidates)
            except EppError:
                raise
            except Exception as e:
                raise plugin_failed(admitter, type(e).__name__) from e
            timer.observe(_perf() - t)
            if why is not None:
                raise EppError(
                    429, f"not admitted by {admitter!r}: {why}; retry later", "too_many_requests",
                    reason=SATURATED,
                )  # fmt: skip

    def _produce(
        self, state: CycleState, request: InferenceRequest, candidates: list[EndpointSnapshot]
    ) -> None:
        for producer, timer in zip(self.producers, self._producer_timers, strict=True):
            t = _perf()
            try:
                state.write(producer.produces, producer.produce(state, request, candidates))
            except EppError:
                raise
            except Exception as e:
                raise plugin_failed(producer, type(e).__name__) from e
            timer.observe(_perf() - t)
