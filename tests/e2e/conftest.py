"""Fixtures that start real processes: simulators, `epp serve` and Envoy, on loopback."""

import pytest

from epp.harness.localstack import LocalStack

# Simulated servers that take ~0.1-0.2 s per request, so queues form under modest load.
SIM_ARGS = ["--max-num-seqs", "2", "--decode-ms-per-token", "8", "--prefill-ms-per-token", "0.02"]


@pytest.fixture(scope="module")
def stack():
    with LocalStack(n_sims=3, sim_args=SIM_ARGS) as st:
        yield st


@pytest.fixture
def fresh_stack():
    """A stack of its own, for tests that kill servers."""
    with LocalStack(n_sims=3, sim_args=SIM_ARGS) as st:
        yield st
