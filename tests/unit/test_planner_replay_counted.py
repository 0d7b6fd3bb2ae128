"""The replay's counted routing (`counted_routing.py`) picks what the EPP's director and
scheduler pick: both routers are driven through the same random sequence of endpoints
joining, draining and leaving, requests routed, first tokens and ends, scrapes, and every
pick must be the same endpoint (ties included: the same seeded draws). Plus the configs it
must leave to the director."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epp.config.loader import DEFAULT_CONFIG
from epp.planner.offline.counted_routing import CountedRouter, router_for
from epp.planner.offline.pool import Pool, PoolShape, Routing
from epp.planner.offline.routing import EppRouter
from epp.sim import presets

ROOT = Path(__file__).resolve().parents[2]

_PROFILE = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: approx-prefix-cache-producer
  parameters: {{autoTune: {auto}, maxPrefixBlocksToMatch: 8, lruCapacityPerServer: 60}}
- type: token-load-scorer
  parameters: {{perRequestTokens: 3, queueThresholdTokens: 4000}}
- type: prefix-cache-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
{refs}
  - pluginRef: max-score-picker
"""
# token-load first, without the eviction term, a small threshold (scores reach 0), and
# autoTune off (the producer's own block size and capacity)
TOKEN_LOAD_FIRST = _PROFILE.format(
    auto="false",
    refs="  - pluginRef: token-load-scorer\n    weight: 3\n"
    "  - pluginRef: prefix-cache-scorer\n    weight: 0.5",
)
# no token-load scorer: every endpoint ties, the picker draws
PREFIX_ONLY = _PROFILE.format(auto="true", refs="  - pluginRef: prefix-cache-scorer")

CONFIGS = {
    "built-in default": DEFAULT_CONFIG,
    "config/agent.yaml": (ROOT / "config" / "agent.yaml").read_text(),
    "config/prefix-aware.yaml": (ROOT / "config" / "prefix-aware.yaml").read_text(),
    "config/slo-calibrated.yaml": (ROOT / "config" / "slo-calibrated.yaml").read_text(),
    "token-load first": TOKEN_LOAD_FIRST,
    "prefix only": PREFIX_ONLY,
}


class _EngineRequest:
    """What the routers read of the engine's request: when its first token came."""

    __slots__ = ("first_token_at",)

    def __init__(self) -> None:
        self.first_token_at: float | None = None


def routers(text: str, seed: int, blocks: int) -> tuple[EppRouter, CountedRouter]:
    kw = dict(seed=seed, block_tokens=512, cache_block_size=16, cache_num_blocks=blocks)
    live = EppRouter(text, "test", unique_prompts=True, **kw)  # type: ignore[arg-type]
    counted = router_for(text, "test", unique=True, **kw)  # type: ignore[arg-type]
    assert live.unique_prompts and isinstance(counted, CountedRouter)
    return live, counted


ops = st.lists(
    st.one_of(
        # routes weigh most: ties among idle endpoints, loads that grow and shrink
        *[st.tuples(st.just("route"), st.integers(1, 40), st.integers(1, 50))] * 3,
        st.tuples(st.just("join")),
        st.tuples(st.just("drain"), st.integers(0, 20)),
        st.tuples(st.just("leave"), st.integers(0, 20)),
        # prompt lengths around the block size (none, one, several blocks) and long ones
        st.tuples(st.just("route"), st.sampled_from([15, 16, 17, 32, 33]), st.integers(1, 50)),
        st.tuples(st.just("route"), st.integers(1, 3000), st.integers(1, 500)),
        st.tuples(st.just("first"), st.integers(0, 50)),
        st.tuples(st.just("end"), st.integers(0, 50)),
        st.tuples(st.just("time"), st.sampled_from([0.0, 0.01, 0.05, 0.3])),
    ),
    min_size=20,
    max_size=150,
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(sorted(CONFIGS)),
    seed=st.integers(0, 3),
    blocks=st.sampled_from([40, 200, 100_000]),  # full caches reach a fill of 1
    pool=st.integers(1, 4),
    steps=ops,
)
def test_every_pick_is_the_directors(name, seed, blocks, pool, steps):
    live, counted = routers(CONFIGS[name], seed, blocks)
    now = 0.0
    joined = 0
    ready: list[str] = []
    draining: list[str] = []
    started: list[tuple[int, _EngineRequest]] = []  # routed, no first token yet
    going: list[tuple[int, _EngineRequest]] = []  # routed, not ended
    rid = 0

    def loads():
        return [(n, 0, 1, 0.25) for n in ready]

    for op in [("join",)] * pool + steps:
        kind = op[0]
        if kind == "join":
            name_ = f"e{joined}"
            joined += 1
            ready.append(name_)
            for r in (live, counted):
                r.join(name_)
        elif kind == "drain" and ready:
            gone = ready.pop(op[1] % len(ready))
            draining.append(gone)
            for r in (live, counted):
                r.drain(gone)
        elif kind == "leave" and draining:
            gone = draining.pop(op[1] % len(draining))
            for r in (live, counted):
                r.leave(gone)
        elif kind == "route" and ready:
            for r in (live, counted):
                r.settle(now, loads)
            ours = counted.pick(rid, op[1], op[2], ())
            theirs = live.pick(rid, op[1], op[2], ())
            assert ours == theirs, f"request {rid}"
            req = _EngineRequest()
            for r in (live, counted):
                r.routed(rid, ours, req)
            started.append((rid, req))
            going.append((rid, req))
            rid += 1
        elif kind == "first" and started:
            first, req = started.pop(op[1] % len(started))
            req.first_token_at = now  # the director's router reads it at its next settle
            counted.first_token(first, now)
        elif kind == "end" and going:
            done, req = going.pop(op[1] % len(going))
            if req.first_token_at is None:
                req.first_token_at = now
                counted.first_token(done, now)
                started = [s for s in started if s[0] != done]
            for r in (live, counted):
                r.finished(done, now)
        elif kind == "time":
            now += op[1]


def test_a_default_replay_counts_and_other_configs_route_through_the_director():
    sim = presets.config_for("llama-3.1-8b-h100")
    assert isinstance(Pool(PoolShape(sim), unique_prompts=True).router, CountedRouter)
    assert isinstance(Pool(PoolShape(sim)).router, EppRouter)  # shared blocks possible
    for path in ("prefix-weighted.yaml", "load-only.yaml", "slo.yaml", "precise-prefix.yaml"):
        routing = Routing((ROOT / "config" / path).read_text(), path)
        router = Pool(PoolShape(sim, routing=routing), unique_prompts=True).router
        assert isinstance(router, EppRouter), path
    # a default SLO makes the latency scorer place every request: not counted
    slo = DEFAULT_CONFIG.replace(
        "- type: calibrated-latency-producer",
        "- type: calibrated-latency-producer\n  parameters: {defaultTtftSloMs: 500}",
    )
    assert slo != DEFAULT_CONFIG
    router = Pool(PoolShape(sim, routing=Routing(slo, "slo")), unique_prompts=True).router
    assert isinstance(router, EppRouter)
