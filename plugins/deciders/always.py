"""`always-disagg-pd-decider`: every request is prefilled remotely.

What the current llm-d P/D guide configures (`guides/pd-disaggregation`): with a
pool sized for P/D, splitting every request is simpler than a threshold, and the
handler still falls back to decode-only when no prefill endpoint is available.
"""

from __future__ import annotations

from epp.config.params import NoParams
from epp.datastore import EndpointSnapshot
from epp.request import InferenceRequest
from epp.scheduling.interfaces import Plugin
from epp.scheduling.registry import Handle, register
from epp.scheduling.types import CycleState


@register("always-disagg-pd-decider")
class AlwaysDisaggDecider(Plugin):
    def __init__(self, name: str, params: NoParams, handle: Handle) -> None:
        super().__init__(name)

    def disaggregate(
        self, state: CycleState, request: InferenceRequest, decode: EndpointSnapshot
    ) -> bool:
        return True
