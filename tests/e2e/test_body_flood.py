"""Holding request bodies through real Envoy: no client can lock the others out.

The probe this answers: 32 connections each holding an unfinished 8 MiB body filled the
EPP's whole 256 MiB body budget and every other request got 503 until the body timeout.
Now one address holds at most its share (the rest get 429), bodies from many addresses
leave the small-request reserve free, and ordinary requests see no error at all."""

from __future__ import annotations

import asyncio
import json
import socket
from urllib.parse import urlparse

import aiohttp

from epp.harness.body_flood import attack_sources, good_traffic, hold_bodies
from epp.harness.localstack import LocalStack
from tests.e2e.client import send

MiB = 1 << 20
SIM_ARGS = ["--decode-ms-per-token", "1"]


async def test_32_held_8_mib_bodies_leave_good_requests_at_zero_errors():
    with LocalStack(n_sims=2, sim_args=SIM_ARGS) as stack:
        u = urlparse(stack.url)
        for spread, most_held in ((False, 8), (True, 28)):
            held = await hold_bodies(u.hostname, u.port, attack_sources(32, spread), 8 * MiB)
            try:
                statuses = [h.status for h in held]
                # one address: its 64 MiB share (429 beyond); 32 addresses: the 224 MiB
                # that large bodies may take (503 beyond); either way the rest is refused
                assert sum(s is None for s in statuses) <= most_held
                assert set(statuses) <= {None, 429 if not spread else 503}
                traffic = await good_traffic(stack.url, 40)
                assert (traffic.ok, traffic.errors) == (40, {})
            finally:
                for h in held:
                    h.close()


async def test_a_trickled_body_gets_408_early_and_an_unknown_model_is_clipped():
    args = ["--min-body-rate-grace", "0.5", "--body-timeout", "120"]
    with LocalStack(n_sims=1, sim_args=SIM_ARGS, epp_args=args) as stack:
        u = urlparse(stack.url)
        loop = asyncio.get_running_loop()

        def trickle() -> bytes:
            with socket.create_connection((u.hostname, u.port), timeout=60) as s:
                s.sendall(
                    b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: "
                    b"application/json\r\ncontent-length: 100000\r\n\r\n{"
                )
                s.settimeout(0.2)
                reply = b""
                for _ in range(600):  # one byte every 0.2 s, far below 64 KiB/s
                    try:
                        reply += s.recv(65536)
                        if b"\r\n\r\n" in reply and reply.endswith(b"}"):
                            break
                    except TimeoutError:
                        s.sendall(b" ")
                return reply

        reply = await loop.run_in_executor(None, trickle)
        assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
        assert b"request_body_too_slow" in reply
        async with aiohttp.ClientSession() as http:
            r = await send(http, stack.url, {"model": "m" * 1_000_000, "prompt": "x"})
        assert r.status == 404
        assert len(r.body) < 2000
        assert "not served" in json.loads(r.body)["error"]["message"]
