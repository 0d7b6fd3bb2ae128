"""`prefix-based-pd-decider`: prefill remotely only when much of the prompt is not cached
on the chosen decode endpoint.

llm-d's rule (`prefix_based_pd_decider.go`), kept exactly:

    nonCachedTokens == 0                     → decode-only (P/D disabled; llm-d's default)
    promptTokens > 0 and L < promptTokens    → decode-only (llm-d router #933 gate)
    L < nonCachedTokens                      → decode-only
    no prefix match info                     → decode-only (logged)
    L − cached(decode) >= nonCachedTokens    → remote prefill

L is the prompt length in tokens (estimated as characters / 4, as llm-d did before it
had a tokenizer); `cached` is the *unweighted* count of leading blocks the decode endpoint
holds × block size: a tier-weighted count undercounts CPU-tier hits and sent cached
prompts to a remote prefill (llm-d#1466). Prefilling a mostly cached prompt remotely
would move KV that the decode server already has.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from epp.config.params import param
from epp.datastore import EndpointSnapshot
from epp.request import InferenceRequest
from epp.scheduling.interfaces import Plugin
from epp.scheduling.registry import Handle, register
from epp.scheduling.types import CycleState
from plugins.prefix.match_info import PREFIX_MATCH_KEY, PrefixMatchInfo

log = logging.getLogger("epp.plugins.deciders")


@dataclass(frozen=True)
class PrefixBasedDeciderParams:
    non_cached_tokens: int = param(
        0,
        min=0,
        doc="remote prefill when this many prompt tokens are not cached on the decode "
        "endpoint; 0 disables P/D (llm-d's default)",
    )
    prompt_tokens: int = param(
        0, min=0, doc="prompts shorter than this stay decode-only; 0: no such gate"
    )


@register("prefix-based-pd-decider")
class PrefixBasedDecider(Plugin):
    Params = PrefixBasedDeciderParams

    def __init__(self, name: str, params: PrefixBasedDeciderParams, handle: Handle) -> None:
        super().__init__(name)
        self.params = params
        self._warned = False

    def disaggregate(
        self, state: CycleState, request: InferenceRequest, decode: EndpointSnapshot
    ) -> bool:
        threshold = self.params.non_cached_tokens
        if threshold == 0:
            return False
        tokens = request.prompt_tokens_estimate
        if self.params.prompt_tokens > 0 and tokens < self.params.prompt_tokens:
            return False
        if tokens < threshold:
            return False
        info = state.read(PREFIX_MATCH_KEY)
        if not isinstance(info, PrefixMatchInfo):
            self._missing_match_info(request)
            return False
        return tokens - info.cached_tokens(decode.name) >= threshold

    def _missing_match_info(self, request: InferenceRequest) -> None:
        # Once loudly (a config without a prefix producer), then quietly per request.
        level = logging.DEBUG if self._warned else logging.WARNING
        self._warned = True
        log.log(
            level,
            "%r: no prefix match info in the cycle state (is a prefix producer configured, "
            "e.g. prefix-scorer?); request %s stays decode-only",
            self,
            request.request_id,
        )
