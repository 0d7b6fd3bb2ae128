"""Per-chunk cost of the response path inside the EPP, without Envoy or gRPC.

Times, per SSE chunk of one token (vLLM-shaped chat and completions events), medians of
`--repeats` runs of `--chunks` chunks each:
  meter     `ResponseMeter.feed` alone (the SSE reading: line split + one regex per event)
  json      `json.loads` of the same event, for scale: what parsing every event would cost
  stream    `RequestStream.handle(response_body)`: meter + the pass-through protobuf the
            EPP sends back (what one response chunk costs the request loop, gRPC excluded)

    .venv/bin/python bench/response_chunk.py [--chunks 20000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from epp.completion import ResponseObserver
from epp.config.loader import load_default_config
from epp.datastore import Datastore, Endpoint
from epp.director import Director
from epp.extproc.stream import RequestStream
from epp.response import ResponseMeter
from epp.scheduling.registry import Handle

FULL_DUPLEX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
HEAD = {"id": "chatcmpl-4f1b7f0a9c", "object": "chat.completion.chunk", "created": 1763856000,
        "model": "meta-llama/Llama-3.1-8B-Instruct"}  # fmt: skip
EVENTS = {
    "chat": b"data: " + json.dumps(
        {**HEAD, "choices": [{"index": 0, "delta": {"content": " token"}, "logprobs": None,
                              "finish_reason": None}]}, separators=(",", ":")
    ).encode() + b"\n\n",
    "completions": b"data: " + json.dumps(
        {**HEAD, "object": "text_completion", "choices": [{"index": 0, "text": " token",
                                                            "logprobs": None,
                                                            "finish_reason": None}]},
        separators=(",", ":"),
    ).encode() + b"\n\n",
}  # fmt: skip


def per_chunk_us(fn, n: int, repeats: int) -> float:
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(n)
        runs.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(runs)


def meter_run(event: bytes):
    def run(n: int) -> None:
        m = ResponseMeter(streamed=True)
        for i in range(n):
            m.feed(event, float(i))

    return run


def json_run(event: bytes):
    payload = event[6:]

    def run(n: int) -> None:
        for _ in range(n):
            json.loads(payload)

    return run


def stream_run(event: bytes):
    ds = Datastore(require_metrics=False)
    ds.set_endpoints([Endpoint("e0", "10.0.0.1", 8000)])
    cfg = load_default_config(Handle(rng=random.Random(0)))
    director = Director(ds, cfg.scheduler, cfg.pre_request, random.Random(0))
    body = json.dumps({"model": "m", "prompt": "hi", "stream": True}).encode()
    msg = pb.ProcessingRequest(response_body=pb.HttpBody(body=event, end_of_stream=False))

    def run(n: int) -> None:
        s = RequestStream(director, 1 << 20, ResponseObserver())
        first = pb.ProcessingRequest(
            request_headers=pb.HttpHeaders(),
            protocol_config=pb.ProtocolConfiguration(
                request_body_mode=FULL_DUPLEX, response_body_mode=FULL_DUPLEX
            ),
        )
        first.request_headers.headers.headers.add(key=":path", raw_value=b"/v1/completions")
        first.request_headers.headers.headers.add(key=":method", raw_value=b"POST")
        s.handle(first)
        s.handle(pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True)))
        hdrs = pb.ProcessingRequest(response_headers=pb.HttpHeaders())
        hdrs.response_headers.headers.headers.add(key=":status", raw_value=b"200")
        hdrs.response_headers.headers.headers.add(
            key="content-type", raw_value=b"text/event-stream"
        )
        s.handle(hdrs)
        for _ in range(n):
            s.handle(msg)
        s.close()

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if args.chunks < 1 or args.repeats < 1:
        ap.error("--chunks and --repeats must be >= 1")
    print("| event | bytes | meter us/chunk | json.loads us/event | stream.handle us/chunk |")
    print("|---|---:|---:|---:|---:|")
    for name, event in EVENTS.items():
        row = [per_chunk_us(f(event), args.chunks, args.repeats)
               for f in (meter_run, json_run, stream_run)]  # fmt: skip
        print(f"| {name} | {len(event)} | " + " | ".join(f"{v:.2f}" for v in row) + " |")


if __name__ == "__main__":
    main()
