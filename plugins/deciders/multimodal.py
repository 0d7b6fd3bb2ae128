"""`always-disagg-multimodal-decider`: send a request's media to an encode endpoint first
whenever it has any.

llm-d-router's rule (`profilehandler/disagg/always_disagg_mm_decider.go`): a request with
at least one media item (an image, audio or video part; an Anthropic `image` block) runs
the encode profile; a text-only request never does. The media items are the ones the
parser already found for the prefix identity (`epp.media`), so the decision costs one
attribute read and text-only requests pay nothing for it.
"""

from __future__ import annotations

from epp.config.params import NoParams
from epp.datastore import EndpointSnapshot
from epp.request import InferenceRequest
from epp.scheduling.interfaces import Plugin
from epp.scheduling.registry import Handle, register
from epp.scheduling.types import CycleState


@register("always-disagg-multimodal-decider")
class AlwaysDisaggMultimodalDecider(Plugin):
    def __init__(self, name: str, params: NoParams, handle: Handle) -> None:
        super().__init__(name)

    def disaggregate(
        self, state: CycleState, request: InferenceRequest, decode: EndpointSnapshot
    ) -> bool:
        return bool(request.media)
