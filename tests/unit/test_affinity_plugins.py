"""Exact scores and picks of the affinity plugins: session, no-hit LRU, LoRA, prefix affinity."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from epp.config.errors import ConfigError
from epp.config.loader import load_config_file
from epp.config.params import parse_params
from epp.datastore import EndpointSnapshot
from epp.headers import SESSION_TOKEN
from epp.request import InferenceRequest, new_request, parse_body
from epp.scheduling.registry import PLUGIN_TYPES, Handle
from epp.scheduling.types import CycleState, ProfileResult, SchedulingResult
from epp.session_key import DEFAULT_SOURCES, session_key
from plugins.prefix.match_info import PREFIX_MATCH_KEY, PrefixMatchInfo
from plugins.scorers import lora_affinity
from tests.helpers import snap, with_metrics

CONFIG_DIR = Path(__file__).resolve().parents[2] / "config"


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def make(type_name: str, params: object = None, *, clock=None, seed: int = 0):
    spec = PLUGIN_TYPES.lookup(type_name)
    assert spec is not None, type_name
    handle = Handle(rng=random.Random(seed), clock=clock or FakeClock())
    return spec.build(type_name, parse_params(spec.params, params), handle)


def req(model: str = "m", headers: dict[str, str] | None = None) -> InferenceRequest:
    body = json.dumps({"model": model, "prompt": "hello"}).encode()
    return parse_body(new_request(headers or {}, "/v1/completions", "POST"), body)


def result(
    target: EndpointSnapshot, state: CycleState | None = None, **others: EndpointSnapshot
) -> SchedulingResult:
    """A scheduling result whose primary profile `default` picked `target`."""
    profiles: dict[str, ProfileResult | None] = {"default": ProfileResult([target])}
    profiles.update({name: ProfileResult([e]) for name, e in others.items()})
    return SchedulingResult(profiles, "default", cycle_state=state or CycleState())


def prefix_state(total: int = 10, **matched: float) -> CycleState:
    state = CycleState()
    info = PrefixMatchInfo(
        total_blocks=total,
        block_size_tokens=16,
        matched=dict(matched),
        cached_blocks={k: int(v) for k, v in matched.items()},
    )
    state.write(PREFIX_MATCH_KEY, info)
    return state


A, B, C, D = snap("a"), snap("b"), snap("c"), snap("d")


# ---- session-affinity-scorer ------------------------------------------------------


def sess(sid: str, header: str = SESSION_TOKEN) -> InferenceRequest:
    """A request carrying `sid` in `header`, its session key read as parse_body reads it."""
    r = req(headers={header: sid})
    r.session_key = session_key(r.headers, None, DEFAULT_SOURCES)
    return r


def test_session_no_header_or_unknown_session_is_neutral():
    s = make("session-affinity-scorer")
    assert s.score(CycleState(), req(), [A, B, C]) == [0.0, 0.0, 0.0]
    assert s.score(CycleState(), sess("never-seen"), [A, B, C]) == [0.0, 0.0, 0.0]
    s.pre_request(req(), result(B))  # no header: nothing is learned
    assert len(s) == 0


def test_session_previous_endpoint_scores_one_and_follows_latest_pick():
    s = make("session-affinity-scorer")
    s.pre_request(sess("s1"), result(B))
    assert s.score(CycleState(), sess("s1"), [A, B, C]) == [0.0, 1.0, 0.0]
    assert s.score(CycleState(), sess("s2"), [A, B, C]) == [0.0, 0.0, 0.0]
    s.pre_request(sess("s1"), result(C))  # it went elsewhere: that endpoint now holds it
    assert s.score(CycleState(), sess("s1"), [A, B, C]) == [0.0, 0.0, 1.0]


def test_session_endpoint_gone_from_candidates_never_matches():
    s = make("session-affinity-scorer")
    s.pre_request(sess("s1"), result(B))
    assert s.score(CycleState(), sess("s1"), [A, C]) == [0.0, 0.0]


def test_session_expires_after_ttl_unused_and_use_refreshes_it():
    clock = FakeClock(0.0)
    s = make("session-affinity-scorer", {"evictionTtlSeconds": 300}, clock=clock)
    s.pre_request(sess("s1"), result(A))
    clock.t = 300.0  # exactly the TTL: still known (expiry is strictly after)
    assert s.score(CycleState(), sess("s1"), [A, B]) == [1.0, 0.0]
    s.pre_request(sess("s1"), result(A))  # used at t=300: lives until 600
    clock.t = 600.0
    assert s.score(CycleState(), sess("s1"), [A, B]) == [1.0, 0.0]
    clock.t = 600.5
    assert s.score(CycleState(), sess("s1"), [A, B]) == [0.0, 0.0]
    assert len(s) == 0  # dropped on read


def test_session_expired_entries_are_dropped_as_new_sessions_arrive():
    clock = FakeClock(0.0)
    s = make("session-affinity-scorer", {"evictionTtlSeconds": 10}, clock=clock)
    for i in range(5):
        s.pre_request(sess(f"old{i}"), result(A))
    clock.t = 11.0
    s.pre_request(sess("new"), result(B))
    assert len(s) == 1


def test_session_count_is_bounded_least_recently_used_dropped():
    s = make("session-affinity-scorer", {"maxSessions": 2})
    s.pre_request(sess("s1"), result(A))
    s.pre_request(sess("s2"), result(B))
    s.pre_request(sess("s1"), result(A))  # s1 used again: s2 is now the oldest
    s.pre_request(sess("s3"), result(C))
    assert len(s) == 2
    assert s.endpoint_for("s2") is None
    assert (s.endpoint_for("s1"), s.endpoint_for("s3")) == ("a", "c")


def test_session_custom_header_and_profile():
    s = make("session-affinity-scorer", {"headerName": "X-Conversation", "profileName": "prefill"})
    r = sess("s1", header="x-conversation")  # request headers arrive lower-cased
    s.pre_request(r, result(A, prefill=C))
    assert s.score(CycleState(), r, [A, B, C]) == [0.0, 0.0, 1.0]
    s.pre_request(sess("s2", header="x-conversation"), result(A))  # no prefill profile ran
    assert s.endpoint_for("s2") is None


def test_session_params_are_checked():
    spec = PLUGIN_TYPES.lookup("session-affinity-scorer")
    with pytest.raises(ConfigError, match="evictionTtlSeconds must be > 0"):
        parse_params(spec.params, {"evictionTtlSeconds": 0})
    with pytest.raises(ConfigError, match="headerName"):
        parse_params(spec.params, {"headerName": " "})


# ---- no-hit-lru-scorer -------------------------------------------------------------


def cold(scorer, endpoints, state: CycleState | None = None) -> list[float]:
    return scorer.score(state or CycleState(), req(), endpoints)


def send_cold(scorer, endpoints, target, **others) -> None:
    state = CycleState()
    scorer.score(state, req(), endpoints)
    scorer.pre_request(req(), result(target, state, **others))


def test_no_hit_lru_sequence_of_cold_requests():
    s = make("no-hit-lru-scorer")
    eps = [A, B, C, D]
    approx = pytest.approx
    assert cold(s, eps) == approx([1.0, 2 / 3, 1 / 3, 0.0])  # all never used: candidate order
    send_cold(s, eps, A)
    assert cold(s, eps) == approx([0.0, 1.0, 2 / 3, 1 / 3])  # never used b, c, d; then a
    send_cold(s, eps, B)
    assert cold(s, eps) == approx([1 / 3, 0.0, 1.0, 2 / 3])  # c, d; then a (older), b
    send_cold(s, eps, C)
    send_cold(s, eps, D)
    assert cold(s, eps) == approx([1.0, 2 / 3, 1 / 3, 0.0])  # all used: a is the oldest
    send_cold(s, eps, A)
    assert cold(s, eps) == approx([0.0, 1.0, 2 / 3, 1 / 3])
    assert s.lru_order() == ["b", "c", "d", "a"]


def test_no_hit_lru_with_max_score_round_robins_cold_requests():
    s = make("no-hit-lru-scorer")
    eps = [A, B, C]
    picks = []
    for _ in range(6):
        scores = cold(s, eps)
        target = eps[scores.index(max(scores))]
        send_cold(s, eps, target)
        picks.append(target.name)
    assert picks == ["a", "b", "c", "a", "b", "c"]


def test_no_hit_lru_warm_request_is_neutral_and_not_learned():
    s = make("no-hit-lru-scorer")
    state = prefix_state(b=3)
    assert s.score(state, req(), [A, B, C]) == [0.5, 0.5, 0.5]
    s.pre_request(req(), result(B, state))
    assert s.lru_order() == []


def test_no_hit_lru_cold_is_judged_over_its_candidates():
    s = make("no-hit-lru-scorer")
    assert s.score(prefix_state(z=5), req(), [A, B]) == [1.0, 0.0]  # hit only on z: cold
    assert s.score(prefix_state(), req(), [A, B]) == [1.0, 0.0]  # info without any hit
    assert cold(s, [A]) == [1.0]  # single candidate


def test_no_hit_lru_learns_primary_and_prefill_targets_and_is_bounded():
    s = make("no-hit-lru-scorer", {"lruSize": 2})
    send_cold(s, [A, B, C], A, prefill=B)
    assert s.lru_order() == ["a", "b"]
    send_cold(s, [A, B, C], C)
    assert s.lru_order() == ["b", "c"]  # a dropped: the bound is 2


def test_no_hit_lru_ranks_used_endpoints_among_candidates_only():
    s = make("no-hit-lru-scorer")
    for target in (snap("x"), snap("y"), A, B):
        send_cold(s, [target], target)
    # LRU is x, y, a, b; only a, b, c are candidates: c never used, then a, then b.
    assert cold(s, [A, B, C]) == [0.5, 0.0, 1.0]


def test_no_hit_lru_accepts_llm_d_parameters():
    make("no-hit-lru-scorer", {"prefixPluginType": "prefix-cache-scorer", "lruSize": 10})


# ---- lora-affinity-scorer ----------------------------------------------------------


def lora(name: str, active=(), waiting=(), max_lora: int = 0) -> EndpointSnapshot:
    return with_metrics(
        snap(name),
        active_models=frozenset(active),
        waiting_models=frozenset(waiting),
        max_active_models=max_lora,
    )


def test_lora_each_branch_upstream_values():
    eps = [
        lora("active", active=["ad1", "x"], max_lora=2),  # running here
        lora("free", active=["x"], max_lora=4),  # 1 < 4: a slot is free
        lora("queued", active=["x"], waiting=["ad1"], max_lora=2),  # 2 < 2 is false
        lora("full", active=["x", "y"], max_lora=2),
        lora("no-lora-info"),  # max 0: treated as full, as upstream
    ]
    scores = make("lora-affinity-scorer").score(CycleState(), req("ad1"), eps)
    assert scores == [1.0, 0.8, 0.6, 0.0, 0.0]


def test_lora_capacity_is_checked_before_waiting():
    # ad1 waits here, but 1 running + 1 waiting < 4, so the free-slot branch wins: 0.8.
    ep = lora("e", active=["x"], waiting=["ad1"], max_lora=4)
    assert make("lora-affinity-scorer").score(CycleState(), req("ad1"), [ep]) == [0.8]


def test_lora_base_model_request_scores_equal_everywhere():
    eps = [
        lora("a", active=["ad1"], max_lora=1),
        lora("b", max_lora=4),
        lora("c", active=["x", "y"], waiting=["z"], max_lora=2),
        snap("d"),
    ]
    assert make("lora-affinity-scorer").score(CycleState(), req("base"), eps) == [0.0] * 4


def test_lora_adapter_idle_everywhere_is_still_recognised_once_seen():
    s = make("lora-affinity-scorer")
    assert s.score(CycleState(), req("ad1"), [lora("a", max_lora=2)]) == [0.0]  # never seen
    s.score(CycleState(), req("ad1"), [lora("a", active=["ad1"], max_lora=2)])  # learned
    idle = [lora("free", active=["x"], max_lora=2), lora("full", active=["x", "y"], max_lora=2)]
    assert s.score(CycleState(), req("ad1"), idle) == [0.8, 0.0]


def test_lora_known_adapters_are_bounded(monkeypatch):
    monkeypatch.setattr(lora_affinity, "MAX_KNOWN_ADAPTERS", 2)
    s = make("lora-affinity-scorer")
    for name in ("ad1", "ad2", "ad3"):
        s.score(CycleState(), req(name), [lora("a", active=[name], max_lora=4)])
    idle = [lora("a", max_lora=4)]
    assert s.score(CycleState(), req("ad1"), idle) == [0.0]  # forgotten: neutral
    assert s.score(CycleState(), req("ad3"), idle) == [0.8]


# ---- prefix-cache-affinity-filter --------------------------------------------------


def names(endpoints: list[EndpointSnapshot]) -> list[str]:
    return [e.name for e in endpoints]


def test_affinity_keeps_sticky_endpoints():
    f = make("prefix-cache-affinity-filter")
    state = prefix_state(a=9, b=8, c=5)  # scores 0.9, 0.8 (= threshold: sticky), 0.5
    assert names(f.filter(state, req(), [A, B, C])) == ["a", "b"]


def test_affinity_keeps_all_when_none_sticky_or_no_prefix_info():
    f = make("prefix-cache-affinity-filter")
    assert names(f.filter(prefix_state(a=7, b=1), req(), [A, B, C])) == ["a", "b", "c"]
    assert names(f.filter(CycleState(), req(), [A, B, C])) == ["a", "b", "c"]
    assert names(f.filter(prefix_state(a=2), req(), [A])) == ["a"]


def test_affinity_exploration_keeps_all_at_the_configured_rate():
    f = make("prefix-cache-affinity-filter", {"explorationProbability": 0.25}, seed=7)
    state = prefix_state(a=10)
    trials = 4000
    kept_all = sum(len(f.filter(state, req(), [A, B, C])) == 3 for _ in range(trials))
    assert 900 <= kept_all <= 1100  # 1000 expected; σ ≈ 27


def test_affinity_without_exploration_uses_no_randomness():
    f = make("prefix-cache-affinity-filter")
    before = f.rng.getstate()
    for _ in range(100):
        assert names(f.filter(prefix_state(a=10), req(), [A, B])) == ["a"]
    assert f.rng.getstate() == before


def test_affinity_ttft_gate_breaks_stickiness():
    f = make(
        "prefix-cache-affinity-filter", {"peakPrefillThroughput": 1000, "maxTTFTPenaltyMs": 5000}
    )
    state = prefix_state(a=10, b=10)
    busy = snap("a", inflight_prefill_tokens=10_000)  # 10,000 ms
    idle_sticky = snap("b", inflight_prefill_tokens=0)
    assert f.ttft_ms(busy) == 10_000.0
    # Best sticky (b: 0 ms) is the one that counts: stays sticky.
    eps = [busy, idle_sticky, snap("c", inflight_prefill_tokens=0)]
    assert names(f.filter(state, req(), eps)) == ["a", "b"]
    only_busy = prefix_state(a=10)
    other_4s = snap("c", inflight_prefill_tokens=4_000)  # 10,000 − 4,000 = 6,000 > 5,000: break
    assert names(f.filter(only_busy, req(), [busy, other_4s])) == ["a", "c"]
    other_6s = snap("c", inflight_prefill_tokens=6_000)  # 4,000 ≤ 5,000: stick
    assert names(f.filter(only_busy, req(), [busy, other_6s])) == ["a"]


def test_affinity_ttft_gate_defaults_are_llm_d_and_zero_turns_it_off():
    f = make("prefix-cache-affinity-filter")
    state = prefix_state(a=10)
    assert f.ttft_ms(snap("a", inflight_prefill_tokens=15_928)) == pytest.approx(1000.0)
    # 18,000 ms at 15,928 tok/s is 286,704 tokens more than the best other endpoint.
    assert names(f.filter(state, req(), [snap("a", inflight_prefill_tokens=280_000), B])) == ["a"]
    assert names(f.filter(state, req(), [snap("a", inflight_prefill_tokens=300_000), B])) == [
        "a",
        "b",
    ]
    off = make("prefix-cache-affinity-filter", {"maxTTFTPenaltyMs": 0})
    assert names(off.filter(state, req(), [snap("a", inflight_prefill_tokens=10**9), B])) == ["a"]


def test_affinity_params_are_checked():
    spec = PLUGIN_TYPES.lookup("prefix-cache-affinity-filter")
    with pytest.raises(ConfigError, match="peakPrefillThroughput must be > 0"):
        parse_params(spec.params, {"peakPrefillThroughput": 0})
    with pytest.raises(ConfigError, match="at most 1"):
        parse_params(spec.params, {"affinityThreshold": 1.5})
    with pytest.raises(ConfigError, match="ttftSource"):
        parse_params(spec.params, {"ttftSource": "latencyPredictor"})
    p = parse_params(spec.params, {"maxTtftPenaltyMs": 0, "peakPrefillThroughput": 0})
    assert p.max_ttft_penalty_ms == 0


# ---- shipped configs ---------------------------------------------------------------


def weights(cfg) -> list[tuple[str, float]]:
    (profile,) = cfg.scheduler.profiles.values()
    return [(s.scorer.type_name, s.weight) for s in profile.scorers]


def test_lora_config_weights():
    cfg = load_config_file(CONFIG_DIR / "lora.yaml")
    assert weights(cfg) == [
        ("lora-affinity-scorer", 1.0),
        ("queue-depth-scorer", 2.0),
        ("kv-cache-utilization-scorer", 2.0),
    ]


def test_session_config_keeps_a_session_on_its_endpoint_despite_load():
    clock = FakeClock()
    cfg = load_config_file(CONFIG_DIR / "session.yaml", Handle(rng=random.Random(1), clock=clock))
    assert weights(cfg)[0] == ("session-affinity-scorer", 5.0)

    def route(r: InferenceRequest, endpoints: list[EndpointSnapshot]) -> str:
        res = cfg.scheduler.schedule(r, endpoints)
        for hook in cfg.pre_request:
            hook.pre_request(r, res)
        return res.targets[0].name

    first = route(sess("s1"), [snap("a", queue=5, kv=0.9), snap("b")])
    assert first == "b"
    # b is now the busiest by far; the session stays anyway, a new one goes to a.
    loaded = [snap("a"), snap("b", queue=50, kv=1.0)]
    assert route(sess("s1"), loaded) == "b"
    assert route(sess("s2"), loaded) == "a"
    clock.t += 301  # expired: placed by load again
    assert route(sess("s1"), loaded) == "a"
