"""CPU per request of the EPP's own request path, without gRPC: one ext_proc stream's
messages (request headers, then the body with end_of_stream) through `RequestStream`, the
default profile over `--endpoints` endpoints, the stream closed. What is left of the
EPP's cost once gRPC and asyncio (the same for the minimal servicer) are taken out.

    .venv/bin/python bench/request_cpu.py [--endpoints 8] [--requests 3000]
    .venv/bin/python bench/request_cpu.py --baseline ../main   # old vs new, one run
    .venv/bin/python bench/request_cpu.py --config config/slo.yaml --header x-slo-ttft-ms:150

CPU time of this thread (`thread_time`), so a shared machine's other jobs do not inflate
it; the figure is the median over `--batches` batches of the mean per request. With
`--baseline CHECKOUT` the script runs in subprocesses, alternately with this checkout's
`epp` and CHECKOUT's, `--rounds` times each (medians).

`--instructions` counts instructions instead (valgrind's callgrind, instrumentation on only
around the measured requests, after a warm-up): the same on a saturated machine as on an
idle one, so old and new compare to a fraction of a percent where CPU time swings ±20 %.
`--servicer` drives `ExtProcServicer.Process` instead of `RequestStream`: 16 concurrent
streams on one asyncio loop, the servicer's loop, body deadline and message dispatch
included (what the gRPC layer adds on top, the same for the minimal servicer, is not).

    .venv/bin/python bench/request_cpu.py --instructions --baseline /tmp/main [--servicer]

`--spread` first leaves the prompt cached on every endpoint (`spread_prompt`), as it is in
`epp serve` under `bench/extproc_cpu.py`'s 16 concurrent streams; without it one request
at a time keeps the prompt on one endpoint, and the prefix plugins have one match to
handle instead of eight.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from epp.composition import install_plugins
from epp.config.loader import load_config_file, load_default_config
from epp.datastore import Datastore, Endpoint, EndpointMetrics
from epp.director import Director
from epp.extproc.stream import RequestStream
from epp.scheduling.registry import Handle

# The body bench/overhead.py sends (~300 bytes).
BODY = json.dumps(
    {
        "model": "tiny",
        "prompt": "You are a helpful assistant. Summarise the following support ticket in one "
        "short sentence: the customer reports that the mobile app logs them out every few "
        "minutes since the last update, on both Wi-Fi and cellular.",
        "max_tokens": 1,
        "temperature": 0.0,
        "user": "b",
    }
).encode()


_SYSTEM = (
    "You are a helpful assistant. Summarise the following support ticket in one short sentence."
)
_TICKET = (
    "The customer reports that the mobile app logs them out every few minutes since the "
    "last update, on both Wi-Fi and cellular."
)
# The same conversation as a chat request and as an Anthropic Messages request (`--api`):
# what a Messages request costs the request path beside a chat request of the same size.
API_BODIES = {
    "completions": ("/v1/completions", BODY),
    "chat": (
        "/v1/chat/completions",
        json.dumps(
            {
                "model": "tiny",
                "messages": [
                    {"role": "system", "content": _SYSTEM},
                    {"role": "user", "content": _TICKET},
                ],
                "max_tokens": 1,
                "temperature": 0.0,
                "user": "b",
            }
        ).encode(),
    ),
    "messages": (
        "/v1/messages",
        json.dumps(
            {
                "model": "tiny",
                "system": _SYSTEM,
                "messages": [{"role": "user", "content": _TICKET}],
                "max_tokens": 1,
                "temperature": 0.0,
                "metadata": {"user_id": "b"},
            }
        ).encode(),
    ),
}
API = "completions"  # set by --api


def messages(extra: dict[str, str] | None = None, body: bytes | None = None) -> list[bytes]:
    """Request headers and the whole body, serialized as Envoy sends them (FULL_DUPLEX_STREAMED)."""
    path, default_body = API_BODIES[API]
    body = default_body if body is None else body
    headers = {
        ":path": path,
        ":method": "POST",
        ":authority": "127.0.0.1:10000",
        ":scheme": "http",
        "content-type": "application/json",
        "content-length": str(len(body)),
        "x-request-id": "5f0c3a8e-4a53-4c5e-9d0e-2f1f0a7d9c11",
        "user-agent": "Python/3.11 aiohttp/3.14",
    } | (extra or {})
    first = pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[
                    base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()
                ]
            )
        ),
        protocol_config=pb.ProtocolConfiguration(
            request_body_mode=processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
        ),
    )
    last = pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True))
    # Envoy's bytes, parsed per request as gRPC would: the cost of the messages' Python
    # objects is part of the request path.
    return [first.SerializeToString(), last.SerializeToString()]


# `--tracing RATIO`: the tracer every stream gets (epp/tracing.py); None = tracing off.
TRACER = None


def start_tracing(ratio: float) -> None:
    """Tracing on at `ratio` sampling, finished spans encoded to OTLP protobuf in batches
    of 512 in this thread (what the batch processor's thread does, minus the network)."""
    global TRACER
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    from epp.tracing import build_tracer

    class Encoding(SpanExporter):
        def __init__(self) -> None:
            self.batch: list = []

        def export(self, spans):
            self.batch.extend(spans)
            if len(self.batch) >= 512:
                encode_spans(self.batch).SerializeToString()
                self.batch = []
            return SpanExportResult.SUCCESS

    os.environ["OTEL_TRACES_SAMPLER_ARG"] = str(ratio)
    TRACER = build_tracer(Encoding())


def _stream(director: Director) -> RequestStream:
    if TRACER is None:
        return RequestStream(director, 32 << 20)
    return RequestStream(director, 32 << 20, tracer=TRACER)


def build(n: int, config: Path | None = None, spread: bool = False) -> Director:
    """The director over `n` endpoints; with `spread`, the prompt already cached on every
    one (`spread_prompt`)."""
    rng = random.Random(0)
    ds = Datastore(staleness=1e9)
    ds.set_endpoints([Endpoint(f"sim-{i}", "127.0.0.1", 30000 + i) for i in range(n)])
    for e in ds.endpoints():
        ds.update_metrics(
            e.name, EndpointMetrics(kv_cache_usage=rng.random() * 0.1, update_time=ds.clock())
        )
    handle, registry = Handle(rng=random.Random(0)), install_plugins()
    if config is None:
        cfg = load_default_config(handle, registry)
    else:
        cfg = load_config_file(config, handle, registry)
    director = Director(ds, cfg.scheduler, cfg.pre_request, random.Random(0))
    if TRACER is not None:
        from epp.tracing import instrument

        instrument(director.scheduler)
    if spread:
        spread_prompt(director)
    return director


def spread_prompt(director: Director, held: int = 256) -> None:
    """Route `held` requests and only then end them: the in-flight load on the endpoint
    holding the prompt opens the affinity filter's gate, so the prompt ends up cached on
    every endpoint. That is the index `epp serve` has under `bench/extproc_cpu.py`'s 16
    concurrent streams (every endpoint matches the prompt), where one request at a time
    keeps it on one endpoint (one match: less work per request than in the server)."""
    streams = []
    for _ in range(held):
        stream = RequestStream(director, 32 << 20)
        for data in messages():
            stream.handle(pb.ProcessingRequest.FromString(data))
        streams.append(stream)
    for stream in streams:
        stream.close()


def measure(
    n: int,
    requests: int,
    batches: int,
    config: Path | None = None,
    extra: dict[str, str] | None = None,
    spread: bool = False,
) -> dict[str, float]:
    director = build(n, config, spread)
    raw = messages(extra)
    per_batch = []
    for b in range(batches + 1):
        c0 = time.thread_time()
        for _ in range(requests // batches):
            stream = _stream(director)
            for data in raw:
                stream.handle(pb.ProcessingRequest.FromString(data))
            stream.close()
        if b:  # the first batch warms up
            per_batch.append((time.thread_time() - c0) / (requests // batches))
    return {"endpoints": n, "cpu_us_per_request": statistics.median(per_batch) * 1e6}


def servicer_runner(n: int, spread: bool = False) -> Callable[[int], None]:
    """`run(count)`: `count` requests through `ExtProcServicer.Process`, 16 concurrent
    streams on one loop (kept across calls), each fed the two messages with a loop turn
    before each, as gRPC's receiver would."""
    import asyncio

    from epp.extproc.server import ExtProcServicer

    director = build(n, spread=spread)
    servicer = (
        ExtProcServicer(director) if TRACER is None else ExtProcServicer(director, tracer=TRACER)
    )
    raw = messages()
    loop = asyncio.new_event_loop()

    async def feed():
        for data in raw:
            await asyncio.sleep(0)
            yield pb.ProcessingRequest.FromString(data)

    async def run(count: int) -> None:
        left = [count]

        async def worker() -> None:
            while left[0] > 0:
                left[0] -= 1
                async for _ in servicer.Process(feed(), None):
                    pass

        await asyncio.gather(*(worker() for _ in range(16)))

    return lambda count: loop.run_until_complete(run(count))


def measure_servicer(n: int, requests: int, batches: int, spread: bool = False) -> dict[str, float]:
    """`measure` through `ExtProcServicer.Process` (`servicer_runner`)."""
    run = servicer_runner(n, spread)
    per_batch = []
    for b in range(batches + 1):
        c0 = time.thread_time()
        run(requests // batches)
        if b:  # the first batch warms up
            per_batch.append((time.thread_time() - c0) / (requests // batches))
    return {"endpoints": n, "cpu_us_per_request": statistics.median(per_batch) * 1e6}


def instructions(checkout: Path | None, args: argparse.Namespace) -> float:
    """Instructions per request of `checkout`'s code (None: this one) under callgrind:
    warm up, switch instrumentation on (`callgrind_control`), run `--requests`, dump."""
    env = dict(os.environ)
    if checkout is not None:
        env["PYTHONPATH"] = str(checkout)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        argv = [
            "valgrind", "--tool=callgrind", "--instr-atstart=no",
            f"--callgrind-out-file={out}", sys.executable, str(Path(__file__).resolve()),
            "--_callgrind-child", "--endpoints", str(args.endpoints),
            "--requests", str(args.requests), *(["--servicer"] if args.servicer else []),
            *(["--spread"] if args.spread else []), "--api", args.api,
            *_tracing_argv(args, checkout),
            *(["--config", str(args.config.resolve())] if args.config else []),
            *(a for h in args.header for a in ("--header", h)),
        ]  # fmt: skip
        subprocess.run(argv, env=env, cwd=checkout, check=True, capture_output=True)
        [dump] = [p for p in Path(tmp).iterdir() if p.name != out.name]  # the -d dump
        summary = next(ln for ln in dump.read_text().splitlines() if ln.startswith("summary:"))
    return int(summary.split()[1]) / args.requests


def callgrind_child(args: argparse.Namespace) -> None:
    """Inside valgrind: the same work as `measure`, instrumented around the measured part."""
    toggle = ["callgrind_control", "-i", "on", str(os.getpid())]
    dump = ["callgrind_control", "-d", str(os.getpid())]
    if args.servicer:
        run = servicer_runner(args.endpoints, args.spread)
    else:
        director = build(args.endpoints, config=args.config, spread=args.spread)
        raw = messages(header_map(args.header))

        def run(count: int) -> None:
            for _ in range(count):
                stream = _stream(director)
                for data in raw:
                    stream.handle(pb.ProcessingRequest.FromString(data))
                stream.close()

    run(300)  # warm-up
    subprocess.run(toggle, check=True, capture_output=True)
    time.sleep(0.5)  # callgrind polls for the command
    run(args.requests)
    subprocess.run(dump, check=True, capture_output=True)


def header_map(specs: list[str]) -> dict[str, str]:
    """`--header NAME:VALUE` options as a header dict (ValueError naming a malformed one)."""
    extra = {}
    for h in specs:
        name, sep, value = h.partition(":")
        if not sep or not name:
            raise ValueError(f"--header {h!r}: expected NAME:VALUE")
        extra[name.strip().lower()] = value.strip()
    return extra


def _tracing_argv(args: argparse.Namespace, checkout: Path | None) -> list[str]:
    """--tracing for a child measuring this checkout (a baseline has no tracing)."""
    return ["--tracing", str(args.tracing)] if args.tracing is not None and checkout is None else []


def child(checkout: Path | None, args: argparse.Namespace) -> float:
    if args.instructions:
        return instructions(checkout, args)
    env = dict(os.environ)
    if checkout is not None:
        env["PYTHONPATH"] = str(checkout)
    argv = [
        sys.executable, str(Path(__file__).resolve()), "--json", "--endpoints",
        str(args.endpoints), "--requests", str(args.requests), "--batches", str(args.batches),
        *(["--servicer"] if args.servicer else []), *(["--spread"] if args.spread else []),
        "--api", args.api,
        *_tracing_argv(args, checkout),
    ]  # fmt: skip
    out = subprocess.run(argv, env=env, cwd=checkout, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["cpu_us_per_request"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--endpoints", type=int, default=8)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--batches", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--baseline", type=Path, metavar="CHECKOUT")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--instructions", action="store_true", help="count instructions (callgrind)")
    ap.add_argument("--servicer", action="store_true", help="drive ExtProcServicer.Process")
    ap.add_argument(
        "--spread",
        action="store_true",
        help="the prompt cached on every endpoint first, as in epp serve under concurrent load",
    )
    ap.add_argument(
        "--_callgrind-child", dest="callgrind_child", action="store_true", help=argparse.SUPPRESS
    )
    ap.add_argument("--config", type=Path, help="an EndpointPickerConfig instead of the default")
    ap.add_argument(
        "--header", action="append", default=[], help="NAME:VALUE added to every request"
    )
    ap.add_argument(
        "--api",
        choices=sorted(API_BODIES),
        default="completions",
        help="the request's API: a completion, or one conversation as chat or as Messages",
    )
    ap.add_argument(
        "--tracing",
        type=float,
        metavar="RATIO",
        help="tracing on (epp/tracing.py) at this sampling ratio, spans OTLP-encoded in the "
        "request's thread; with --baseline, this checkout only (the baseline has none)",
    )
    args = ap.parse_args()
    global API
    API = args.api
    measures_here = args.callgrind_child or (args.baseline is None and not args.instructions)
    if args.tracing is not None and measures_here:
        start_tracing(args.tracing)
    try:
        extra = header_map(args.header)
    except ValueError as e:
        ap.error(str(e))
    if args.config is not None and args.baseline is not None:
        ap.error("--config applies to this checkout only; run it without --baseline")
    if args.servicer and (args.config is not None or extra):
        ap.error("--servicer measures the default config only")
    if args.callgrind_child:
        callgrind_child(args)
        return
    unit = "instructions" if args.instructions else "µs CPU"
    if args.baseline is None:
        if args.instructions:
            print(f"{instructions(None, args):,.0f} instructions per request")
            return
        if args.servicer:
            r = measure_servicer(args.endpoints, args.requests, args.batches, args.spread)
        else:
            r = measure(
                args.endpoints, args.requests, args.batches, args.config, extra, args.spread
            )
        print(json.dumps(r) if args.json else f"{r['cpu_us_per_request']:.1f} µs CPU per request")
        return
    got: dict[str, list[float]] = {"before": [], "after": []}
    for r in range(args.rounds):
        order = [("before", args.baseline), ("after", None)]
        for label, checkout in order if r % 2 == 0 else order[::-1]:
            got[label].append(child(checkout, args))
    before, after = (statistics.median(got[k]) for k in ("before", "after"))
    print(f"{args.endpoints} endpoints, medians of {args.rounds} rounds:")
    print(f"before ({args.baseline}): {before:,.1f} {unit} per request  {got['before']}")
    print(f"after (this checkout): {after:,.1f} {unit} per request  {got['after']}")
    print(f"after / before: {after / before:.2f}")


if __name__ == "__main__":
    main()
