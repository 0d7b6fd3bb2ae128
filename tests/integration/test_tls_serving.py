"""TLS on the ext_proc port: `epp serve --secure-serving` / `--cert-path` serve the
ext_proc port over TLS (a client trusting the certificate gets through, a plaintext one
does not), the health port stays plaintext (the kubelet's gRPC probe cannot do TLS),
and every bad certificate input is one line and exit 2."""

from __future__ import annotations

import subprocess
import sys

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp.datastore import Endpoint
from epp.extproc.tls import self_signed
from epp.serve import EppServer, ServeOptions

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
