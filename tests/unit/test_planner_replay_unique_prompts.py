"""The replay's fast path for traces without shared prefix blocks gives the replay the
real prefix index gives: a replay pinned by digest before the path existed, a counting
index read against the real one write for write, and configs it must not take."""

from __future__ import annotations

import random
from pathlib import Path

from epp.datastore import Endpoint, EndpointMetrics, EndpointSnapshot
from epp.observability import PLUGIN_DURATION
from epp.planner.offline.pool import Pool, PoolShape, Routing
from epp.planner.offline.replay import replay
from epp.planner.offline.routing import load
from epp.planner.offline.traces import Arrival
from epp.planner.offline.unique_prompts import UniqueChainIndex, install
from epp.request import InferenceRequest
from epp.sim import presets
from plugins.prefix.approx_index import ApproxPrefixIndex
from tests.unit.test_planner_replay_golden import PINNED_STEP, Steps, digest, trace

ROOT = Path(__file__).resolve().parents[2]
# The golden replay's trace without its prefix blocks, scaling up and down (drains, and
# replicas leaving the index), taken with the real index before the fast path existed.
NO_SHARED_BLOCKS = "a6e7d71bf60e02b4905213ef0404a8a1dced98e0a5fb9e2d298a7ee244de8126"


def test_a_replay_without_shared_blocks_is_unchanged_to_the_bit():
    arrivals = [Arrival(a.t_s, a.isl, a.osl, ()) for a in trace(3000)]
    sim = presets.config_for("llama-3.1-8b-h100", enable_prefix_caching=True, **PINNED_STEP)
    run = replay(
        arrivals, Steps([3, 6, 2, 5, 1, 4, 4, 2]), PoolShape(sim, startup_s=30.0), initial=2, seed=4
    )
    assert len(run.actions) >= 5
    assert digest(run) == NO_SHARED_BLOCKS


def test_the_fast_path_is_taken_only_without_shared_blocks_and_with_a_known_config():
    sim = presets.config_for("llama-3.1-8b-h100")
    assert Pool(PoolShape(sim), unique_prompts=True).router.unique_prompts
    assert not Pool(PoolShape(sim)).router.unique_prompts
    weighted = (ROOT / "config" / "prefix-weighted.yaml").read_text()
    other = PoolShape(sim, routing=Routing(weighted, "config/prefix-weighted.yaml"))
    assert not Pool(other, unique_prompts=True).router.unique_prompts


def test_the_counting_index_reads_as_the_real_one_for_chains_that_never_repeat():
    rng = random.Random(7)
    real, count = ApproxPrefixIndex(50), UniqueChainIndex(50)
    names = [f"e{i}" for i in range(4)]
    next_hash = 0
    for step in range(400):
        name = rng.choice(names)
        chain = list(range(next_hash, next_hash + rng.randint(0, 30)))
        next_hash += len(chain)
        cap = rng.choice([None, 40, 60])
        real.add(name, chain, cap)
        count.add(name, range(len(chain)), cap)
        if step % 97 == 96:
            keep = names[: rng.randint(1, 4)]
            assert real.retain(keep) == count.retain(keep)
        probe = [*names, "absent"]
        assert real.fills(probe) == count.fills(probe)
        assert real.size == count.size and real.endpoints == count.endpoints
        assert [real.capacity(n) for n in probe] == [count.capacity(n) for n in probe]
        fresh = range(next_hash, next_hash + 8)  # the next request's chain: never seen
        assert real.match(fresh) == {} == count.match(fresh)


def test_the_chain_length_is_the_real_chain_length():
    config = load((ROOT / "config" / "default.yaml").read_text(), "default", 0, lambda: 0.0)
    producer = config.pre_request[0]
    real = producer.hashes
    assert install(config)
    for isl in (1, 15, 16, 17, 160, 4095, 4096, 4097, 9000):
        req = InferenceRequest(
            request_id="r", model="m", target_model="m", prompt_token_ids=list(range(isl))
        )
        for block in (16, 32):
            assert len(producer.hashes(req, block)) == len(real(req, block))


def _observations() -> int:
    return sum(sum(c.counts) for c in PLUGIN_DURATION._children.values())


def test_the_replay_times_no_plugin_and_serve_still_does():
    config = load((ROOT / "config" / "default.yaml").read_text(), "default", 0, lambda: 0.0)
    before = _observations()
    sim = presets.config_for("llama-3.1-8b-h100")
    replay(trace(60), Steps([2]), PoolShape(sim), initial=2, seed=1)
    assert _observations() == before
    scheduler = config.scheduler  # not stopped: times each plugin call as `epp serve` does
    snaps = [
        EndpointSnapshot(endpoint=Endpoint(n, "10.0.0.1", 8000), metrics=EndpointMetrics())
        for n in ("a", "b")
    ]
    scheduler.schedule(
        InferenceRequest(request_id="r", model="m", target_model="m", prompt_token_ids=[1] * 40),
        snaps,
    )
    assert _observations() > before
