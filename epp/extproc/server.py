"""The gRPC side: the ext_proc servicer and the health service.

One `RequestStream` per `Process` call; whatever way the stream ends (end of response,
Envoy closing it, cancellation) its `close()` runs and in-flight counts are given back
(exactly once: the end of the response usually gave them back already).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from epp.completion import ResponseObserver
from epp.datastore import Datastore
from epp.director import Director
from epp.extproc.stream import Phase, RequestStream

log = logging.getLogger("epp.extproc")

EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024


class ExtProcServicer(pb_grpc.ExternalProcessorServicer):
    def __init__(
        self,
        director: Director,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        observer: ResponseObserver | None = None,
    ) -> None:
        self.director = director
        self.max_body_bytes = max_body_bytes
        self.observer = observer
        self.open_streams = 0
        self._warned_no_response = False

    async def Process(
        self,
        request_iterator: AsyncIterator[pb.ProcessingRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.ProcessingResponse]:
        stream = RequestStream(self.director, self.max_body_bytes, self.observer)
        self.open_streams += 1
        try:
            async for msg in request_iterator:
                for resp in await stream.handle_async(msg):
                    yield resp
            self._check_response_phases(stream)
        finally:
            self.open_streams -= 1
            stream.close()

    def _check_response_phases(self, stream: RequestStream) -> None:
        """Envoy closed a routed stream without sending its response: its config skips
        the response phases, so in-flight counts end at routing. Say so once."""
        if self.observer is None or self._warned_no_response or stream.phase is not Phase.ROUTED:
            return
        self._warned_no_response = True
        log.warning(
            "the response path is on but Envoy sent no response phases: in-flight counts "
            "end at routing and no response is measured. Set the ext_proc processing_mode "
            "response_header_mode SEND, response_body_mode FULL_DUPLEX_STREAMED, "
            "response_trailer_mode SEND (deploy/envoy/envoy.yaml), or run with "
            "--response-path off"
        )


class HealthReporter:
    """SERVING for the ext_proc service (and "") once the pool has endpoints."""

    def __init__(self, datastore: Datastore) -> None:
        self.servicer = health.aio.HealthServicer()
        self.datastore = datastore

    async def refresh(self) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if len(self.datastore)
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for service in ("", EXT_PROC_SERVICE):
            await self.servicer.set(service, status)


async def start_grpc_servers(
    director: Director,
    datastore: Datastore,
    host: str,
    grpc_port: int,
    health_port: int,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    observer: ResponseObserver | None = None,
) -> tuple[grpc.aio.Server, grpc.aio.Server, ExtProcServicer, HealthReporter, int, int]:
    """Start the ext_proc server (also answering health) and the separate health server.

    Returns the servers, the servicer, the health reporter and the bound ports (port 0
    picks a free one).
    """
    health_reporter = HealthReporter(datastore)
    servicer = ExtProcServicer(director, max_body_bytes, observer)
    options = [
        ("grpc.max_receive_message_length", max_body_bytes + 1024 * 1024),
        ("grpc.max_send_message_length", max_body_bytes + 1024 * 1024),
        ("grpc.so_reuseport", 0),
    ]
    main = grpc.aio.server(options=options)
    pb_grpc.add_ExternalProcessorServicer_to_server(servicer, main)
    health_pb2_grpc.add_HealthServicer_to_server(health_reporter.servicer, main)
    bound_grpc = main.add_insecure_port(f"{host}:{grpc_port}")
    health_server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    health_pb2_grpc.add_HealthServicer_to_server(health_reporter.servicer, health_server)
    bound_health = health_server.add_insecure_port(f"{host}:{health_port}")
    if not bound_grpc or not bound_health:
        raise OSError(f"could not bind gRPC ports {host}:{grpc_port} / {host}:{health_port}")
    await health_reporter.refresh()
    await main.start()
    await health_server.start()
    return main, health_server, servicer, health_reporter, bound_grpc, bound_health
