"""The cheapest correct ext_proc server: every request goes to one fixed `--destination`.

Baseline (b) of the overhead benchmark (client -> Envoy -> this -> upstream): whatever the
real EPP costs beyond this is scheduling, parsing and bookkeeping, not the protocol. It speaks
the protocol exactly like the EPP so the comparison is fair, and the e2e harness uses it to
prove that deploy/envoy/envoy.yaml routes end to end.

Protocol in FULL_DUPLEX_STREAMED (the mode the EPP needs), as Envoy 1.40 behaves:
  * Envoy sends request_headers, then request_body chunks *without waiting* for the header
    response, then (only if the client sent trailers) request_trailers.
  * The server answers request_headers first (like the EPP, this one holds it until the body is
    complete), then the body as BodyResponse.streamed_response chunks; the last chunk carries
    end_of_stream=true. Chunk boundaries need not match Envoy's. A body response before the
    header response, a plain body_mutation or an empty BodyResponse is a "spurious message":
    HTTP 500.
  * If the client sent trailers, the body never sees end_of_stream: the last streamed chunk must
    carry end_of_stream=false and a TrailersResponse must follow, else the request hangs.
  * message_timeout is not armed in this mode: a request the server never answers hangs.
  * After the last response it needs, Envoy closes the stream (the RPC may end "cancelled").
In BUFFERED / STREAMED modes the header response must come first (Envoy holds the body until
it arrives) and each body message gets an empty BodyResponse ("continue unchanged").

    python bench/minimal_extproc.py --port 9002 --health-port 9003 --destination 10.0.0.7:8000
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from epp.headers import DESTINATION_ENDPOINT

EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
# Same chunking as the EPP: stays well under gRPC/HTTP2 frame and message defaults.
BODY_CHUNK_BYTES = 62_000

FULL_DUPLEX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED


def header_response(destination: str) -> pb.ProcessingResponse:
    """Route to `destination`; overwrite (never append to) a client-supplied header value."""
    option = base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=DESTINATION_ENDPOINT, raw_value=destination.encode()),
        append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
    )
    common = pb.CommonResponse(
        header_mutation=pb.HeaderMutation(set_headers=[option]),
        # Re-match routes against the mutated headers, as the EPP does. This config's single
        # route does not depend on it (ORIGINAL_DST reads the header at connect time), but
        # routes matching on the header would. Ignored by Envoy without a header_mutation.
        clear_route_cache=True,
    )
    return pb.ProcessingResponse(request_headers=pb.HeadersResponse(response=common))


def streamed_body(kind: str, body: bytes, end_of_stream: bool) -> Iterator[pb.ProcessingResponse]:
    """`body` as streamed_response chunks of at most BODY_CHUNK_BYTES (one if empty)."""
    offsets = range(0, len(body), BODY_CHUNK_BYTES) if body else [0]
    last = offsets[-1]
    for start in offsets:
        streamed = pb.StreamedBodyResponse(
            body=body[start : start + BODY_CHUNK_BYTES],
            end_of_stream=end_of_stream and start == last,
        )
        mutation = pb.BodyMutation(streamed_response=streamed)
        body_response = pb.BodyResponse(response=pb.CommonResponse(body_mutation=mutation))
        yield pb.ProcessingResponse(**{kind: body_response})


@dataclass
class StreamState:
    """One HTTP request's conversation. Pure: messages in, responses out, no I/O."""

    destination: str
    request_body_mode: int = FULL_DUPLEX
    response_body_mode: int = processing_mode_pb2.ProcessingMode.NONE
    headers_answered: bool = False
    body: bytearray = field(default_factory=bytearray)

    def on_message(self, req: pb.ProcessingRequest) -> Iterator[pb.ProcessingResponse]:
        if req.HasField("protocol_config"):  # sent on the first message of each stream
            self.request_body_mode = req.protocol_config.request_body_mode
            self.response_body_mode = req.protocol_config.response_body_mode
        kind = req.WhichOneof("request")
        if kind == "request_headers":
            yield from self._request_headers(req.request_headers)
        elif kind == "request_body":
            yield from self._request_body(req.request_body)
        elif kind == "request_trailers":
            yield from self._request_trailers()
        elif kind == "response_headers":
            yield pb.ProcessingResponse(response_headers=pb.HeadersResponse())
        elif kind == "response_body":
            yield from self._response_body(req.response_body)
        elif kind == "response_trailers":
            yield pb.ProcessingResponse(response_trailers=pb.TrailersResponse())

    def _answer_headers(self) -> Iterator[pb.ProcessingResponse]:
        if not self.headers_answered:
            self.headers_answered = True
            yield header_response(self.destination)

    def _request_headers(self, msg: pb.HttpHeaders) -> Iterator[pb.ProcessingResponse]:
        # Hold the answer for the body only in FULL_DUPLEX_STREAMED: other modes would deadlock.
        if msg.end_of_stream or self.request_body_mode != FULL_DUPLEX:
            yield from self._answer_headers()

    def _request_body(self, msg: pb.HttpBody) -> Iterator[pb.ProcessingResponse]:
        if self.request_body_mode != FULL_DUPLEX:
            yield pb.ProcessingResponse(request_body=pb.BodyResponse())
            return
        self.body += msg.body
        if msg.end_of_stream:
            yield from self._flush_body(end_of_stream=True)

    def _request_trailers(self) -> Iterator[pb.ProcessingResponse]:
        # Trailers end the body when the client sent some: the last data frame had no EoS.
        if self.request_body_mode == FULL_DUPLEX:
            yield from self._flush_body(end_of_stream=False)
        yield pb.ProcessingResponse(request_trailers=pb.TrailersResponse())

    def _flush_body(self, end_of_stream: bool) -> Iterator[pb.ProcessingResponse]:
        yield from self._answer_headers()
        body, self.body = bytes(self.body), bytearray()
        yield from streamed_body("request_body", body, end_of_stream)

    def _response_body(self, msg: pb.HttpBody) -> Iterator[pb.ProcessingResponse]:
        if self.response_body_mode == FULL_DUPLEX:
            yield from streamed_body("response_body", msg.body, msg.end_of_stream)
        else:
            yield pb.ProcessingResponse(response_body=pb.BodyResponse())


class MinimalExtProc(pb_grpc.ExternalProcessorServicer):
    def __init__(self, destination: str) -> None:
        self.destination = destination

    async def Process(
        self, request_iterator: AsyncIterator[pb.ProcessingRequest], context: object
    ) -> AsyncIterator[pb.ProcessingResponse]:
        state = StreamState(self.destination)
        async for req in request_iterator:
            for resp in state.on_message(req):
                yield resp


async def serve(
    destination: str, port: int, health_port: int | None = None, host: str = "127.0.0.1"
) -> list[grpc.aio.Server]:
    """Start the ext_proc server (and grpc.health.v1 on its own port, like the EPP)."""
    # so_reuseport off: a port collision must fail loudly, not split traffic between servers.
    # Envoy sends body chunks of up to 1 MiB in FULL_DUPLEX_STREAMED, but the whole buffer in
    # BUFFERED(_PARTIAL) modes: raise gRPC's 4 MiB default so this is never the limit.
    options = [("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", 64 << 20)]
    server = grpc.aio.server(options=options)
    pb_grpc.add_ExternalProcessorServicer_to_server(MinimalExtProc(destination), server)
    _bind(server, host, port)
    servers = [server]
    if health_port is not None:
        health_server = grpc.aio.server(options=options)
        servicer = health.aio.HealthServicer()
        for service in ("", EXT_PROC_SERVICE):
            await servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(servicer, health_server)
        _bind(health_server, host, health_port)
        servers.append(health_server)
    for s in servers:
        await s.start()
    return servers


def _bind(server: grpc.aio.Server, host: str, port: int) -> None:
    if server.add_insecure_port(f"{host}:{port}") == 0:
        raise OSError(f"cannot bind {host}:{port}")


async def _main(args: argparse.Namespace) -> None:
    servers = await serve(args.destination, args.port, args.health_port, args.host)
    print(
        f"minimal ext_proc listening on {args.host}:{args.port} "
        f"(health {args.health_port}) -> {args.destination}",
        flush=True,
    )
    await asyncio.gather(*(s.wait_for_termination() for s in servers))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--destination", required=True, help="ip:port every request goes to")
    parser.add_argument("--port", type=int, default=9002, help="ext_proc gRPC port")
    parser.add_argument("--health-port", type=int, default=None, help="grpc.health.v1 port")
    parser.add_argument("--host", default="127.0.0.1", help="bind address")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(_main(args))


if __name__ == "__main__":
    main()
