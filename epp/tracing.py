"""OpenTelemetry spans for each request's stages, W3C trace context to the model server.

`epp serve --tracing` (llm-d-router's flag) turns it on; off, nothing here is imported
and the request path pays one `is None` test per stage. On, each request is one
`gateway.request` span (SERVER; its parent is the client's or the gateway's
`traceparent`, as llm-d-router's `extractTraceContext`) with children:

- `llm_d.epp.parse`: the body parsed into a request;
- `llm_d.epp.flow_control.wait`: the wait in flow control's queue (when it is on);
- `gateway.request_orchestration`: the director's routing (llm-d-router's name), under it
  each data producer, and per profile `run_scheduler_profile` with `filter_endpoints`
  (one span per filter), `llm_d.epp.scoring` (one `llm_d.epp.scorer.<type>` per scorer,
  with its weight) and `pick_endpoints`: the names llm-d-router's scheduler uses;
- `llm_d.epp.response`: from the response headers to the end of the response.

The routed request carries `traceparent` (and `tracestate`) naming the `gateway.request`
span, set as a header mutation, as llm-d-router's request handler injects it, so a
model server that traces (vLLM `--otlp-traces-endpoint`) continues the same trace.

The scheduler's plugins are not touched: they are already timed into the plugin-duration
histogram, and tracing wraps those timers (`instrument`) so each observation is also
noted, with its end time, for the request being routed; the spans are built after
routing with those exact start and end times. A request the sampler drops costs a
header lookup and a random draw: the sampling decision (llm-d-router's default,
parent-based trace-id ratio) is taken before the SDK is called.

Configuration is the OpenTelemetry SDK's environment, with llm-d-router's defaults:
`OTEL_TRACES_EXPORTER` (`otlp`, here the default; `console`; `none`), the
`OTEL_EXPORTER_OTLP_*` endpoint variables (none set: a plaintext collector on
localhost:4317, llm-d-router's `localCollectorOptions`), `OTEL_TRACES_SAMPLER` /
`OTEL_TRACES_SAMPLER_ARG` (unset: `parentbased_traceidratio` at 0.1, llm-d-router's
default), `OTEL_SERVICE_NAME` (default `epp`). The SDK and exporter are the optional
`tracing` extra (`pip install epp[tracing]`), as vLLM ships its own tracing.
"""

from __future__ import annotations

import contextvars
import logging
import os
import random
import re
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

    from epp.scheduling.scheduler import Scheduler

log = logging.getLogger("epp.tracing")

_perf = time.perf_counter
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-[0-9a-f]{16}-([0-9a-f]{2})(?:-.*)?")
SCOPE = "epp"
DEFAULT_SAMPLE_RATIO = 0.1
DEFAULT_COLLECTOR = "localhost:4317"
_NO_SDK = "--tracing needs the OpenTelemetry SDK and OTLP exporter: pip install 'epp[tracing]'"
_TRANSPORT_ENV = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_INSECURE",
    "OTEL_EXPORTER_OTLP_TRACES_INSECURE",
    "OTEL_EXPORTER_OTLP_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
)

# The plugin timings of the request being routed (None: nobody is recording).
_SINK: contextvars.ContextVar[list[tuple[_Tag, float, float]] | None] = contextvars.ContextVar(
    "epp_trace_sink", default=None
)


@dataclass(frozen=True, slots=True)
class _Tag:
    """Which plugin a timer times: its span's name, group and attributes."""

    span: str
    group: str  # "producer", "filter", "scorer", "picker"
    profile: str | None
    attributes: tuple[tuple[str, Any], ...]


class _RecordingTimer:
    """A plugin-duration histogram child that also notes each observation for the
    request being routed (its end now, its length `seconds`)."""

    __slots__ = ("inner", "tag")

    def __init__(self, inner: Any, tag: _Tag) -> None:
        self.inner = inner
        self.tag = tag

    def observe(self, seconds: float) -> None:
        self.inner.observe(seconds)
        sink = _SINK.get()
        if sink is not None:
            sink.append((self.tag, _perf(), seconds))


def _plugin_attrs(plugin: object, **extra: Any) -> tuple[tuple[str, Any], ...]:
    kind = getattr(plugin, "type_name", type(plugin).__name__)
    out: dict[str, Any] = {"llm_d.epp.plugin.type": kind}
    name = getattr(plugin, "name", "")
    if name:
        out["llm_d.epp.plugin.name"] = name
    out.update(extra)
    return tuple(out.items())


def _type(plugin: object) -> str:
    return getattr(plugin, "type_name", type(plugin).__name__)


def instrument(scheduler: Scheduler) -> None:
    """Wrap the scheduler's plugin timers so a traced request notes each plugin call."""

    def wrap(timer: Any, tag: _Tag) -> Any:
        return timer if isinstance(timer, _RecordingTimer) else _RecordingTimer(timer, tag)

    s = scheduler
    s._producer_timers = [
        wrap(t, _Tag(f"llm_d.epp.data_producer.{_type(p)}", "producer", None, _plugin_attrs(p)))
        for p, t in zip(s.producers, s._producer_timers, strict=True)
    ]
    # The profile handler's two calls (a few µs) get no span: each costs the SDK about as
    # much as the scheduling it would show (docs/observability.md, "Tracing").
    for name, prof in s.profiles.items():
        prof._filter_timers = [
            wrap(t, _Tag(f"llm_d.epp.filter.{_type(f)}", "filter", name, _plugin_attrs(f)))
            for f, t in zip(prof.filters, prof._filter_timers, strict=True)
        ]
        prof._scorer_timers = [
            wrap(
                t,
                _Tag(
                    f"llm_d.epp.scorer.{_type(ws.scorer)}",
                    "scorer",
                    name,
                    _plugin_attrs(ws.scorer, **{"llm_d.epp.scorer.weight": float(ws.weight)}),
                ),
            )
            for ws, t in zip(prof.scorers, prof._scorer_timers, strict=True)
        ]
        prof._picker_timer = wrap(
            prof._picker_timer, _Tag("pick_endpoints", "picker", name, _plugin_attrs(prof.picker))
        )


class RequestTracer:
    """The process's tracer: one `RequestTrace` per request."""

    def __init__(self, provider: TracerProvider, ratio: float | None = None) -> None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        # parentbased_traceidratio decided here (None: the SDK's configured sampler decides)
        self.ratio = ratio
        self._random = random.random
        self.tracer = provider.get_tracer(SCOPE)
        self.propagator = TraceContextTextMapPropagator()
        # perf_counter seconds → epoch ns (OpenTelemetry's timestamps)
        self._offset = time.time_ns() - int(_perf() * 1e9)

    def ns(self, perf: float) -> int:
        return int(perf * 1e9) + self._offset

    def start(self, headers: Mapping[str, str], attributes: dict[str, Any]) -> RequestTrace | None:
        """The request's trace, or None when it is not sampled: no span, and no header
        set (a client's own traceparent reaches the model server unchanged)."""
        from opentelemetry.trace import SpanKind

        header = headers.get("traceparent")
        if self.ratio is not None:
            flags = _sampled_flag(header) if header is not None else None
            if flags is None:  # a root (or an unreadable parent: a new root, as the SDK)
                if self._random() >= self.ratio:
                    return None
            elif not flags:
                return None
        parent = self.propagator.extract(headers) if header is not None else None
        span = self.tracer.start_span(
            "gateway.request", context=parent, kind=SpanKind.SERVER, attributes=attributes
        )
        return RequestTrace(self, span)

    def shutdown(self) -> None:
        self.provider.shutdown()


def _sampled_flag(traceparent: str) -> bool | None:
    """The sampled bit of a W3C traceparent (version-traceid-parentid-flags), None if it
    is not one."""
    m = _TRACEPARENT.fullmatch(traceparent.strip())
    if m is None or m.group(1) == "ff" or set(m.group(2)) == {"0"}:
        return None
    return bool(int(m.group(3), 16) & 1)


class RequestTrace:
    """One request's spans (see the module doc)."""

    __slots__ = ("_ctx", "_owner", "_response", "ended", "recording", "span")

    def __init__(self, owner: RequestTracer, span: Any) -> None:
        from opentelemetry import trace

        self._owner = owner
        self.span = span
        self.recording = span.is_recording()
        self._ctx = trace.set_span_in_context(span)
        self._response: Any = None
        self.ended = False

    def headers(self) -> dict[str, str]:
        """traceparent (and tracestate) naming this request's span, for the model server."""
        from opentelemetry import trace

        carrier: dict[str, str] = {}
        self._owner.propagator.inject(carrier, context=trace.set_span_in_context(self.span))
        return carrier

    def stage(self, name: str, t0: float, t1: float, **attributes: Any) -> None:
        """A child span from `t0` to `t1` (perf_counter seconds)."""
        if self.recording:
            self._child(name, t0, t1, self._ctx, attributes)

    def _child(self, name: str, t0: float, t1: float, ctx: Any, attrs: Mapping[str, Any]) -> Any:
        o = self._owner
        span = o.tracer.start_span(name, context=ctx, start_time=o.ns(t0), attributes=attrs)
        span.end(end_time=o.ns(t1))
        return span

    @contextmanager
    def routing(self) -> Iterator[None]:
        """Around the director's routing: the plugin calls inside become spans."""
        if not self.recording:
            yield
            return
        sink: list[tuple[_Tag, float, float]] = []
        token = _SINK.set(sink)
        t0 = _perf()
        try:
            yield
        finally:
            t1 = _perf()
            _SINK.reset(token)
            self._orchestration(t0, t1, sink)

    def _orchestration(self, t0: float, t1: float, sink: list[tuple[_Tag, float, float]]) -> None:
        from opentelemetry import trace

        o = self._owner
        orch = o.tracer.start_span("gateway.request_orchestration", self._ctx, start_time=o.ns(t0))
        octx = trace.set_span_in_context(orch)
        profiles: dict[str, list[tuple[_Tag, float, float]]] = {}
        for tag, end, dur in sink:
            if tag.profile is None:
                self._child(tag.span, end - dur, end, octx, dict(tag.attributes))
            else:
                profiles.setdefault(tag.profile, []).append((tag, end - dur, end))
        for name, calls in profiles.items():
            start = min(c[1] for c in calls)
            prof = o.tracer.start_span(
                "run_scheduler_profile",
                octx,
                start_time=o.ns(start),
                attributes={"llm_d.epp.scheduling.profile.name": name},
            )
            pctx = trace.set_span_in_context(prof)
            for group, span_name in (
                ("filter", "filter_endpoints"),
                ("scorer", "llm_d.epp.scoring"),
            ):
                members = [c for c in calls if c[0].group == group]
                if not members:
                    continue
                g = o.tracer.start_span(
                    span_name, pctx, start_time=o.ns(min(c[1] for c in members))
                )
                gctx = trace.set_span_in_context(g)
                for tag, a, b in members:
                    self._child(tag.span, a, b, gctx, dict(tag.attributes))
                g.end(end_time=o.ns(max(c[2] for c in members)))
            for tag, a, b in calls:
                if tag.group == "picker":
                    self._child(tag.span, a, b, pctx, dict(tag.attributes))
            prof.end(end_time=o.ns(max(c[2] for c in calls)))
        orch.end(end_time=o.ns(t1))

    def response_started(self) -> None:
        if self.recording and self._response is None:
            o = self._owner
            self._response = o.tracer.start_span("llm_d.epp.response", self._ctx)

    def end(self, status: int | None = None, **attributes: Any) -> None:
        """The request is over (answered, refused, or its stream gone)."""
        if self.ended:
            return
        self.ended = True
        if not self.recording:
            return
        if status is not None:
            self.span.set_attribute("http.response.status_code", status)
            if status >= 500:
                from opentelemetry.trace import Status, StatusCode

                self.span.set_status(Status(StatusCode.ERROR))
        for k, v in attributes.items():
            self.span.set_attribute(k, v)
        if self._response is not None:
            self._response.end()
        self.span.end()


def check_environment() -> None:
    """Raise RuntimeError naming the fix if `--tracing` cannot start here (no SDK, an
    unsupported exporter, a sampler ratio outside 0..1): checked before serving."""
    try:
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError as e:
        raise RuntimeError(f"{_NO_SDK} ({e})") from None
    kind = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
    if kind not in ("otlp", "console", "none"):
        raise RuntimeError(
            f"OTEL_TRACES_EXPORTER={kind!r} is not supported: use otlp, console or none"
        )
    if "OTEL_TRACES_SAMPLER" not in os.environ:
        arg = os.environ.get("OTEL_TRACES_SAMPLER_ARG", str(DEFAULT_SAMPLE_RATIO))
        try:
            ok = 0.0 <= float(arg) <= 1.0
        except ValueError:
            ok = False
        if not ok:
            raise RuntimeError(f"OTEL_TRACES_SAMPLER_ARG must be a ratio within 0..1, got {arg!r}")


def build_tracer(
    exporter: SpanExporter | None = None, service: str | None = None, batch: bool = False
) -> RequestTracer:
    """A tracer from the OpenTelemetry environment (see the module doc); `exporter`
    replaces the configured one (tests: an in-memory exporter, exported at once; with
    `batch`, through the batch processor as a configured one is)."""
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased
    except ImportError as e:
        raise RuntimeError(f"{_NO_SDK} ({e})") from None
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON

    sampler, ratio = None, None
    if "OTEL_TRACES_SAMPLER" not in os.environ:
        # llm-d-router's default, parentbased_traceidratio, decided by `RequestTracer.start`
        # before the SDK is called: a dropped request then costs no span at all. The SDK
        # samples what it is given (a sampled parent, or a root that drew under the ratio).
        ratio = float(os.environ.get("OTEL_TRACES_SAMPLER_ARG", DEFAULT_SAMPLE_RATIO))
        if not 0.0 <= ratio <= 1.0:
            raise RuntimeError(f"OTEL_TRACES_SAMPLER_ARG must be within 0..1, got {ratio}")
        sampler = ParentBased(ALWAYS_ON)
    resource = Resource.create(
        {"service.name": service or os.environ.get("OTEL_SERVICE_NAME", "epp")}
    )
    provider = TracerProvider(resource=resource, sampler=sampler)
    if exporter is not None and not batch:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        configured = exporter if exporter is not None else _exporter_from_env()
        if configured is not None:
            provider.add_span_processor(BatchSpanProcessor(configured))
    return RequestTracer(provider, ratio)


def _exporter_from_env() -> SpanExporter | None:
    kind = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
    if kind == "none":
        return None
    if kind == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if kind != "otlp":
        raise RuntimeError(
            f"OTEL_TRACES_EXPORTER={kind!r} is not supported: use otlp, console or none"
        )
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    if any(k in os.environ for k in _TRANSPORT_ENV):
        return OTLPSpanExporter()
    return OTLPSpanExporter(endpoint=DEFAULT_COLLECTOR, insecure=True)
