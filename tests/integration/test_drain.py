"""SIGTERM drains a real `epp serve` (issue 13 §1g): health turns NOT_SERVING first, new
streams are refused, the open one is still answered, then the process exits 0."""

import asyncio
import json
import signal
import urllib.request

import grpc
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp.harness.localstack import EPP_CMD
from epp.harness.procs import HttpReady, LogReady, ProcessGroup, free_port
from epp.headers import DESTINATION_ENDPOINT
from tests.eventually import eventually
from tests.integration.test_grpc_servicer import headers, open_stream

BUFFERED = processing_mode_pb2.ProcessingMode.BUFFERED
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def healthy_endpoints(metrics_port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/debug/endpoints") as r:
        return sum(row["healthy"] for row in json.load(r))


async def test_sigterm_drains_open_streams_refuses_new_ones_and_exits_0(tmp_path):
    sim_port, gport, hport, mport = free_port(), free_port(), free_port(), free_port()
    with ProcessGroup(tmp_path) as pg:
        pg.start(
            "sim",
            [*EPP_CMD, "sim", "--port", str(sim_port), "--model", "m"],
            ready=HttpReady(f"http://127.0.0.1:{sim_port}/health"),
            timeout=60,
        )
        epp = pg.start(
            "epp",
            [
                *EPP_CMD,
                "serve",
                "--host",
                "127.0.0.1",
                "--grpc-port",
                str(gport),
                "--health-port",
                str(hport),
                "--metrics-port",
                str(mport),
                "--endpoint",
                f"sim=127.0.0.1:{sim_port}",
                "--drain-timeout",
                "60",
            ],
            ready=LogReady(r"epp serving ext_proc"),
            timeout=60,
        )

        async def one_healthy() -> bool:
            return await asyncio.to_thread(healthy_endpoints, mport) == 1

        await eventually(one_healthy)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{gport}")
        stub = pb_grpc.ExternalProcessorStub(channel)
        health = health_pb2_grpc.HealthStub(grpc.aio.insecure_channel(f"127.0.0.1:{hport}"))
        # An open request: in BUFFERED mode the EPP answers the headers at once, which
        # proves the stream is open on its side before the signal.
        queue, call = open_stream(stub)
        await queue.put(headers(BUFFERED))
        assert (await call.read()).WhichOneof("response") == "request_headers"

        epp.popen.send_signal(signal.SIGTERM)

        async def not_serving() -> bool:
            reply = await health.Check(health_pb2.HealthCheckRequest(service=""))
            return reply.status == NOT_SERVING

        await eventually(not_serving)
        # No message on it: the server refuses at once, and a client still sending would
        # race that refusal (grpc then reports its own failed send, not the server's status).
        refused = stub.Process(iter([]))
        try:
            got = [r async for r in refused]
        except grpc.aio.AioRpcError as e:
            assert e.code() == grpc.StatusCode.UNAVAILABLE
            assert "draining" in (e.details() or "")
        else:
            raise AssertionError(f"a new stream was served while draining: {got}")
        assert epp.popen.poll() is None  # still running: one stream is open

        body = json.dumps({"model": "m", "prompt": "finish me"}).encode()
        await queue.put(
            pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True))
        )
        answer = await call.read()
        assert answer.WhichOneof("response") == "request_body", answer
        mutation = answer.request_body.response.header_mutation
        dest = {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}
        assert dest[DESTINATION_ENDPOINT] == f"127.0.0.1:{sim_port}"
        await queue.put(None)  # the open request ends
        await channel.close()
        assert await asyncio.to_thread(epp.popen.wait, 60) == 0
        log = epp.output()
        assert "draining" in log and "Traceback" not in log
