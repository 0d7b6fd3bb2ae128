"""TLS on the ext_proc port: `epp serve --secure-serving` / `--cert-path` serve the
ext_proc port over TLS (a client trusting the certificate gets through, a plaintext one
does not), the health port stays plaintext (the kubelet's gRPC probe cannot do TLS),
every bad certificate input is one line and exit 2, and rotated `--cert-path` files are
served to new connections while a stream opened before the rotation carries on."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp.datastore import Endpoint
from epp.extproc.tls import load_cert_dir, self_signed
from epp.observability import REGISTRY
from epp.serve import EppServer, ServeOptions
from tests.eventually import eventually
from tests.integration.test_grpc_servicer import MODES, chunks, headers, open_stream

SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
EPP = [sys.executable, "-m", "epp.cli", "serve"]
EPP += ["--grpc-port", "0", "--health-port", "0", "--metrics-port", "0"]


async def check(channel: grpc.aio.Channel) -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    reply = await stub.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=10)
    return reply.status


@pytest.fixture
async def tls_server():
    cert = self_signed()
    opts = ServeOptions(
        host="127.0.0.1", grpc_port=0, health_port=0, metrics_port=0, scrape=False, tls=cert,
        endpoints=[Endpoint("e0", "127.0.0.1", 1)],
    )  # fmt: skip
    async with EppServer(opts) as server:
        yield server, cert


async def test_a_client_trusting_the_certificate_gets_through(tls_server):
    server, cert = tls_server
    creds = grpc.ssl_channel_credentials(root_certificates=cert.cert_pem)
    # The self-signed certificate names 127.0.0.1, so even a verifying client accepts it.
    async with grpc.aio.secure_channel(f"127.0.0.1:{server.grpc_port}", creds) as ch:
        assert await check(ch) == health_pb2.HealthCheckResponse.SERVING


async def test_a_plaintext_client_is_refused_on_the_ext_proc_port(tls_server):
    server, _ = tls_server
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as ch:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await check(ch)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_the_health_port_stays_plaintext(tls_server):
    server, _ = tls_server
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.health_port}") as ch:
        assert await check(ch) == health_pb2.HealthCheckResponse.SERVING


def write_cert(d, cert_pem: bytes, key_pem: bytes):
    d.mkdir()
    (d / "tls.crt").write_bytes(cert_pem)
    (d / "tls.key").write_bytes(key_pem)
    return str(d)


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*EPP, *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("missing", "not a directory (expected tls.crt and tls.key)"),
        ("no-key", "cannot read tls.key"),
        ("mismatch", "tls.key is not the key of tls.crt"),
        ("garbage", "tls.crt is not a PEM certificate"),
        ("contradiction", "--cert-path and --no-secure-serving contradict"),
    ],
)
def test_bad_certificate_input_is_one_line_and_exit_2(tmp_path, case, expected):
    a, b = self_signed(), self_signed()
    d = tmp_path / "certs"
    extra: list[str] = []
    if case == "missing":
        path = str(d)
    elif case == "no-key":
        path = write_cert(d, a.cert_pem, a.key_pem)
        (d / "tls.key").unlink()
    elif case == "mismatch":
        path = write_cert(d, a.cert_pem, b.key_pem)
    elif case == "garbage":
        path = write_cert(d, b"not a certificate", a.key_pem)
    else:
        path = write_cert(d, a.cert_pem, a.key_pem)
        extra = ["--no-secure-serving"]
    r = run("--cert-path", path, *extra)
    assert r.returncode == 2
    [line] = r.stderr.strip().splitlines()
    assert line.startswith("epp serve: --cert-path")
    assert expected in r.stderr and "Traceback" not in r.stderr


# ---- certificate reload (--cert-path, on by default; epp/extproc/cert_reload.py) ----------
def rotate(d, cert_pem: bytes, key_pem: bytes) -> None:
    """Both files replaced by rename (readers see old or new, as the kubelet's `..data`
    swap gives): the new files have new inodes, which the reload stamp notices."""
    for name, data in (("tls.crt", cert_pem), ("tls.key", key_pem)):
        tmp = d / (name + ".new")
        tmp.write_bytes(data)
        os.replace(tmp, d / name)


async def handshake(port: int, trusted: bytes) -> int:
    """A NEW connection that trusts only `trusted`: its health status, or the gRPC code."""
    creds = grpc.ssl_channel_credentials(root_certificates=trusted)
    async with grpc.aio.secure_channel(f"127.0.0.1:{port}", creds) as ch:
        try:
            return await check(ch)
        except grpc.aio.AioRpcError as e:
            return e.code()


def reloads(outcome: str) -> float:
    return (
        REGISTRY.get_sample_value("epp_tls_certificate_reloads_total", {"outcome": outcome}) or 0.0
    )


async def test_rotated_certificates_serve_new_connections_and_open_streams_carry_on(tmp_path):
    a, b, c = self_signed(), self_signed(), self_signed()  # each names 127.0.0.1
    d = tmp_path / "certs"
    write_cert(d, a.cert_pem, a.key_pem)
    cert = dataclasses.replace(load_cert_dir(d), reload_dir=str(d))  # as --cert-path does
    opts = ServeOptions(
        host="127.0.0.1", grpc_port=0, health_port=0, metrics_port=0, scrape=False, tls=cert,
        endpoints=[Endpoint("e0", "127.0.0.1", 9000)],
    )  # fmt: skip
    loaded0, failed0 = reloads("loaded"), reloads("failed")
    async with EppServer(opts) as server:
        port = server.grpc_port
        ok = health_pb2.HealthCheckResponse.SERVING
        creds = grpc.ssl_channel_credentials(root_certificates=a.cert_pem)
        async with grpc.aio.secure_channel(f"127.0.0.1:{port}", creds) as old:
            # An ext_proc stream opened under A, left half-way through its request body.
            stub = pb_grpc.ExternalProcessorStub(old)
            queue, call = open_stream(stub)
            body = json.dumps({"model": "m", "prompt": "rotate me"}).encode()
            first, second = chunks(body, 2)
            await queue.put(headers(MODES.FULL_DUPLEX_STREAMED))
            await queue.put(first)
            await eventually(lambda: server.servicer.open_streams == 1)

            # Half a rotation: B's certificate beside A's key. Not a pair: A stays.
            rotate(d, b.cert_pem, a.key_pem)
            assert await handshake(port, a.cert_pem) == ok
            assert await handshake(port, b.cert_pem) == grpc.StatusCode.UNAVAILABLE
            assert reloads("failed") - failed0 == 1 and reloads("loaded") == loaded0

            # The rotation completes: new connections get B, and only B.
            rotate(d, b.cert_pem, b.key_pem)
            assert await handshake(port, b.cert_pem) == ok
            assert await handshake(port, a.cert_pem) == grpc.StatusCode.UNAVAILABLE
            assert reloads("loaded") - loaded0 == 1

            # The stream opened under A finishes its request and is routed.
            await queue.put(second)
            reply = await call.read()
            assert reply.HasField("request_headers")
            mutation = reply.request_headers.response.header_mutation
            dest = {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}
            assert dest["x-gateway-destination-endpoint"] == "127.0.0.1:9000"
            await queue.put(None)
            # ...and the connection made under A still serves new calls.
            assert await check(old) == ok

            # A second rotation (a mounted Secret renewed again): C.
            rotate(d, c.cert_pem, c.key_pem)
            assert await handshake(port, c.cert_pem) == ok
            assert reloads("loaded") - loaded0 == 2


def test_cert_reload_needs_a_cert_path():
    r = run("--secure-serving", "--enable-cert-reload")
    assert r.returncode == 2
    [line] = r.stderr.strip().splitlines()
    assert "--enable-cert-reload re-reads --cert-path" in line and "Traceback" not in r.stderr
