"""bench/routing_virtual.py: the EPP's real Director over virtual-time simulators."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import routing_virtual
from epp.composition import install_plugins

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def rv():
    install_plugins()
    return routing_virtual


def scenario(rv, name: str, tmp_path: Path):
    rm = rv.routing_module()
    p = rv.argparse.ArgumentParser()
    rm.add_arguments(p)
    p.add_argument("--scrape-s", type=float, default=0.0625)
    args = p.parse_args(["--servers", "3", "--stage-s", "2", "--warmup-s", "1", "--rates", "20,40"])
    args.time_scale = 1.0
    args = rm.with_scenario(args, name)
    args.tmp = str(tmp_path)
    return args, rm.workload(args)


def test_the_epps_round_robin_picker_places_exactly_as_envoys(rv, tmp_path):
    args, reqs = scenario(rv, "one-prefix", tmp_path)
    rr = rv.summarize("rr", rv.run("rr", args, reqs, 1), args)
    epp = rv.summarize("rr", rv.run("epp-rr", args, reqs, 1), args)
    assert rr == epp  # same servers in the same order: every TTFT, token and hit equal
    assert sum(r["requests"] for r in rr) == sum(r.stage >= 0 for r in reqs) > 0


def test_sticky_runs_are_repeatable_and_give_back_every_in_flight_token(rv, tmp_path):
    args, reqs = scenario(rv, "many-groups", tmp_path)
    pool = rv.build_pool("epp-sticky", args, 7)
    out = rv.simulate(pool, args, reqs)
    assert len(out) == len(reqs)  # every request ended
    # The Director heard each first token and each end: nothing is left counted.
    assert all(pool.datastore.inflight(f"s{i}") == (0, 0) for i in range(3))
    again = rv.run("epp-sticky", args, reqs, 7)
    assert [(o.ttft, o.cached) for o in out] == [(o.ttft, o.cached) for o in again]
