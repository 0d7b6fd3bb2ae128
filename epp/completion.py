"""The end of one response: a `RequestRecord` for every subscriber, the `PostResponse`
plugins, and the per-response Prometheus metrics.

`ResponseObserver.finished` runs once per routed request, on the request loop, when
its response ends (last body chunk or trailers) or when the stream ends without one
(client disconnect, upstream reset: `ok=False`). A sink is any `sink(record)` callable:
the planner loop and the latency predictor subscribe. Sinks run on the request loop, so
a sink must be quick and, if it hands the record to another thread, thread-safe (a
`queue.SimpleQueue.put` or a `deque.append`). A failing sink or plugin is logged and
never reaches the request.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence

from epp.director import RoutingDecision
from epp.observability import (
    INPUT_TOKENS,
    NORMALIZED_TPOT,
    OUTPUT_TOKENS,
    PROMPT_CACHED_TOKENS,
    REQUEST_DURATION,
    REQUEST_TPOT,
    REQUEST_TTFT,
    plugin_timer,
)
from epp.records import RequestRecord
from epp.request import InferenceRequest
from epp.response import ResponseMeter
from epp.roles import role_of
from epp.scheduling.interfaces import PostResponse

log = logging.getLogger("epp.completion")

Sink = Callable[[RequestRecord], None]


def build_record(
    request: InferenceRequest,
    decision: RoutingDecision,
    meter: ResponseMeter | None,
    status: int,
    routed_at: float,
    ended_at: float,
    complete: bool,
) -> RequestRecord:
    """What one finished request looked like. `complete` is False when the stream
    ended before the response did. Without usage the prompt is the EPP's estimate."""
    usage = meter.usage if meter else None
    first = meter.first_token_at if meter else None
    error = meter.error_status if meter else 0
    target = decision.result.primary.targets[0] if decision.result else None
    return RequestRecord(
        finished_at=ended_at,
        isl=usage.prompt_tokens if usage else request.prompt_tokens_estimate,
        osl=meter.output_tokens if meter else 0,
        ttft_ms=(first - routed_at) * 1000.0 if first is not None else math.nan,
        itl_ms=meter.itl_s() * 1000.0 if meter else math.nan,
        duration_s=ended_at - routed_at,
        cached_tokens=usage.cached_tokens if usage else 0,
        ok=complete and 200 <= status < 400 and not error,
        endpoint=target.name if target else "",
        role=role_of(target.endpoint) if target else None,
        status=error or status,
    )


class ResponseObserver:
    def __init__(
        self, post_response: Sequence[PostResponse] = (), sinks: Sequence[Sink] = ()
    ) -> None:
        self.post_response = tuple(post_response)
        self._post_timers = [plugin_timer("PostResponse", p) for p in self.post_response]
        self._sinks: list[Sink] = list(sinks)

    def subscribe(self, sink: Sink) -> Callable[[], None]:
        """Call `sink(record)` for every finished request; returns the unsubscribe."""
        self._sinks.append(sink)
        return lambda: self._sinks.remove(sink) if sink in self._sinks else None

    def finished(
        self, request: InferenceRequest, decision: RoutingDecision, record: RequestRecord
    ) -> None:
        if decision.labels is not None:
            _observe_metrics(decision.labels, record)
        for sink in list(self._sinks):
            try:
                sink(record)
            except Exception:
                log.exception("response sink %r failed", sink)
        if decision.result is None:
            return
        endpoint = decision.result.primary.targets[0]
        for plugin, timer in zip(self.post_response, self._post_timers, strict=True):
            t = time.perf_counter()
            try:
                plugin.post_response(request, record, endpoint)
            except Exception:
                log.exception("post-response plugin %r failed", plugin)
            timer.observe(time.perf_counter() - t)


def _observe_metrics(labels: tuple[str, str], rec: RequestRecord) -> None:
    """`labels`: (model_name, target_model_name) as the director bounded them."""
    if not rec.ok:
        return  # upstream counts only successful responses in these histograms
    REQUEST_DURATION.labels(*labels).observe(rec.duration_s)
    INPUT_TOKENS.labels(*labels).observe(rec.isl)
    OUTPUT_TOKENS.labels(*labels).observe(rec.osl)
    PROMPT_CACHED_TOKENS.labels(*labels).observe(rec.cached_tokens)
    if not math.isnan(rec.ttft_ms):
        REQUEST_TTFT.labels(*labels).observe(rec.ttft_ms / 1000.0)
    if not math.isnan(rec.itl_ms):
        REQUEST_TPOT.labels(*labels).observe(rec.itl_ms / 1000.0)
    if rec.osl > 0:
        NORMALIZED_TPOT.labels(*labels).observe(rec.duration_s / rec.osl)
