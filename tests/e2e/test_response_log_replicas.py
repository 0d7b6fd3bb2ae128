"""Two `epp serve` replicas behind one real Envoy, on the access-log response path and in
the path: which of them learn when their requests end.

Envoy's gRPC access logger opens its stream to one host of its cluster. With one logger
per EPP (deploy/envoy/envoy-replicas.yaml) every replica sees every entry and ends its own
requests at once; with one logger on the cluster of both, as an Envoy reaching the EPPs
through one Kubernetes Service has it, the entries for the other replica's requests reach
the wrong one (counted `foreign`) and those requests are only given back by
`--response-log-timeout`, unmeasured (`expired`). So the Kubernetes manifests run several
replicas with `--response-path on` (tests/unit/test_gateway_manifests.py), where each
replica measures the responses on its own routing streams."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import aiohttp
import pytest

from epp.harness.localstack import LocalStack

pytestmark = pytest.mark.e2e

SIM_ARGS = ["--decode-ms-per-token", "5", "--prefill-ms-per-token", "0.02"]
STREAM = {
    "model": "tiny",
    "prompt": "Which replica hears about me?",
    "max_tokens": 6,
    "stream": True,
    "stream_options": {"include_usage": True},
}
REQUESTS = 8
TIMEOUT = aiohttp.ClientTimeout(total=60)
LOG_TIMEOUT = 4  # --response-log-timeout, seconds: short, so the lost ones expire soon


def metrics(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def entries(port: int, outcome: str) -> float:
    return metrics(port).get(f'epp_response_log_entries_total{{outcome="{outcome}"}}', 0.0)


def inflight(port: int) -> int:
    url = f"http://127.0.0.1:{port}/debug/endpoints"
    return sum(r["inflight_requests"] for r in json.loads(urllib.request.urlopen(url).read()))


def served(port: int) -> float:
    """Requests this replica routed and then measured to their end (a record each)."""
    counts = metrics(port).items()
    return sum(v for k, v in counts if k.startswith("inference_objective_output_tokens_count"))


async def send_sequentially(st: LocalStack) -> None:
    """One client connection, so one Envoy worker: Envoy's round robin alternates the
    routing streams over the two replicas while that worker's log stream stays on one."""
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        for _ in range(REQUESTS):
            async with session.post(st.url + "/v1/completions", json=STREAM) as r:
                assert r.status == 200 and b"[DONE]" in await r.read()


async def wait_for(predicate, timeout: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.1)


def stack(path: str, **envoy_options) -> LocalStack:
    return LocalStack(
        n_sims=1,
        n_epps=2,
        sim_args=SIM_ARGS,
        response_path=path,
        epp_args=["--response-log-timeout", str(LOG_TIMEOUT)],
        envoy_options=envoy_options,
    )


async def test_one_logger_per_replica_ends_every_request_on_its_own_replica():
    with stack("log") as st:
        ports = st.epp_metrics_ports
        await send_sequentially(st)
        await wait_for(lambda: sum(entries(p, "joined") for p in ports) == REQUESTS)
        assert all(served(p) > 0 for p in ports)  # both replicas routed some
        assert sum(served(p) for p in ports) == REQUESTS
        assert [entries(p, "expired") for p in ports] == [0, 0]
        # every replica sees every entry: the other's are foreign, none unknown
        assert sum(entries(p, "foreign") for p in ports) == REQUESTS
        assert [entries(p, "unknown") for p in ports] == [0, 0]
        assert [inflight(p) for p in ports] == [0, 0]


async def test_one_shared_logger_loses_the_other_replicas_requests_to_the_timeout():
    with stack("log", shared_logger=True) as st:
        ports = st.epp_metrics_ports
        await send_sequentially(st)
        # every request is given back in the end: by its entry, or by the timeout
        await wait_for(lambda: [inflight(p) for p in ports] == [0, 0], timeout=LOG_TIMEOUT * 5)
        joined = sum(entries(p, "joined") for p in ports)
        expired = sum(entries(p, "expired") for p in ports)
        assert joined + expired == REQUESTS
        assert expired > 0 and sum(entries(p, "foreign") for p in ports) == expired
        assert sum(served(p) for p in ports) == joined  # the expired ones measured nothing
        # and a replica that lost some says what to do
        assert st.pg is not None
        logs = st.pg.get("epp").output() + st.pg.get("epp-1").output()
        assert "Kubernetes Service" in logs and "--response-path on" in logs, logs[-3000:]


async def test_in_the_path_each_replica_measures_its_own_requests():
    with stack("on") as st:
        ports = st.epp_metrics_ports
        await send_sequentially(st)
        # ended on the routing stream as the response passes: nothing waits for a log
        assert [inflight(p) for p in ports] == [0, 0]
        assert all(served(p) > 0 for p in ports)
        assert sum(served(p) for p in ports) == REQUESTS
