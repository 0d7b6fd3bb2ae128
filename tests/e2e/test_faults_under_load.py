"""Faults under load through a real Envoy, `epp serve` and simulator processes (issue 13
§3), bounded in time: each fault costs exactly the requests it touches, and the EPP's
in-flight counts come back to zero."""

import asyncio

import aiohttp
import pytest

from epp.headers import SIM_SERVER
from tests.e2e.client import burst, debug_endpoints, servers, sim_prefix
from tests.eventually import eventually

pytestmark = pytest.mark.e2e

# 400 tokens at 8 ms each (~3 s): streams last well past the moment the victim is killed
STREAM_BODY = {"model": "tiny", "prompt": "Tell a long story.", "max_tokens": 400, "stream": True}
BODY = {"model": "tiny", "prompt": "Say something.", "max_tokens": 4}


async def test_an_endpoint_killed_mid_stream_fails_only_its_own_requests(fresh_stack):
    st = fresh_stack
    loop = asyncio.get_running_loop()
    n = 9
    first_chunks = 0
    kill_now = asyncio.Event()
    window: list[float] = []  # loop time just before and just after the kill

    async def one(session: aiohttp.ClientSession) -> tuple[str | None, bool, float]:
        """(endpoint that served it, completed with [DONE], loop time it ended)."""
        nonlocal first_chunks
        async with session.post(st.url + "/v1/completions", json=STREAM_BODY) as r:
            assert r.status == 200
            server = sim_prefix(r.headers.get(SIM_SERVER))
            body = b""
            try:
                async for chunk in r.content.iter_any():
                    if not body:
                        first_chunks += 1
                        if first_chunks == n:
                            kill_now.set()
                    body += chunk
            except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError):
                return server, False, loop.time()
            return server, b"data: [DONE]" in body, loop.time()

    async def killer() -> str:
        await kill_now.wait()  # every stream is under way
        window.append(loop.time())
        # the victim: the endpoint with the most requests, so at least one is cut off
        rows = await asyncio.to_thread(debug_endpoints, st)
        victim = max(rows, key=lambda row: row["inflight_requests"])
        assert victim["inflight_requests"] > 0
        await asyncio.to_thread(
            st.kill_sim, next(i for i, s in enumerate(st.sims) if s.name == victim["name"])
        )
        window.append(loop.time())
        return victim["name"]

    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        victim, results = await asyncio.gather(
            killer(), asyncio.gather(*(one(session) for _ in range(n)))
        )
    # Only streams still open after the kill were touched by it (those that ended before,
    # or while it happened, are neither).
    open_after = [(server, ok) for server, ok, ended in results if ended > window[1]]
    on_victim = [ok for server, ok in open_after if server == victim]
    elsewhere = [ok for server, ok in open_after if server != victim]
    assert on_victim and not any(on_victim), results  # its open streams were cut off
    assert all(elsewhere), results  # nobody else lost a request
    assert all(ok for server, ok, ended in results if ended < window[0]), results

    def released() -> bool:
        return all(row["inflight_requests"] == 0 for row in debug_endpoints(st))

    await eventually(released, "in-flight counts back to 0", blocking=True, interval=0.1)
    after = await burst(st.url, 9, 3, BODY)  # and the pool keeps serving without it
    assert [r.status for r in after] == [200] * 9
    assert f"{victim}-0" not in servers(after)


async def test_a_hanging_endpoint_stops_being_picked_and_comes_back(fresh_stack):
    st = fresh_stack
    hung = st.sims[0]

    async def admin(faults: dict) -> None:
        async with aiohttp.ClientSession() as s, s.post(f"{hung.url}/admin", json=faults) as r:
            assert r.status == 200

    def health_of_hung() -> bool:
        return next(r["healthy"] for r in debug_endpoints(st) if r["name"] == hung.name)

    await admin({"metrics": False})  # /metrics never answers: scrapes time out
    await eventually(
        lambda: not health_of_hung(),
        "the hung endpoint marked unhealthy",
        blocking=True,
        interval=0.1,
    )
    replies = await burst(st.url, 18, 3, BODY)
    assert [r.status for r in replies] == [200] * 18
    assert f"{hung.name}-0" not in servers(replies)
    await admin({"metrics": True})
    await eventually(health_of_hung, "the endpoint healthy again", blocking=True, interval=0.1)
