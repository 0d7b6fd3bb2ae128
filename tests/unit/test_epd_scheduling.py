"""Encode/prefill/decode: the multimodal decider, the encoder-cache affinity scorer and the
disagg handler's encode stage, on hand-made endpoint sets."""

import json
import random
import textwrap
from pathlib import Path

import pytest

from epp.config.loader import load_config_text
from epp.headers import ENCODER_HOSTS_PORTS, PREFILLER_HOST_PORT
from epp.observability import REGISTRY
from epp.request import InferenceRequest, new_request, parse_body
from epp.scheduling.registry import Handle
from epp.scheduling.types import CycleState, ProfileResult, SchedulingResult
from tests.helpers import plugin, snap

ROLE = "llm-d.ai/role"
ROOT = Path(__file__).resolve().parents[2]
PNG_A = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8"
PNG_B = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"


def chat(*images: str, text: str = "What is in this picture?") -> InferenceRequest:
    parts = [{"type": "text", "text": text}]
    parts += [{"type": "image_url", "image_url": {"url": u}} for u in images]
    body = {"model": "m", "messages": [{"role": "user", "content": parts}], "max_tokens": 4}
    return parse_body(new_request({}, "/v1/chat/completions", "POST"), json.dumps(body).encode())


def messages(*images: str) -> InferenceRequest:
    blocks: list[dict] = [{"type": "text", "text": "Describe it."}]
    blocks += [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": d}}
        for d in images
    ]
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": blocks}]}
    return parse_body(new_request({}, "/v1/messages", "POST"), json.dumps(body).encode())


def pool(encode: int = 2, decode: int = 2, prefill: int = 0, **queues: int):
    out = []
    for prefix, role, n in (
        ("e", "encode", encode),
        ("p", "prefill", prefill),
        ("d", "decode", decode),
    ):
        for i in range(n):
            name = f"{prefix}{i}"
            out.append(snap(name, labels={ROLE: role}, queue=queues.get(name, 0)))
    return out


def decisions() -> dict[str, float]:
    kinds = ("decode-only", "prefill-decode", "encode-decode", "encode-prefill-decode")
    get = REGISTRY.get_sample_value
    return {
        k: get("inference_extension_disagg_decisions_total", {"decision_type": k}) or 0.0
        for k in kinds
    }


def delta(before: dict[str, float]) -> dict[str, float]:
    return {k: v - before[k] for k, v in decisions().items() if v != before[k]}


# ---- the decider ----------------------------------------------------------------


def test_multimodal_decider_runs_encode_for_media_only():
    d = plugin("always-disagg-multimodal-decider")
    state, decode = CycleState(), snap("d0")
    assert d.disaggregate(state, chat(PNG_A), decode) is True
    assert d.disaggregate(state, messages(PNG_B), decode) is True  # Anthropic image block
    audio = {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}
    body = {"model": "m", "messages": [{"role": "user", "content": [audio]}]}
    req = parse_body(new_request({}, "/v1/chat/completions", "POST"), json.dumps(body).encode())
    assert d.disaggregate(state, req, decode) is True
    assert d.disaggregate(state, chat(), decode) is False  # text parts only
    text = parse_body(
        new_request({}, "/v1/completions", "POST"), b'{"model": "m", "prompt": "an image_url"}'
    )
    assert d.disaggregate(state, text, decode) is False


# ---- the scorer -----------------------------------------------------------------


def encoded(scorer, request: InferenceRequest, endpoint) -> None:
    result = SchedulingResult(
        {"decode": ProfileResult([snap("d0")]), "encode": ProfileResult([endpoint])},
        primary_profile="decode",
    )
    scorer.pre_request(request, result)


def test_encoder_cache_scorer_prefers_where_the_items_were_encoded():
    s = plugin("encoder-cache-affinity-scorer")
    e0, e1, e2 = snap("e0"), snap("e1"), snap("e2")
    both = chat(PNG_A, PNG_B)
    assert s.score(CycleState(), both, [e0, e1, e2]) == [0.0, 0.0, 0.0]  # nothing known
    encoded(s, chat(PNG_A), e1)
    # Same image, other text and API shape (the key is the media item, not the prompt).
    assert s.score(CycleState(), chat(PNG_A, text="Other text"), [e0, e1, e2]) == [0, 1.0, 0]
    assert s.score(CycleState(), both, [e0, e1, e2]) == [0.0, 0.5, 0.0]  # one of two items
    encoded(s, chat(PNG_B), e2)
    assert s.score(CycleState(), both, [e0, e1, e2]) == [0.0, 0.5, 0.5]
    # The latest encode wins; an unrelated image and a text request score nothing.
    encoded(s, both, e0)
    assert s.score(CycleState(), both, [e0, e1, e2]) == [1.0, 0.0, 0.0]
    assert s.score(CycleState(), chat("https://example.com/x.png"), [e0, e1]) == [0.0, 0.0]
    assert s.score(CycleState(), chat(), [e0, e1]) == [0.0, 0.0]


def test_encoder_cache_scorer_learns_nothing_without_an_encode_pick_and_is_bounded():
    s = plugin("encoder-cache-affinity-scorer", {"maxItems": 2})
    no_encode = SchedulingResult({"decode": ProfileResult([snap("d0")])}, primary_profile="decode")
    s.pre_request(chat(PNG_A), no_encode)
    assert len(s) == 0
    urls = [f"https://example.com/{i}.png" for i in range(3)]
    for u in urls:
        encoded(s, chat(u), snap("e0"))
    assert len(s) == 2
    assert s.score(CycleState(), chat(urls[0]), [snap("e0")]) == [0.0]  # evicted first
    assert s.score(CycleState(), chat(urls[2]), [snap("e0")]) == [1.0]


# ---- the handler ----------------------------------------------------------------

HEAD = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"
EPD = HEAD + textwrap.dedent(
    """
    plugins:
    - type: encode-filter
    - type: prefill-filter
    - type: decode-filter
    - type: queue-scorer
    - type: encoder-cache-affinity-scorer
    - type: max-score-picker
    - {type: always-disagg-multimodal-decider, name: mm}
    - {type: always-disagg-pd-decider, name: pd}
    - type: disagg-profile-handler
      parameters: HANDLER
    schedulingProfiles:
    - name: encode
      plugins: [{pluginRef: encode-filter}, {pluginRef: queue-scorer},
                {pluginRef: encoder-cache-affinity-scorer, weight: 3}]
    - name: prefill
      plugins: [{pluginRef: prefill-filter}, {pluginRef: queue-scorer}]
    - name: decode
      plugins: [{pluginRef: decode-filter}, {pluginRef: queue-scorer}]
    """
)


def load(handler: str):
    cfg = load_config_text(
        EPD.replace("HANDLER", handler), "epd.yaml", Handle(rng=random.Random(0))
    )
    cfg.scheduler.handler.validate_profiles(cfg.scheduler.profiles)
    return cfg


def schedule(cfg, request, endpoints):
    result = cfg.scheduler.schedule(request, endpoints)
    for p in cfg.pre_request:
        p.pre_request(request, result)
    return result


def test_a_multimodal_request_gets_the_encoder_header_and_a_text_one_does_not():
    cfg = load("{deciders: {encode: mm}}")
    before = decisions()
    r = schedule(cfg, chat(PNG_A), pool(e0=3, d1=2))
    enc = r.profile_results["encode"]
    assert enc is not None and enc.targets[0].name == "e1"  # the less loaded encoder
    assert r.primary_profile == "decode" and r.targets[0].name == "d0"
    assert r.headers == {ENCODER_HOSTS_PORTS: enc.targets[0].hostport}
    assert delta(before) == {"encode-decode": 1.0}
    before = decisions()
    r = schedule(cfg, chat(), pool())
    assert "encode" not in r.profile_results and r.headers == {}
    assert delta(before) == {"decode-only": 1.0}


def test_the_same_image_goes_back_to_its_encoder_even_when_busier():
    cfg = load("{deciders: {encode: mm}}")
    first = schedule(cfg, chat(PNG_A), pool())
    e = first.profile_results["encode"].targets[0].name
    busy = {e: 2}  # queue weight 1 against affinity weight 3
    again = schedule(cfg, messages(PNG_A.partition(",")[2]), pool(**busy))
    assert again.profile_results["encode"].targets[0].name == e
    other = schedule(cfg, chat(PNG_B), pool(**busy))
    assert other.profile_results["encode"].targets[0].name != e


def test_encode_then_prefill_sets_both_headers_and_no_encoder_falls_back():
    cfg = load("{deciders: {encode: mm, prefill: pd}}")
    before = decisions()
    r = schedule(cfg, chat(PNG_A), pool(prefill=1))
    assert set(r.headers) == {ENCODER_HOSTS_PORTS, PREFILLER_HOST_PORT}
    assert r.headers[PREFILLER_HOST_PORT] == r.profile_results["prefill"].targets[0].hostport
    assert delta(before) == {"encode-prefill-decode": 1.0}
    before = decisions()
    r = schedule(cfg, chat(PNG_A), pool(encode=0, prefill=1))  # no encode server: go on
    assert set(r.headers) == {PREFILLER_HOST_PORT}
    assert r.profile_results.get("encode") is None
    assert delta(before) == {"prefill-decode": 1.0}


def test_the_encoder_holds_no_prefix_blocks():
    from plugins.prefix.approx_producer import first_targets

    e, d = snap("e0", labels={ROLE: "encode"}), snap("d0", labels={ROLE: "decode"})
    r = SchedulingResult(
        {"decode": ProfileResult([d]), "encode": ProfileResult([e])}, primary_profile="decode"
    )
    assert [s.name for s in first_targets(r)] == ["d0"]


@pytest.mark.parametrize(
    ("handler", "needle"),
    [
        ("{deciders: {encode: nope}}", "decider 'nope' is not defined"),
        (
            "{deciders: {encode: mm}, profiles: {encode: enc}}",
            "encode profile 'enc' is not defined",
        ),
        ("{profiles: {encode: decode}}", "the decode and encode profiles must differ"),
        ("{deciders: {encode: mm}, encodeProfile: encode}", "mixes the nested form"),
    ],
)
def test_bad_encode_settings_are_named(handler, needle):
    with pytest.raises(Exception) as e:
        load(handler)
    assert needle in str(e.value)


def test_legacy_flat_encode_parameters_load():
    cfg = load("{encodeDeciderPluginName: mm, encodeProfile: encode}")
    r = schedule(cfg, chat(PNG_B), pool())
    assert ENCODER_HOSTS_PORTS in r.headers


def test_shipped_epd_config_loads_and_routes_media_to_an_encoder():
    text = (ROOT / "config" / "epd.yaml").read_text()
    cfg = load_config_text(text, "epd.yaml", Handle(rng=random.Random(0)))
    cfg.scheduler.handler.validate_profiles(cfg.scheduler.profiles)
    r = schedule(cfg, chat(PNG_A), pool(prefill=1))
    assert r.headers[ENCODER_HOSTS_PORTS] in {s.hostport for s in pool()[:2]}
    assert ENCODER_HOSTS_PORTS not in schedule(cfg, chat(), pool(prefill=1)).headers
