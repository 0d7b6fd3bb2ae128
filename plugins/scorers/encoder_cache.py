"""`encoder-cache-affinity-scorer`: send a media item back to the encoder that encoded it.

An encode server keeps the embeddings it computed in its encoder cache, keyed by the
item's hash (vLLM's `EncoderCacheManager`, keyed by `mm_hash`), so the same image sent
to the same encoder again is not encoded again. The EPP remembers, per media item
(`epp.media`: the digest of its inline bytes, or of its URL), the encode endpoint the
last request carrying it was sent to, learned at pre-request from the first target of
the encode profile. A candidate's score is the share of the request's media items last
encoded there: 1.0 when it encoded all of them, 0.0 when none (and for every candidate
on a request without media, which then abstains).

Memory is bounded (`maxItems`, least recently used dropped first). The EPP does not see
the servers' evictions, so a remembered item may be gone: a miss costs one encode, as
without the scorer. Weigh it beside a load scorer, so a hot image does not pin a busy
encoder.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from epp.config.params import param
from epp.datastore import EndpointSnapshot
from epp.request import InferenceRequest
from epp.scheduling.interfaces import Plugin
from epp.scheduling.registry import Handle, register
from epp.scheduling.types import CycleState, SchedulingResult


@dataclass(frozen=True)
class EncoderCacheAffinityParams:
    max_items: int = param(
        100_000, min=1, doc="media items remembered at most; the least recently used goes first"
    )
    profile_name: str = param("encode", doc="the profile whose first target encoded the items")


@register("encoder-cache-affinity-scorer")
class EncoderCacheAffinityScorer(Plugin):
    Params = EncoderCacheAffinityParams

    def __init__(self, name: str, params: EncoderCacheAffinityParams, handle: Handle) -> None:
        super().__init__(name)
        self.max_items = params.max_items
        self.profile_name = params.profile_name
        self._encoded_on: OrderedDict[str, str] = OrderedDict()  # digest → endpoint name

    def __len__(self) -> int:
        return len(self._encoded_on)

    def endpoint_for(self, digest: str) -> str | None:
        return self._encoded_on.get(digest)

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[EndpointSnapshot]
    ) -> list[float]:
        items = request.media
        if not items:
            return [0.0] * len(endpoints)
        counts: dict[str, int] = {}
        for item in items:
            where = self._encoded_on.get(item.digest)
            if where is not None:
                counts[where] = counts.get(where, 0) + 1
        n = len(items)
        return [counts.get(e.name, 0) / n for e in endpoints]

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        if not request.media:
            return
        picked = result.profile_results.get(self.profile_name)
        if picked is None or not picked.targets:
            return
        name = picked.targets[0].name
        seen = self._encoded_on
        for item in request.media:
            seen[item.digest] = name
            seen.move_to_end(item.digest)
        while len(seen) > self.max_items:
            seen.popitem(last=False)
