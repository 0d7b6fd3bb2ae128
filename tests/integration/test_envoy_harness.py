"""The process harness and the shipped Envoy config, proven end to end.

client -> real Envoy (deploy/envoy/envoy.yaml via epp.harness.envoy) -> bench/minimal_extproc.py
-> the upstream it names. Two echo upstreams run, so "reached the named one" is a real check.
The ProcessGroup tests need no Envoy and run everywhere.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import sys
import threading
import time
import urllib.request
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest
import yaml
from aiohttp import web

from epp.harness.envoy import (
    EnvoyOptions,
    RunningEnvoy,
    astart_envoy,
    envoy_binary,
    load_template,
    render,
    start_envoy,
    validate_config,
    write_config,
)
from epp.harness.procs import (
    AllReady,
    LogReady,
    PortReady,
    ProcessError,
    ProcessGroup,
    free_port,
)
from epp.headers import DESTINATION_ENDPOINT
from tests.eventually import eventually_sync

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[2]
MINIMAL_EXTPROC = REPO / "bench" / "minimal_extproc.py"


def _gone(pid: int) -> bool:
    """Dead or a zombie nobody reaped yet (container PID 1 may never reap)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


# ---------------------------------------------------------------- ProcessGroup


def test_children_die_when_the_with_block_raises() -> None:
    with pytest.raises(RuntimeError, match="boom"), ProcessGroup() as pg:
        pid = pg.start("sleeper", ["sleep", "100"]).pid
        assert not _gone(pid)
        raise RuntimeError("boom")
    assert _gone(pid)


def test_early_death_names_the_child_and_quotes_its_log() -> None:
    script = "print('cannot bind: address in use'); raise SystemExit(3)"
    with ProcessGroup() as pg, pytest.raises(ProcessError) as err:
        pg.start("crasher", [sys.executable, "-c", script], ready=PortReady(free_port()))
    message = str(err.value)
    assert "crasher" in message
    assert "exited with code 3" in message
    assert "cannot bind: address in use" in message


def test_sigterm_ignored_escalates_to_sigkill() -> None:
    script = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('up', flush=True); time.sleep(100)"
    )
    with ProcessGroup(grace_s=0.3) as pg:
        proc = pg.start("stubborn", [sys.executable, "-c", script], ready=LogReady(r"^up$"))
    assert proc.returncode == -signal.SIGKILL


_PARENT_SCRIPT = """
import sys, time
from epp.harness.procs import ProcessGroup
pg = ProcessGroup(sys.argv[1])  # a SIGKILLed parent cannot remove its own temp dir
child = pg.start("sleeper", ["sleep", "100"])
print("child", child.pid, flush=True)
time.sleep(100)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_children_die_with_the_parent(sig: signal.Signals, tmp_path: Path) -> None:
    """SIGTERM/SIGINT unwind + atexit; SIGKILL relies on PR_SET_PDEATHSIG."""
    argv = [sys.executable, "-c", _PARENT_SCRIPT, str(tmp_path / "parent-run")]
    with ProcessGroup() as pg:
        parent = pg.start("parent", argv, ready=LogReady(r"child \d+"))
        child_pid = int(parent.output().split("child", 1)[1].split()[0])
        assert not _gone(child_pid)
        os.kill(parent.pid, sig)
        parent.popen.wait(timeout=10)
        eventually_sync(
            lambda: _gone(child_pid), f"{sig.name}: child {child_pid} to die with its parent"
        )


# ---------------------------------------------------------------- rendering (no Envoy needed)


def test_render_overrides_by_name_and_derives_trailer_modes() -> None:
    options = EnvoyOptions(
        listener_port=1111,
        admin_port=2222,
        epp_grpc_port=3333,
        epp_health_port=4444,
        epp_host="epp.ns.svc",
        request_body_mode="BUFFERED",
        response_headers=True,
        response_body_mode="FULL_DUPLEX_STREAMED",
    )
    config = render(options)
    text = yaml.safe_dump(config)
    assert config["admin"]["address"]["socket_address"]["port_value"] == 2222
    listener = config["static_resources"]["listeners"][0]
    assert listener["address"]["socket_address"]["port_value"] == 1111
    ext_proc = next(c for c in config["static_resources"]["clusters"] if c["name"] == "ext_proc")
    assert ext_proc["type"] == "STRICT_DNS"
    endpoint = ext_proc["load_assignment"]["endpoints"][0]["lb_endpoints"][0]
    assert endpoint["endpoint"]["address"]["socket_address"]["port_value"] == 3333
    assert endpoint["endpoint"]["health_check_config"]["port_value"] == 4444
    assert options.processing_mode == {
        "request_header_mode": "SEND",
        "request_body_mode": "BUFFERED",
        "request_trailer_mode": "SKIP",
        "response_header_mode": "SEND",
        "response_body_mode": "FULL_DUPLEX_STREAMED",
        "response_trailer_mode": "SEND",
    }
    assert "response_body_mode: FULL_DUPLEX_STREAMED" in text
    assert load_template() != config  # the template itself is never mutated


# ---------------------------------------------------------------- upstream echo servers


class EchoUpstreams:
    """aiohttp echo servers on their own thread + loop, so sync fixtures can share them."""

    def __init__(self, count: int) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.runners: list[web.AppRunner] = []
        self.ports = [self._call(self._serve()) for _ in range(count)]

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    async def _serve(self) -> int:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", _echo)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.runners.append(runner)
        return runner.addresses[0][1]

    def close(self) -> None:
        for runner in self.runners:
            self._call(runner.cleanup())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


async def _echo(request: web.Request) -> web.Response:
    body = await request.read()
    return web.json_response(
        {
            "port": request.transport.get_extra_info("sockname")[1],
            "method": request.method,
            "path": request.path,
            "headers": {k.lower(): v for k, v in request.headers.items()},
            "body": body.decode(),
        }
    )


@dataclass(frozen=True)
class Gateway:
    envoy: RunningEnvoy
    target_port: int  # the upstream the ext_proc servicer names
    decoy_port: int  # another live upstream nobody should reach


@pytest.fixture(scope="module")
def upstreams() -> Iterator[EchoUpstreams]:
    servers = EchoUpstreams(2)
    yield servers
    servers.close()


def _start_extproc(pg: ProcessGroup, destination_port: int) -> tuple[int, int]:
    grpc_port, health_port = free_port(), free_port()
    argv = [sys.executable, str(MINIMAL_EXTPROC), "--destination", f"127.0.0.1:{destination_port}"]
    argv += ["--port", str(grpc_port), "--health-port", str(health_port)]
    pg.start("extproc", argv, ready=AllReady(PortReady(grpc_port), PortReady(health_port)))
    return grpc_port, health_port


def _local_options(grpc_port: int, health_port: int, **modes: object) -> EnvoyOptions:
    return EnvoyOptions.loopback(grpc_port, health_port, **modes)


@pytest.fixture(scope="module")
def gateway(upstreams: EchoUpstreams) -> Iterator[Gateway]:
    target, decoy = upstreams.ports
    with ProcessGroup() as pg:
        grpc_port, health_port = _start_extproc(pg, target)
        envoy = start_envoy(pg, _local_options(grpc_port, health_port), concurrency=2)
        yield Gateway(envoy, target, decoy)


def _json_body(size: int) -> bytes:
    """An OpenAI-style body of about `size` bytes, with non-ASCII so re-encoding would show."""
    prompt = ("héllo wörld " * (size // 12 + 1))[:size]
    return json.dumps(
        {"model": "m", "prompt": prompt, "max_tokens": 8}, ensure_ascii=False
    ).encode()


# ---------------------------------------------------------------- through Envoy


async def _send(method: str, url: str, **kwargs: object) -> dict:
    """One request through Envoy; returns the echo upstream's JSON (fails on non-200)."""
    async with aiohttp.ClientSession() as session, session.request(method, url, **kwargs) as resp:
        assert resp.status == 200, f"{resp.status}: {await resp.text()}"
        return await resp.json()


@pytest.mark.e2e
async def test_get_reaches_the_named_upstream(gateway: Gateway) -> None:
    echoed = await _send("GET", gateway.envoy.url + "/v1/models")
    assert echoed["port"] == gateway.target_port
    assert echoed["method"] == "GET"
    assert echoed["path"] == "/v1/models"
    assert echoed["headers"][DESTINATION_ENDPOINT] == f"127.0.0.1:{gateway.target_port}"


@pytest.mark.e2e
@pytest.mark.parametrize("size", [100, 300_000, 3_000_000], ids=["small", "300KB", "3MB"])
async def test_post_body_arrives_intact(gateway: Gateway, size: int) -> None:
    """3 MB exceeds Envoy's 1 MiB buffer and needs many 62 kB streamed_response chunks."""
    body = _json_body(size)
    headers = {"content-type": "application/json"}
    echoed = await _send("POST", gateway.envoy.url + "/v1/completions", data=body, headers=headers)
    assert echoed["port"] == gateway.target_port
    assert echoed["method"] == "POST"
    assert echoed["headers"]["content-type"] == "application/json"
    received = echoed["body"].encode()
    assert len(received) == len(body)
    assert hashlib.sha256(received).digest() == hashlib.sha256(body).digest()


@pytest.mark.e2e
async def test_client_cannot_pick_its_own_endpoint(gateway: Gateway) -> None:
    spoofed = {DESTINATION_ENDPOINT: f"127.0.0.1:{gateway.decoy_port}"}
    url = gateway.envoy.url + "/v1/completions"
    echoed = await _send("POST", url, data=_json_body(100), headers=spoofed)
    assert echoed["port"] == gateway.target_port
    assert echoed["headers"][DESTINATION_ENDPOINT] == f"127.0.0.1:{gateway.target_port}"


@pytest.mark.e2e
def test_ext_proc_cluster_health_checks_the_separate_health_port(gateway: Gateway) -> None:
    deadline = time.monotonic() + 10
    while True:
        with urllib.request.urlopen(gateway.envoy.admin_url + "/clusters", timeout=2) as resp:
            lines = resp.read().decode().splitlines()
        flags = [ln for ln in lines if ln.startswith("ext_proc::") and "::health_flags::" in ln]
        if flags and all(ln.endswith("::healthy") for ln in flags):
            return
        assert time.monotonic() < deadline, f"ext_proc never healthy: {flags}"
        time.sleep(0.2)


@pytest.mark.e2e
async def test_buffered_mode_through_the_async_api(upstreams: EchoUpstreams) -> None:
    """The request_body_mode knob: BUFFERED needs an immediate header answer, then a body one."""
    target = upstreams.ports[0]
    async with ProcessGroup() as pg:
        grpc_port, health_port = _start_extproc(pg, target)
        options = _local_options(grpc_port, health_port, request_body_mode="BUFFERED")
        envoy = await astart_envoy(pg, options, concurrency=1)
        body = _json_body(300_000)
        echoed = await _send("POST", envoy.url + "/v1/completions", data=body)
        assert echoed["port"] == target
        assert echoed["body"].encode() == body
        envoy_pid = envoy.process.pid
    assert _gone(envoy_pid)


async def test_request_trailers_end_the_body(upstreams: EchoUpstreams) -> None:
    """With trailers, the body never sees end_of_stream: the servicer must end it on trailers.

    Envoy drops HTTP/1 trailers unless enable_trailers is set; HTTP/2 clients can always send
    them, so the EPP must handle this path even with the shipped config.
    """
    target = upstreams.ports[0]
    async with ProcessGroup() as pg:
        grpc_port, health_port = _start_extproc(pg, target)
        options = _local_options(grpc_port, health_port)
        config = render(options)
        hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        hcm["typed_config"]["http_protocol_options"] = {"enable_trailers": True}
        await astart_envoy(pg, options, config=config, concurrency=1)

        body = b'{"model": "m", "prompt": "with trailers"}'
        request = (
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"Transfer-Encoding: chunked\r\nTrailer: x-checksum\r\n\r\n"
            + f"{len(body):x}\r\n".encode()
            + body
            + b"\r\n0\r\nx-checksum: 42\r\n\r\n"
        )
        reader, writer = await asyncio.open_connection("127.0.0.1", options.listener_port)
        writer.write(request)
        response = await asyncio.wait_for(reader.read(), timeout=10)
        writer.close()
    status_line, _, payload = response.partition(b"\r\n")
    assert status_line == b"HTTP/1.1 200 OK", response[:500]
    head, _, raw = payload.partition(b"\r\n\r\n")
    # The shipped response path (the access log) leaves the response untouched, length
    # and all; in-path, Envoy streams the body through the EPP and could not know it.
    assert b"content-length: " in head.lower()
    echoed = json.loads(raw)
    assert echoed["port"] == target
    assert echoed["body"].encode() == body


@pytest.mark.e2e
def test_shipped_and_rendered_configs_pass_envoy_validation(tmp_path: Path) -> None:
    variants = {
        "default": EnvoyOptions(),
        "response_full_duplex": EnvoyOptions(
            response_headers=True, response_body_mode="FULL_DUPLEX_STREAMED"
        ),
        "streamed": EnvoyOptions(request_body_mode="STREAMED", response_body_mode="STREAMED"),
    }
    paths = {"shipped": REPO / "deploy" / "envoy" / "envoy.yaml"}
    paths |= {
        name: write_config(opts, tmp_path / f"{name}.yaml") for name, opts in variants.items()
    }
    # Validation is ~1 s of Envoy start-up each: run them side by side.
    with ProcessGroup(tmp_path / "logs") as pg:
        validators = [
            pg.spawn(name, [envoy_binary(), "--mode", "validate", "-c", str(path), "-l", "error"])
            for name, path in paths.items()
        ]
        for proc in validators:
            assert proc.popen.wait(timeout=60) == 0, f"{proc.name}: {proc.tail()}"


@pytest.mark.e2e
def test_validation_rejects_full_duplex_without_request_trailers(tmp_path: Path) -> None:
    """The constraint the derived trailer modes exist for; guards against Envoy relaxing it."""
    config = render(EnvoyOptions())
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    ext_proc = hcm["typed_config"]["http_filters"][0]["typed_config"]
    ext_proc["processing_mode"]["request_trailer_mode"] = "SKIP"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ValueError, match="request_trailer_mode has to be set to SEND"):
        validate_config(path)


@pytest.mark.e2e
async def test_unreachable_epp_gets_a_503_json_error_not_an_empty_500() -> None:
    """Nothing listens on the ext_proc port: Envoy's local reply config answers for the EPP
    in the EPP's own error shape, so a client can tell "retry" from "bad request"."""
    grpc_port, health_port = free_port(), free_port()  # closed: no EPP
    with ProcessGroup() as pg:
        envoy = start_envoy(pg, _local_options(grpc_port, health_port))
        async with (
            aiohttp.ClientSession() as session,
            session.post(envoy.url + "/v1/completions", json={"model": "m"}) as resp,
        ):
            body = await resp.json(content_type=None)
            assert resp.status == 503
            assert resp.headers["content-type"] == "application/json"
    assert body["error"]["type"] == "service_unavailable"
    assert body["error"]["code"] == "endpoint_picker_unavailable"
    assert "endpoint picker is unavailable" in body["error"]["message"]
