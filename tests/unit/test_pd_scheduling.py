"""P/D scheduling: the disagg handler and the deciders on hand-made endpoint sets."""

import json
import logging
import random
import textwrap

import pytest

from epp.config.errors import ConfigError
from epp.config.loader import load_config_text
from epp.datastore import Datastore, Endpoint
from epp.director import Director
from epp.errors import EppError
from epp.extproc.stream import RequestStream
from epp.headers import PREFILLER_HOST_PORT
from epp.observability import REGISTRY
from epp.scheduling.registry import Handle
from epp.scheduling.scheduler import Scheduler
from epp.scheduling.types import CycleState
from plugins.prefix.match_info import PREFIX_MATCH_KEY, PrefixMatchInfo
from tests.helpers import completion, plugin, snap
from tests.unit.test_stream import body_msg, headers_msg

ROLE = "llm-d.ai/role"
HEAD = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"


def pd_config(handler_params: str = "", decider: str = "", extra_plugins: str = "") -> str:
    return HEAD + textwrap.dedent(
        f"""
        plugins:
        - type: prefill-filter
        - type: decode-filter
        - type: queue-scorer
        - type: max-score-picker
        {decider}
        {extra_plugins}
        - type: disagg-profile-handler
          parameters: {handler_params or "{}"}
        schedulingProfiles:
        - name: prefill
          plugins: [{{pluginRef: prefill-filter}}, {{pluginRef: queue-scorer}}]
        - name: decode
          plugins: [{{pluginRef: decode-filter}}, {{pluginRef: queue-scorer}}]
        """
    )


ALWAYS = "- {type: always-disagg-pd-decider, name: always}"
PREFIX_256 = "- {type: prefix-based-pd-decider, name: pd, parameters: {nonCachedTokens: 256}}"


def load(text: str):
    """Load and check the handler's references, as the loader's validation hook would."""
    cfg = load_config_text(text, "pd.yaml", Handle(rng=random.Random(0)))
    cfg.scheduler.handler.validate_profiles(cfg.scheduler.profiles)
    return cfg


def load_error(text: str) -> str:
    with pytest.raises((ConfigError, ValueError)) as e:
        load(text)
    return str(e.value)


class FixedMatches:
    """A stand-in prefix producer: writes the given match info into the cycle."""

    name = type_name = "fixed-matches"
    produces = PREFIX_MATCH_KEY

    def __init__(self, info: PrefixMatchInfo | None) -> None:
        self.info = info

    def produce(self, state, request, endpoints):
        return self.info


def with_producer(cfg, info: PrefixMatchInfo | None) -> Scheduler:
    s = cfg.scheduler
    return Scheduler(s.handler, s.profiles, [FixedMatches(info)])


def pool(prefill: int = 2, decode: int = 2, **queues: int):
    roles = [("p", "prefill")] * prefill + [("d", "decode")] * decode
    counts = {"p": 0, "d": 0}
    out = []
    for prefix, role in roles:
        name = f"{prefix}{counts[prefix]}"
        counts[prefix] += 1
        out.append(snap(name, labels={ROLE: role}, queue=queues.get(name, 0)))
    return out


def prompt(tokens: int):
    """A completion whose estimate is exactly `tokens` (4 characters per token)."""
    return completion("x" * (4 * tokens))


def decisions() -> dict[str, float]:
    get = REGISTRY.get_sample_value
    return {
        k: get("inference_extension_disagg_decisions_total", {"decision_type": k}) or 0.0
        for k in ("decode-only", "prefill-decode")
    } | {"unavailable": get("inference_extension_disagg_prefill_unavailable_total") or 0.0}


def delta(before: dict[str, float]) -> dict[str, float]:
    return {k: v - before[k] for k, v in decisions().items() if v != before[k]}


def info(cached: dict[str, int], block: int = 16, total: int = 100) -> PrefixMatchInfo:
    return PrefixMatchInfo(
        total_blocks=total,
        block_size_tokens=block,
        matched={k: v * 0.8 for k, v in cached.items()},  # tier-weighted: must be ignored
        cached_blocks=cached,
    )


# ---- deciders -----------------------------------------------------------------


def decide(decider, request, decode_name: str, match: PrefixMatchInfo | None) -> bool:
    state = CycleState()
    if match is not None:
        state.write(PREFIX_MATCH_KEY, match)
    return decider.disaggregate(state, request, snap(decode_name))


def test_prefix_decider_uses_uncached_tokens_on_the_decode_endpoint_exactly():
    d = plugin("prefix-based-pd-decider", {"nonCachedTokens": 256})
    # 400 tokens, 9 blocks × 16 = 144 cached on d0: 256 uncached → exactly at threshold.
    assert decide(d, prompt(400), "d0", info({"d0": 9})) is True
    assert decide(d, prompt(400), "d0", info({"d0": 10})) is False  # 240 uncached
    # The cache of another endpoint does not count for d0.
    assert decide(d, prompt(400), "d0", info({"d1": 25})) is True
    # Unweighted: weighted matches (0.8 × blocks) would say 115 cached and disaggregate.
    assert decide(d, prompt(400), "d0", info({"d0": 11})) is False


def test_prefix_decider_short_prompts_zero_threshold_and_prompt_gate():
    assert decide(plugin("prefix-based-pd-decider"), prompt(10_000), "d0", info({})) is False
    d = plugin("prefix-based-pd-decider", {"nonCachedTokens": 256})
    assert decide(d, prompt(255), "d0", info({})) is False
    assert decide(d, prompt(256), "d0", info({})) is True
    gated = plugin("prefix-based-pd-decider", {"nonCachedTokens": 256, "promptTokens": 1024})
    assert decide(gated, prompt(1023), "d0", info({})) is False
    assert decide(gated, prompt(1024), "d0", info({})) is True


def test_prefix_decider_without_match_info_stays_decode_only_and_says_so(caplog):
    d = plugin("prefix-based-pd-decider", {"nonCachedTokens": 16})
    with caplog.at_level(logging.DEBUG, logger="epp.plugins.deciders"):
        assert decide(d, prompt(1000), "d0", None) is False
        assert decide(d, prompt(1000), "d0", None) is False
    levels = [r.levelno for r in caplog.records]
    assert levels == [logging.WARNING, logging.DEBUG]  # loud once, then quiet
    assert "no prefix match info" in caplog.records[0].getMessage()


def test_always_decider():
    assert decide(plugin("always-disagg-pd-decider"), prompt(1), "d0", None) is True


def test_decider_parameters_are_strict():
    text = pd_config(decider="- {type: prefix-based-pd-decider, parameters: {nonCached: 5}}")
    msg = load_error(text)
    assert "nonCached" in msg and "nonCachedTokens" in msg
    negative = "- {type: prefix-based-pd-decider, parameters: {nonCachedTokens: -1}}"
    msg = load_error(pd_config(decider=negative))
    assert "at least 0" in msg


# ---- the handler ------------------------------------------------------------------


def test_long_prompt_goes_prefill_decode_with_the_header():
    cfg = load(pd_config("{deciders: {prefill: pd}}", PREFIX_256))
    before = decisions()
    result = with_producer(cfg, info({})).schedule(prompt(1000), pool(p1=3, d0=2))
    assert result.primary_profile == "decode"
    assert result.targets[0].name == "d1"  # the less loaded decode endpoint
    prefill = result.profile_results["prefill"]
    assert prefill is not None and prefill.targets[0].name == "p0"
    assert result.headers == {PREFILLER_HOST_PORT: prefill.targets[0].hostport}
    assert result.headers[PREFILLER_HOST_PORT] == f"{prefill.targets[0].endpoint.address}:8000"
    assert delta(before) == {"prefill-decode": 1.0}


def test_short_or_cached_prompt_stays_decode_only_and_prefill_never_runs():
    cfg = load(pd_config("{deciders: {prefill: pd}}", PREFIX_256))
    ran = []
    cfg.scheduler.profiles["prefill"].run = lambda *a: ran.append(a)  # type: ignore[method-assign]
    before = decisions()
    sched = with_producer(cfg, info({"d0": 60, "d1": 60}))  # 960 of 1000 tokens cached
    for request in (prompt(100), prompt(1000)):
        result = sched.schedule(request, pool())
        assert list(result.profile_results) == ["decode"]
        assert result.headers == {}
        assert result.targets[0].endpoint.role == "decode"
    assert ran == []
    assert delta(before) == {"decode-only": 2.0}


def test_cached_on_one_decode_endpoint_only_matters_if_that_one_is_picked():
    cfg = load(pd_config("{deciders: {prefill: pd}}", PREFIX_256))
    sched = with_producer(cfg, info({"d0": 60}))
    assert sched.schedule(prompt(1000), pool(d1=5)).headers == {}  # d0 picked: cached
    assert PREFILLER_HOST_PORT in sched.schedule(prompt(1000), pool(d0=5)).headers  # d1: not


def test_no_prefill_endpoint_falls_back_to_decode_only_and_is_counted():
    cfg = load(pd_config("{deciders: {prefill: always}}", ALWAYS))
    before = decisions()
    result = cfg.scheduler.schedule(prompt(1000), pool(prefill=0))
    assert list(result.profile_results) == ["decode"] and result.headers == {}
    assert delta(before) == {"decode-only": 1.0, "unavailable": 1.0}


def test_prefill_pick_that_is_the_decode_endpoint_is_decode_only():
    cfg = load(pd_config("{deciders: {prefill: always}}", ALWAYS))
    both = [snap("pd0", labels={ROLE: "prefill-decode"})]
    result = cfg.scheduler.schedule(prompt(1000), both)
    assert result.targets[0].name == "pd0"
    assert list(result.profile_results) == ["decode"] and result.headers == {}


def test_without_a_decider_every_request_is_decode_only():
    cfg = load(pd_config())
    result = cfg.scheduler.schedule(prompt(5000), pool())
    assert list(result.profile_results) == ["decode"] and result.headers == {}


def test_no_decode_endpoint_is_503_and_not_counted():
    cfg = load(pd_config("{deciders: {prefill: always}}", ALWAYS))
    before = decisions()
    with pytest.raises(EppError) as e:
        cfg.scheduler.schedule(prompt(10), pool(decode=0))
    assert e.value.status == 503 and "decode" in e.value.message
    assert delta(before) == {}


def test_unlabelled_endpoints_decode_but_never_prefill():
    cfg = load(pd_config("{deciders: {prefill: always}}", ALWAYS))
    result = cfg.scheduler.schedule(prompt(1000), [snap("plain")])
    assert result.targets[0].name == "plain" and result.headers == {}


def test_decode_pick_is_published_for_prefill_plugins():
    cfg = load(pd_config("{deciders: {prefill: always}}", ALWAYS))
    seen = []
    prefill = cfg.scheduler.profiles["prefill"]
    original = prefill.run

    def spy(state, request, candidates):
        seen.append(state.read("disagg-profile-handler/decode-endpoint"))
        return original(state, request, candidates)

    prefill.run = spy  # type: ignore[method-assign]
    result = cfg.scheduler.schedule(prompt(1000), pool())
    assert [s.name for s in seen] == [result.targets[0].name]


def test_director_holds_both_endpoints_of_a_pd_request():
    cfg = load(pd_config("{deciders: {prefill: always}}", ALWAYS))
    ds = Datastore(require_metrics=False)
    ds.set_endpoints(
        [
            Endpoint("p0", "10.0.0.1", 8000, {ROLE: "prefill"}),
            Endpoint("d0", "10.0.0.2", 8000, {ROLE: "decode"}),
        ]
    )
    decision = Director(ds, cfg.scheduler, cfg.pre_request).route(prompt(100), None)
    assert decision.destinations == ["10.0.0.2:8000"]
    assert decision.headers == {PREFILLER_HOST_PORT: "10.0.0.1:8000"}
    assert ds.inflight("p0")[0] == 1 and ds.inflight("d0")[0] == 1
    Director(ds, cfg.scheduler, cfg.pre_request).release(decision)
    assert ds.inflight("p0") == (0, 0) and ds.inflight("d0") == (0, 0)


def _set_headers(responses) -> tuple[dict[str, str], list[str]]:
    mutation = responses[0].request_headers.response.header_mutation
    return (
        {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers},
        list(mutation.remove_headers),
    )


def test_ext_proc_sets_the_header_and_never_forwards_a_client_copy():
    cfg = load(pd_config("{deciders: {prefill: pd}}", PREFIX_256))
    ds = Datastore(require_metrics=False)
    ds.set_endpoints(
        [
            Endpoint("p0", "10.0.0.1", 8000, {ROLE: "prefill"}),
            Endpoint("d0", "10.0.0.2", 8000, {ROLE: "decode"}),
        ]
    )
    cfg.scheduler = with_producer(cfg, info({}))
    director = Director(ds, cfg.scheduler, cfg.pre_request)
    client = {":path": "/v1/completions", ":method": "POST", PREFILLER_HOST_PORT: "6.6.6.6:1"}
    # Long prompt: P/D, the header is ours (a set overwrites the client's).
    long_body = json.dumps({"model": "m", "prompt": "x" * 4000}).encode()
    s = RequestStream(director, 1 << 20)
    s.handle(headers_msg(client))
    set_h, removed = _set_headers(s.handle(body_msg(long_body, True)))
    assert set_h[PREFILLER_HOST_PORT] == "10.0.0.1:8000" and PREFILLER_HOST_PORT not in removed
    s.close()
    # Short prompt: decode-only, the client's copy is removed.
    s = RequestStream(director, 1 << 20)
    s.handle(headers_msg(client))
    short_body = json.dumps({"model": "m", "prompt": "hi"}).encode()
    set_h, removed = _set_headers(s.handle(body_msg(short_body, True)))
    assert PREFILLER_HOST_PORT not in set_h and PREFILLER_HOST_PORT in removed
    s.close()


# ---- configuration -------------------------------------------------------------------


def test_nested_and_legacy_flat_parameters_both_load():
    nested = "{profiles: {decode: decode, prefill: prefill}, deciders: {prefill: pd}}"
    flat = "{decodeProfile: decode, prefillProfile: prefill, deciderPluginName: pd}"
    for params in (nested, flat):
        h = load(pd_config(params, PREFIX_256)).scheduler.handler
        assert (h.decode, h.prefill, h.params.decider_name) == ("decode", "prefill", "pd")


def test_custom_profile_names():
    text = pd_config("{profiles: {decode: d, prefill: p}, deciders: {prefill: always}}", ALWAYS)
    text = text.replace("name: prefill", "name: p").replace("name: decode", "name: d")
    cfg = load(text)
    result = cfg.scheduler.schedule(prompt(1000), pool())
    assert result.primary_profile == "d" and set(result.profile_results) == {"d", "p"}


def test_mixing_nested_and_flat_is_an_error_naming_both():
    msg = load_error(pd_config("{profiles: {decode: decode}, deciderPluginName: pd}", PREFIX_256))
    assert "profiles.decode" in msg and "deciderPluginName" in msg and "one of them" in msg
    assert "plugins[" in msg  # the field path of the handler's parameters


def test_unknown_decider_is_named_with_the_defined_ones():
    msg = load_error(pd_config("{deciders: {prefill: nope}}", PREFIX_256))
    assert "'nope'" in msg and "Defined deciders: pd" in msg
    msg = load_error(pd_config("{deciders: {prefill: queue-scorer}}", PREFIX_256))
    assert "queue-scorer" in msg and "not a P/D decider" in msg


def test_unknown_profiles_are_named_with_the_defined_ones():
    msg = load_error(pd_config("{profiles: {decode: dec}, deciders: {prefill: pd}}", PREFIX_256))
    assert "decode profile 'dec'" in msg and "Defined profiles: decode, prefill" in msg
    msg = load_error(pd_config("{profiles: {prefill: pre}, deciders: {prefill: pd}}", PREFIX_256))
    assert "prefill profile 'pre'" in msg
    msg = load_error(pd_config("{profiles: {decode: x, prefill: x}}"))
    assert "must differ" in msg
    msg = load_error(pd_config("{profiles: {decoder: decode}}"))
    assert "decoder" in msg and "did you mean 'decode'" in msg


def test_a_bad_reference_fails_the_first_request_clearly_until_checked_at_load():
    try:
        cfg = load_config_text(pd_config("{deciders: {prefill: nope}}", PREFIX_256), "pd.yaml")
    except ConfigError as e:  # the loader runs the handler's check: better still
        assert "'nope'" in str(e)
        return
    with pytest.raises(EppError) as e:
        cfg.scheduler.schedule(prompt(10), pool())
    assert e.value.status == 500 and "'nope'" in e.value.message


def test_a_profile_per_role_needs_the_handler():
    text = pd_config().replace(
        "- type: disagg-profile-handler\n  parameters: {}\n", ""
    )  # two profiles, no handler
    with pytest.raises(ConfigError) as e:
        load_config_text(text, "pd.yaml")
    assert "disagg-profile-handler" in str(e.value)


# ---- the shipped config, with the real prefix producer -------------------------------------


def test_shipped_pd_config_long_goes_pd_then_the_same_prompt_stays_on_its_decoder():
    from pathlib import Path

    from epp.config.loader import load_config_file

    path = Path(__file__).resolve().parents[2] / "config" / "pd-disagg.yaml"
    cfg = load_config_file(path, Handle(rng=random.Random(0)))
    cfg.scheduler.handler.validate_profiles(cfg.scheduler.profiles)
    ds = Datastore(require_metrics=False)
    ds.set_endpoints(
        [Endpoint(f"p{i}", f"10.0.0.{i + 1}", 8000, {ROLE: "prefill"}) for i in range(2)]
        + [Endpoint(f"d{i}", f"10.0.1.{i + 1}", 8000, {ROLE: "decode"}) for i in range(2)]
    )
    director = Director(ds, cfg.scheduler, cfg.pre_request)
    long = completion(" ".join(f"word{i}" for i in range(2000)))  # ~3.5K tokens
    first = director.route(long, None)
    director.release(first)
    assert first.headers[PREFILLER_HOST_PORT].startswith("10.0.0.")
    assert first.destinations[0].startswith("10.0.1.")
    again = director.route(completion(long.prompt_text), None)
    director.release(again)
    assert again.headers == {} and again.destinations == first.destinations
    # A new long prompt sharing nothing is disaggregated again; a short one never is.
    other = director.route(completion("fresh " * 2000), None)
    assert PREFILLER_HOST_PORT in other.headers
    assert director.route(completion("hello there"), None).headers == {}
