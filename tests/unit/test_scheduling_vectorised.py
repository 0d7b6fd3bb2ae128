"""The fast paths of a scheduling cycle at large pools (issue 13 §6) give exactly what
the plain Python paths give: the same totals bit for bit, the same picks for the same
random draws."""

from __future__ import annotations

import random

import pytest

import plugins.scorers.minmax as minmax
from epp.datastore import Endpoint, EndpointMetrics, EndpointSnapshot
from epp.scheduling import profile
from epp.scheduling.registry import Handle
from epp.scheduling.types import CycleState, ScoredEndpoint, ScoredEndpoints
from plugins.pickers.common import PickerParams
from plugins.pickers.max_score import MaxScorePicker


def snaps(n: int) -> list[EndpointSnapshot]:
    return [
        EndpointSnapshot(Endpoint(f"e{i}", "10.0.0.1", 8000 + i), EndpointMetrics())
        for i in range(n)
    ]


def random_scores(rng: random.Random, n: int) -> list[float]:
    # in range mostly; some out of range (clamped), some exact ties
    pool = [0.0, 1.0, 0.5, -0.25, 1.75]
    return [rng.choice(pool) if rng.random() < 0.3 else rng.random() for _ in range(n)]


@pytest.mark.parametrize("n", [64, 300, 1000])
def test_numpy_weighted_sum_equals_the_python_one(n, monkeypatch):
    rng = random.Random(n)
    weights = [2.0, 2.0, 3.0, 0.5]
    lists = [random_scores(rng, n) for _ in weights]
    vector = None
    for scores, w in zip(lists, weights, strict=True):
        vector = profile._add_weighted(vector, scores, w)
    monkeypatch.setattr(profile, "VECTOR_MIN_ENDPOINTS", 10**9)  # force the Python path
    plain = None
    for scores, w in zip(lists, weights, strict=True):
        plain = profile._add_weighted(plain, scores, w)
    assert not isinstance(vector, list) and isinstance(plain, list)
    assert vector.tolist() == plain  # exact equality, not approx
    # and the clamp happened: element 0 by hand, each score clamped to [0, 1] first
    by_hand = 0.0
    for scores, w in zip(lists, weights, strict=True):
        by_hand += w * min(1.0, max(0.0, scores[0]))
    assert plain[0] == by_hand


@pytest.mark.parametrize("n", [64, 1000])
def test_numpy_min_max_equals_the_python_one(n, monkeypatch):
    rng = random.Random(n)
    values = [rng.randrange(0, 40) for _ in range(n)]
    vector = minmax.min_max_inverted(values)
    monkeypatch.setattr(minmax, "_VECTOR_MIN", 10**9)
    assert minmax.min_max_inverted(values) == vector
    assert minmax.min_max_inverted([3] * n) == [1.0] * n  # all equal → 1.0 (upstream)


def test_max_score_fast_path_picks_what_the_loop_picks():
    eps = snaps(200)
    for seed in range(40):
        rng = random.Random(seed)
        # few distinct values: many ties, so the random draw matters
        scores = [float(rng.randrange(4)) for _ in eps]
        picker = MaxScorePicker("p", PickerParams(), Handle(rng=random.Random(seed)))
        fast = picker.pick(CycleState(), None, ScoredEndpoints(eps, scores)).targets  # type: ignore[arg-type]
        listed = [ScoredEndpoint(e, s) for e, s in zip(eps, scores, strict=True)]
        slow = MaxScorePicker("p", PickerParams(), Handle(rng=random.Random(seed)))
        assert fast == slow.pick(CycleState(), None, listed).targets  # type: ignore[arg-type]
        assert scores[eps.index(fast[0])] == max(scores)


def test_scored_endpoints_is_a_sequence_of_scored_endpoint():
    eps = snaps(3)
    scored = ScoredEndpoints(eps, [0.1, 0.9, 0.5])
    assert len(scored) == 3
    assert scored[1] == ScoredEndpoint(eps[1], 0.9)
    assert list(scored) == [ScoredEndpoint(e, s) for e, s in zip(eps, [0.1, 0.9, 0.5], strict=True)]
    assert scored[1:] == [ScoredEndpoint(eps[1], 0.9), ScoredEndpoint(eps[2], 0.5)]
    with pytest.raises(ValueError, match="3 endpoints but 2 scores"):
        ScoredEndpoints(eps, [0.1, 0.2])


# ---------------------------------------------------------------------------
# The prefix-affinity filter and token-load scorer at 1,000 candidates (issue 13 §6):
# one pass per candidate, no call per endpoint. They must give what the per-endpoint
# formulas of their docstrings give, on random pools and random prefix matches.
# ---------------------------------------------------------------------------
import dataclasses  # noqa: E402

from epp.request import new_request, parse_body  # noqa: E402
from plugins.prefix.match_info import (  # noqa: E402
    PREFIX_MATCH_KEY,
    PrefixMatchInfo,
    uncached_prompt_tokens,
)
from tests.helpers import plugin  # noqa: E402


def random_pool(rng: random.Random, n: int) -> list[EndpointSnapshot]:
    return [
        dataclasses.replace(
            s,
            inflight_requests=rng.randrange(0, 8),
            inflight_tokens=(p := rng.randrange(0, 5000)) + rng.randrange(0, 5000),
            inflight_prefill_tokens=p,
            metrics=EndpointMetrics(waiting_queue_size=rng.randrange(0, 5)),
        )
        for s in snaps(n)
    ]


def random_info(rng: random.Random, pool: list[EndpointSnapshot]) -> PrefixMatchInfo:
    total = rng.randrange(1, 40)
    hit = rng.sample(pool, rng.randrange(0, min(6, len(pool) + 1)))
    blocks = {e.name: rng.randrange(0, total + 1) for e in hit}
    fill = {e.name: rng.uniform(0.0, 1.2) for e in pool}  # > 1 is clamped
    return PrefixMatchInfo(
        total_blocks=total, block_size_tokens=16, matched=blocks, cached_blocks=blocks,
        prompt_tokens=total * 16, occupancy=lambda names: [fill[n] for n in names],
    )  # fmt: skip


def reference_costs(info: PrefixMatchInfo, estimate: int, names: list[str], eviction: bool):
    """This request's own cost per endpoint, as `placement_tokens` states it: the counted
    prompt (else the estimate) less the cached tokens, times 1 + fill with evictionCost."""
    own = uncached_prompt_tokens(info, info.prompt_tokens or estimate, names)
    if not eviction:
        return own
    return [u * (1.0 + info.fill(n)) for n, u in zip(names, own, strict=True)]


def request(tokens: int):
    body = f'{{"model": "m", "prompt": "{"hello " * tokens}"}}'.encode()
    return parse_body(new_request({}, "/v1/completions", "POST"), body)


def reference_filter(f, info: PrefixMatchInfo, req, pool: list[EndpointSnapshot]):
    """The filter as its docstring states it, one `score()` and `ttft_ms()` per endpoint."""
    sticky = [e for e in pool if info.score(e.name) >= f.threshold]
    other = [e for e in pool if info.score(e.name) < f.threshold]
    if not sticky or len(pool) <= 1:
        return pool
    if f.max_penalty_ms > 0 and other:

        def best(group: list[EndpointSnapshot]) -> float:
            names = [e.name for e in group]
            if f.include_request:
                own = reference_costs(info, req.prompt_tokens_estimate, names, f.eviction)
            else:
                own = [0] * len(group)
            return min(
                (f.load_tokens(e) + u) / f.peak * 1000.0 for e, u in zip(group, own, strict=True)
            )

        if best(sticky) - best(other) > f.penalty_ms(info, sticky):
            return pool
    return sticky


@pytest.mark.parametrize("eviction", [False, True])
@pytest.mark.parametrize("signal", ["live", "prefill"])
def test_affinity_filter_and_token_load_equal_their_per_endpoint_formulas(signal, eviction):
    rng = random.Random(7)
    f = plugin(
        "prefix-cache-affinity-filter",
        {
            "loadSignal": signal,
            "peakPrefillThroughput": 1000,
            "maxTTFTPenaltyMs": 2000,
            "includeRequest": True,
            "cachedPenaltyFactor": 2,
            "evictionCost": eviction,
            **({"queuedRequestTokens": 300} if signal == "live" else {}),
        },
    )
    scorer = plugin(
        "token-load-scorer",
        {"perRequestTokens": 128, "queueThresholdTokens": 20000, "evictionCost": eviction},
    )
    outcomes = set()
    for trial in range(200):
        pool = random_pool(rng, rng.choice([2, 10, 1000]))
        info = random_info(rng, pool)
        req = request(rng.randrange(1, 400))
        state = CycleState()
        state.write(PREFIX_MATCH_KEY, info)
        got = f.filter(state, req, pool)
        want = reference_filter(f, info, req, pool)
        assert got == want, trial
        outcomes.add("all" if got is pool or len(got) == len(pool) else "sticky")
        own = reference_costs(info, req.prompt_tokens_estimate, [e.name for e in pool], eviction)
        by_formula = [
            1.0 - min(1.0, (e.inflight_tokens + 128 * e.inflight_requests + u) / 20000)
            for e, u in zip(pool, own, strict=True)
        ]
        assert scorer.score(state, req, pool) == by_formula  # exact
    assert outcomes == {"all", "sticky"}  # both branches of the gate were exercised


@pytest.mark.parametrize("seed", range(6))
def test_inlined_prefix_match_reads_equal_the_per_endpoint_calls(seed):
    """`names_scoring_at_least`, `uncached_by_name` and the prefix scorer read the matches
    without a `score`/`cached_tokens` call per endpoint: the same values as those calls,
    with tier-weighted (float) and over-long matches, with and without a token count."""
    from plugins.prefix.match_info import PrefixMatchInfo, uncached_by_name
    from plugins.prefix.prefix_scorer import scores_from

    rng = random.Random(seed)
    total = rng.choice([1, 3, 7, 16])
    names = [f"e{i}" for i in range(12)]
    cached = {n: rng.randrange(0, total + 3) for n in names if rng.random() < 0.7}
    matched = {n: b * rng.choice([1.0, 0.8, 1.25]) for n, b in cached.items()}
    info = PrefixMatchInfo(
        total_blocks=total,
        block_size_tokens=rng.choice([1, 16, 32]),
        matched=matched,
        cached_blocks=cached,
        prompt_tokens=rng.choice([0, 1, 17, 200, 5000]),
    )
    for threshold in (0.01, 0.5, 0.8, 1.0):
        expect = frozenset(n for n in matched if info.score(n) >= threshold)
        assert info.names_scoring_at_least(threshold) == expect
    for prompt in (0, 5, 150, 4000):
        assert uncached_by_name(info, prompt) == {
            n: max(0, prompt - info.cached_tokens(n)) for n in cached
        }
    endpoints = snaps(14)  # e12, e13: no match at all
    assert scores_from(info, endpoints) == [info.score(e.name) for e in endpoints]
