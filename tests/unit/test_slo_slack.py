"""slo-slack-scorer on hand-made endpoint snapshots and predictions, config/slo-slack.yaml
through the scheduler, and the SLO workload family's seeded tuning / reporting split."""

import random
from pathlib import Path

import pytest

from epp.config.loader import load_config_file
from epp.request import new_request, parse_body
from epp.scheduling.registry import Handle
from epp.scheduling.types import CycleState
from plugins.latency.info import LATENCY_PREDICTION_KEY, LatencyPrediction, LatencyPredictionInfo
from tests.helpers import completion, plugin, snap

ROOT = Path(__file__).parents[2]
FAST, SLOW = snap("fast"), snap("slow")
# The fast endpoint: TTFT 40 ms, TPOT 10 ms; the slow one (2x): 80 ms, 20 ms.
PREDS = {"fast": (40.0, 10.0), "slow": (80.0, 20.0)}
CHAT = (150.0, 25.0)  # tight: on slow its TPOT slack is 0.2, on fast 0.6
LONG = (2000.0, None)  # loose: slack 0.98 on fast, 0.96 on slow


def state_with(preds, ttft=None, tpot=None) -> CycleState:
    s = CycleState()
    s.write(
        LATENCY_PREDICTION_KEY,
        LatencyPredictionInfo(
            {k: LatencyPrediction(a, b, True) for k, (a, b) in preds.items()}, ttft, tpot
        ),
    )
    return s


def scores(slo, params=None, preds=PREDS, eps=(FAST, SLOW)):
    st = state_with(preds, *slo)
    return plugin("slo-slack-scorer", params).score(st, completion(), list(eps))


def best(ss, eps=(FAST, SLOW)):
    return eps[max(range(len(ss)), key=ss.__getitem__)].name


def test_a_tight_request_avoids_the_endpoint_a_loose_one_is_sent_to():
    # packing (`least`): the loose request is safe on both and takes the one it needs
    # least (slow); the tight one is not safe on slow (TPOT slack 0.2 < 0.3): fast
    pack = {"safeStrategy": "least", "safeSlack": 0.3}
    loose, tight = scores(LONG, pack), scores(CHAT, pack)
    assert best(loose) == "slow" and best(tight) == "fast"
    assert tight[0] >= 0.5 > tight[1]


def test_default_flat_leaves_a_loose_request_to_the_other_scorers():
    # safe on both: equal scores (the profile's load scorer chooses) …
    assert scores(LONG) == [1.0, 1.0]
    # … while a tight request is kept off the endpoint that would miss it
    tight = scores((150.0, 18.0))  # slow's predicted TPOT 20 > 18
    assert tight[0] == 1.0 and tight[1] < 0.5


def test_a_loose_request_keeps_the_fast_endpoint_only_when_slow_would_miss():
    # slow has a long prefill queued: predicted TTFT 1900 ms > 70 % of the 2 s target
    ss = scores(
        LONG,
        {"safeStrategy": "least", "safeSlack": 0.3},
        {"fast": (40.0, 10.0), "slow": (1900.0, 20.0)},
    )
    assert best(ss) == "fast"


def test_missing_everywhere_goes_where_it_misses_least():
    ss = scores((30.0, 5.0))  # both miss; fast by less
    assert best(ss) == "fast" and max(ss) < 0.5


def test_strategies_among_safe_endpoints():
    assert best(scores(LONG, {"safeStrategy": "most"})) == "fast"
    assert best(scores(LONG, {"safeStrategy": "least"})) == "slow"
    # `least`: the score at the margin is 1 and an instant endpoint 0.5
    sc = plugin("slo-slack-scorer", {"safeSlack": 0.3, "safeStrategy": "least"})
    assert sc.score_slack(0.3) == 1.0 and sc.score_slack(1.0) == pytest.approx(0.5)
    assert sc.score_slack(-5.0) == 0.0 and sc.score_slack(0.29) < 0.5


def test_ranking_by_ttft_slack_with_tpot_as_a_guard():
    # both safe; fast leaves more TTFT slack, slow more TPOT slack (made up): `most` ranks
    # by TTFT slack alone by default, by TPOT with rankTtftWeight 0
    preds = {"fast": (20.0, 20.0), "slow": (100.0, 10.0)}
    assert best(scores(CHAT, {"safeStrategy": "most"}, preds)) == "fast"
    assert best(scores(CHAT, {"safeStrategy": "most", "rankTtftWeight": 0.0}, preds)) == "slow"


def test_chance_scoring_is_the_probability_of_meeting_both_targets():
    ss = scores(CHAT, {"scoring": "chance", "errorSpread": 0.3})
    # fast: TTFT 40 vs 150 and TPOT 10 vs 25: nearly sure; slow: TPOT 20 vs 25, ~77 %
    assert ss[0] > 0.99 and 0.7 < ss[1] < 0.8


def test_without_targets_or_predictions_the_scorer_is_neutral():
    assert scores((None, None)) == [0.5, 0.5]
    sc = plugin("slo-slack-scorer")
    assert sc.score(CycleState(), completion(), [FAST, SLOW]) == [0.5, 0.5]
    # a candidate without a prediction: neutral rather than guessing
    assert scores(LONG, preds={"fast": (40.0, 10.0)}) == [0.5, 0.5]


def test_params_are_checked_by_name():
    with pytest.raises(Exception, match="safeStrategy"):
        plugin("slo-slack-scorer", {"safeStrategy": "middle"})
    with pytest.raises(Exception, match="safeSlack"):
        plugin("slo-slack-scorer", {"safeSlack": 1.5})


# --- config/slo-slack.yaml through the scheduler ------------------------------------------


def _request(headers: dict[str, str], words: int = 100):
    body = b'{"model":"m","prompt":"' + b"x " * words + b'"}'
    return parse_body(new_request(headers, "/v1/completions", "POST"), body)


def test_equal_slack_is_broken_by_in_flight_tokens_as_documented():
    cfg = load_config_file(ROOT / "config" / "slo-slack.yaml", Handle(rng=random.Random(0)))
    req = _request({"x-slo-ttft-ms": "5000"})
    # Cold start: TTFT from the pending prefill (equal here), so both endpoints have the same
    # slack; they differ only in decode tokens in flight, which the token-load scorer reads.
    a = snap("a", inflight_prefill_tokens=100, inflight_tokens=4000)
    b = snap("b", inflight_prefill_tokens=100, inflight_tokens=100)
    picks = {cfg.scheduler.schedule(req, [a, b]).targets[0].name for _ in range(20)}
    assert picks == {"b"}


@pytest.mark.parametrize("config", ["slo-slack.yaml", "slo-externality.yaml"])
def test_requests_without_targets_route_as_the_default_config(config):
    # The sticky routing without SLO plugins (config/prefix-aware.yaml, which the default
    # config is for a request without targets).
    slack = load_config_file(ROOT / "config" / config, Handle(rng=random.Random(0)))
    default = load_config_file(ROOT / "config" / "prefix-aware.yaml", Handle(rng=random.Random(0)))
    rng = random.Random(5)
    for _ in range(50):
        eps = [
            snap(n, inflight_tokens=rng.randrange(5000), inflight_prefill_tokens=rng.randrange(900))
            for n in ("a", "b", "c")
        ]
        req = _request({}, words=rng.randrange(10, 300))
        got = slack.scheduler.schedule(req, eps).targets[0].name
        assert got == default.scheduler.schedule(req, eps).targets[0].name


# --- the workload family ----------------------------------------------------------------


def test_the_split_is_fixed_by_seed_and_disjoint():
    from epp.sim.slo_workloads import FAMILY_SEED, SPLIT_SEED, family, split

    one, two = split(family(FAMILY_SEED)), split(family(FAMILY_SEED))
    assert one == two  # reproducible: the same workloads, the same halves
    tune = {w.name for w in one["tuning"]}
    report = {w.name for w in one["reporting"]}
    assert not tune & report and len(tune) == len(report) == len(family()) // 2
    # another split seed picks other halves (the seed is what fixes them)
    assert {w.name for w in split(family(), SPLIT_SEED + 1)["tuning"]} != tune
    for w in family():
        assert 1.5 <= w.slow_factor <= 3.0 and 0.5 <= w.chat_share <= 0.9
        assert 0.4 <= w.load <= 0.9 and w.slow_count in (1, 2)


def test_miss_strategy_flat_leaves_a_request_that_misses_everywhere_to_the_other_scorers():
    assert scores((30.0, 5.0), {"missStrategy": "flat"}) == [0.0, 0.0]
    # a safe endpoint still outranks the missing one
    assert scores(CHAT, {"missStrategy": "flat", "safeSlack": 0.3}) == [1.0, 0.0]
