"""`token-load-scorer`: fewer in-flight tokens (prompt + expected output) scores higher.

Score = 1 − min(1, tokens / queueThresholdTokens); the default threshold 4,194,304 is
upstream's (128 requests × 32K tokens). In-flight tokens are counted by the EPP at pick
time, so a burst is seen before any scrape reports it.
"""

from __future__ import annotations

from dataclasses import dataclass

from epp.datastore import EndpointSnapshot
from epp.request import InferenceRequest
from epp.scheduling.interfaces import Plugin
from epp.scheduling.params import param
from epp.scheduling.registry import Handle, register
from epp.scheduling.types import CycleState


@dataclass(frozen=True)
class TokenLoadParams:
    queue_threshold_tokens: int = param(
        4_194_304, min=1, doc="in-flight tokens at which an endpoint scores 0"
    )


@register("token-load-scorer")
class TokenLoadScorer(Plugin):
    Params = TokenLoadParams

    def __init__(self, name: str, params: TokenLoadParams, handle: Handle) -> None:
        super().__init__(name)
        self.threshold = params.queue_threshold_tokens

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[EndpointSnapshot]
    ) -> list[float]:
        t = self.threshold
        return [1.0 - min(1.0, e.inflight_tokens / t) for e in endpoints]
