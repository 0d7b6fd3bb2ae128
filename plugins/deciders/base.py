"""What a P/D decider is, for the `disagg-profile-handler` that calls it.

A decider is an ordinary plugin (defined under `plugins:`, referenced by name) with one
method. It runs after the decode profile has picked, so it can ask what the chosen
decode endpoint already holds (llm-d passes the decode endpoint for the same reason).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from epp.datastore import EndpointSnapshot
from epp.request import InferenceRequest
from epp.scheduling.types import CycleState


@runtime_checkable
class PrefillDecider(Protocol):
    name: str
    type_name: str

    def disaggregate(
        self, state: CycleState, request: InferenceRequest, decode: EndpointSnapshot
    ) -> bool:
        """True: run the prefill profile and prefill remotely; False: decode-only."""
        ...
