"""`single-profile-handler`: run the one configured profile; its pick is the answer."""

from __future__ import annotations

from epp.config.params import NoParams
from epp.errors import unavailable
from epp.request import InferenceRequest
from epp.scheduling.interfaces import Plugin
from epp.scheduling.profile import SchedulerProfile
from epp.scheduling.registry import Handle, register
from epp.scheduling.types import CycleState, ProfileResult, SchedulingResult


@register("single-profile-handler")
class SingleProfileHandler(Plugin):
    def __init__(self, name: str, params: NoParams, handle: Handle) -> None:
        super().__init__(name)

    def pick_profiles(
        self,
        state: CycleState,
        request: InferenceRequest,
        profiles: dict[str, SchedulerProfile],
        results: dict[str, ProfileResult | None],
    ) -> dict[str, SchedulerProfile]:
        return {} if results else profiles

    def process_results(
        self,
        state: CycleState,
        request: InferenceRequest,
        results: dict[str, ProfileResult | None],
    ) -> SchedulingResult:
        (name, result), *_ = results.items()
        if result is None:
            raise unavailable(f"profile '{name}' found no endpoint that can take this request")
        return SchedulingResult({name: result}, primary_profile=name)
