"""Filters and pickers on hand-made endpoint sets, with a seeded random source."""

from collections import Counter

import pytest

from epp.config.errors import ConfigError
from epp.scheduling.types import CycleState, ScoredEndpoint
from tests.helpers import completion, plugin, snap

ROLE = "llm-d.ai/role"


def names(eps):
    return [e.name for e in eps]


def run_filter(type_name, eps, params=None):
    return names(plugin(type_name, params).filter(CycleState(), completion(), eps))


POOL = [
    snap("p", labels={ROLE: "prefill"}),
    snap("d", labels={ROLE: "decode"}),
    snap("pd", labels={ROLE: "prefill-decode"}),
    snap("both", labels={ROLE: "both"}),
    snap("none"),
]


def test_decode_filter_keeps_decode_and_unlabelled():
    assert run_filter("decode-endpoints-filter", POOL) == ["d", "pd", "both", "none"]
    assert run_filter("decode-filter", POOL) == ["d", "pd", "both", "none"]


def test_prefill_filter_excludes_unlabelled():
    assert run_filter("prefill-endpoints-filter", POOL) == ["p", "pd", "both"]
    assert run_filter("prefill-filter", POOL) == ["p", "pd", "both"]


LABELLED = [
    snap("a", labels={"zone": "a", "gpu": "h100"}),
    snap("b", labels={"zone": "b", "gpu": "a100"}),
    snap("c", labels={"zone": "c"}),
]


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"matchLabels": {"zone": "a"}}, ["a"]),
        (
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]},
            ["a", "b"],
        ),
        ({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}, ["b", "c"]),
        ({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}, ["a", "b"]),
        ({"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}, ["c"]),
        (
            {
                "matchLabels": {"gpu": "h100"},
                "matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}],
            },
            [],
        ),
        ({}, ["a", "b", "c"]),
    ],
)
def test_label_selector_filter(params, expected):
    assert run_filter("label-selector-filter", LABELLED, params) == expected
    assert run_filter("by-label-selector", LABELLED, params) == expected


def test_label_selector_rejects_bad_operator_and_missing_values():
    with pytest.raises(ConfigError, match="must be one of In, NotIn, Exists, DoesNotExist"):
        plugin("label-selector-filter", {"matchExpressions": [{"key": "k", "operator": "Equals"}]})
    with pytest.raises(ConfigError, match="needs a non-empty 'values'"):
        plugin("label-selector-filter", {"matchExpressions": [{"key": "k", "operator": "In"}]})


def scored(*pairs):
    return [ScoredEndpoint(snap(n), s) for n, s in pairs]


def test_max_score_picker_takes_highest():
    p = plugin("max-score-picker")
    result = p.pick(CycleState(), completion(), scored(("a", 1.0), ("b", 2.1), ("c", 0.3)))
    assert names(result.targets) == ["b"]


def test_max_score_picker_returns_fallbacks_in_score_order():
    p = plugin("max-score-picker", {"maxNumOfEndpoints": 2})
    result = p.pick(CycleState(), completion(), scored(("a", 1.0), ("b", 2.1), ("c", 1.5)))
    assert names(result.targets) == ["b", "c"]


def test_max_score_picker_breaks_ties_at_random_not_first():
    p = plugin("max-score-picker", seed=7)
    counts = Counter(
        p.pick(CycleState(), completion(), scored(("a", 1.0), ("b", 1.0), ("c", 1.0), ("d", 0.5)))
        .targets[0]
        .name
        for _ in range(3000)
    )
    assert set(counts) == {"a", "b", "c"}
    assert min(counts.values()) > 800  # each tied endpoint gets about a third


def test_max_score_picker_ties_with_several_endpoints_are_shuffled():
    p = plugin("max-score-picker", {"maxNumOfEndpoints": 2}, seed=3)
    firsts = Counter(
        p.pick(CycleState(), completion(), scored(("a", 1.0), ("b", 1.0), ("c", 1.0)))
        .targets[0]
        .name
        for _ in range(600)
    )
    assert set(firsts) == {"a", "b", "c"}


def test_random_picker_is_uniform_and_respects_k():
    p = plugin("random-picker", {"maxNumOfEndpoints": 2}, seed=1)
    counts = Counter()
    for _ in range(3000):
        r = p.pick(CycleState(), completion(), scored(("a", 0.0), ("b", 9.0), ("c", 1.0)))
        assert len(r.targets) == 2 and len(set(names(r.targets))) == 2
        counts[r.targets[0].name] += 1
    assert min(counts.values()) > 800


def test_weighted_random_picker_follows_scores():
    p = plugin("weighted-random-picker", seed=2)
    counts = Counter(
        p.pick(CycleState(), completion(), scored(("a", 3.0), ("b", 1.0), ("z", 0.0)))
        .targets[0]
        .name
        for _ in range(4000)
    )
    assert counts["z"] == 0
    assert 2.3 < counts["a"] / counts["b"] < 3.9  # 3:1 lottery


def test_weighted_random_picker_all_zero_is_uniform():
    p = plugin("weighted-random-picker", seed=4)
    counts = Counter(
        p.pick(CycleState(), completion(), scored(("a", 0.0), ("b", 0.0))).targets[0].name
        for _ in range(2000)
    )
    assert min(counts.values()) > 800


def test_picker_rejects_zero_endpoints():
    with pytest.raises(ConfigError, match="maxNumOfEndpoints: must be at least 1"):
        plugin("max-score-picker", {"maxNumOfEndpoints": 0})


def test_round_robin_picker_takes_the_candidates_in_turn_whatever_their_scores():
    p = plugin("round-robin-picker")
    cands = scored(("a", 0.0), ("b", 9.0), ("c", 1.0))
    # 6 picks over 3 candidates: a, b, c, a, b, c — the scores (b highest) change nothing.
    firsts = [p.pick(CycleState(), completion(), cands).targets[0].name for _ in range(6)]
    assert firsts == ["a", "b", "c", "a", "b", "c"]
    # The turn is one counter: with 2 candidates the 7th pick is 6 mod 2 = index 0.
    assert p.pick(CycleState(), completion(), cands[:2]).targets[0].name == "a"
    assert p.pick(CycleState(), completion(), []).targets == []


def test_round_robin_picker_fallbacks_follow_the_turn():
    p = plugin("round-robin-picker", {"maxNumOfEndpoints": 2})
    cands = scored(("a", 1.0), ("b", 1.0), ("c", 1.0))
    assert names(p.pick(CycleState(), completion(), cands).targets) == ["a", "b"]
    assert names(p.pick(CycleState(), completion(), cands).targets) == ["b", "c"]
    assert names(p.pick(CycleState(), completion(), cands).targets) == ["c", "a"]
