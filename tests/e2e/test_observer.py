"""The observer response path (`--response-path observer`, deploy/envoy/envoy-observer.yaml)
through a real Envoy 1.40, `epp serve` and `epp sim`, on what only it sees: the EPP's own
refusals reach the observer filter as response-only streams (ignored, nothing leaks),
body-less requests are joined too, and a burst of concurrent streams all come back to 0.
Streaming, non-streaming, client disconnect and an upstream killed mid-stream run in
tests/e2e/test_response_path.py on both paths."""

import asyncio
import urllib.request

import aiohttp
import pytest

from epp.harness.localstack import LocalStack
from tests.e2e.test_response_path import STREAM, TIMEOUT, inflight, metric, wait_inflight_zero

pytestmark = pytest.mark.e2e

SIM_ARGS = ["--decode-ms-per-token", "10", "--prefill-ms-per-token", "0.02"]


@pytest.fixture(scope="module")
def stack():
    with LocalStack(n_sims=2, sim_args=SIM_ARGS, observer=True) as st:
        yield st


async def test_a_refused_request_reaches_the_observer_without_a_route_and_leaks_nothing(stack):
    async with (
        aiohttp.ClientSession(timeout=TIMEOUT) as session,
        session.post(stack.url + "/v1/completions", data=b"{not json") as r,
    ):
        assert r.status == 400 and b"not valid JSON" in await r.read()
    # then a routed one still measures and releases as usual
    before = metric(stack, "inference_objective_request_ttft_seconds_count")
    async with (
        aiohttp.ClientSession(timeout=TIMEOUT) as session,
        session.post(stack.url + "/v1/completions", json=STREAM) as r,
    ):
        assert r.status == 200 and b"[DONE]" in await r.read()
    await wait_inflight_zero(stack)
    assert metric(stack, "inference_objective_request_ttft_seconds_count") == before + 1


async def test_a_bodyless_request_is_joined_and_released(stack):
    async with (
        aiohttp.ClientSession(timeout=TIMEOUT) as session,
        session.get(stack.url + "/v1/models") as r,
    ):
        assert r.status == 200 and "data" in await r.json()
    await wait_inflight_zero(stack)


async def test_forty_concurrent_streams_all_come_back_to_zero(stack):
    before = metric(stack, "inference_objective_request_ttft_seconds_count")
    joins = metric(stack, "epp_response_observer_joins_total")
    body = {**STREAM, "max_tokens": 10}

    async def one(session):
        async with session.post(stack.url + "/v1/completions", json=body) as r:
            assert r.status == 200
            return await r.read()

    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        replies = await asyncio.gather(*(one(session) for _ in range(40)))
    assert all(b"[DONE]" in x for x in replies)
    await wait_inflight_zero(stack)
    assert inflight(stack) == 0
    # every one observed: 40 TTFTs (none lost to a wrong join)
    assert metric(stack, "inference_objective_request_ttft_seconds_count") == before + 40
    # 40 joins, every one "joined" (none expired, foreign or unknown)
    assert metric(stack, "epp_response_observer_joins_total") == joins + 40
    text = urllib.request.urlopen(stack.epp_metrics_url + "/metrics", timeout=5).read().decode()
    assert 'epp_response_observer_joins_total{outcome="expired"} 0.0' in text
