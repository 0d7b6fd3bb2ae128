"""Chat requests rendered by the model's own template as vLLM renders them, tokenized as
vLLM tokenizes them, once per request.

A model directory is written per test: a byte-level BPE trained locally (`tokenizers`),
`<s>`/`</s>` as special tokens, optionally a post-processor that adds `<s>` (as Llama's
does), and a chat template. The expected strings are written out by hand from the
template; the real-vLLM tier (`tests/real_vllm/test_epp_prediction_parity.py`) checks the
same rendering against vLLM's own `/tokenize`.
"""

from __future__ import annotations

import json
import random

import pytest

from epp.chat_template import ChatTemplate, TemplateRenderError
from epp.config.params import parse_params
from epp.datastore import Endpoint
from epp.prompt_tokens import TEMPLATE_FALLBACKS, encode_request, prompt_token_ids
from epp.request import new_request, parse_body
from epp.scheduling.registry import PLUGIN_TYPES, Handle
from epp.scheduling.types import CycleState
from epp.tokenizer import HFTokenizer, load_tokenizer
from plugins.prefix.match_info import PrefixMatchInfo
from tests.helpers import snap

SIMPLE = (
    "{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' + message['content'] "
    "+ '</s>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
RICH = (  # BOS, tools, tool calls, content parts (so the "openai" content format), kwargs
    "{{ bos_token }}{% if tools %}{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}"
    "{% endif %}{% for message in messages %}<|{{ message['role'] }}|>"
    "{% for part in message['content'] %}[{{ part['text'] }}]{% endfor %}"
    "{% if message.tool_calls %}{% for c in message.tool_calls %}"
    "{{ c.function.name }}{{ c.function.arguments | tojson }}{% endfor %}{% endif %}</s>"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
    "{% if think %}<think>{% endif %}"
)
SPECIALS = {"bos_token": "<s>", "eos_token": "</s>"}


def model_dir(tmp_path, template: str | None = SIMPLE, *, bos: bool = False, jinja_file=True):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

    tmp_path.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(["the user asks the assistant about routing and caches"] * 20, trainer)
    if bos:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))]
        )
    tok.save(str(tmp_path / "tokenizer.json"))
    config: dict = {"bos_token": {"content": "<s>"}, "eos_token": "</s>"}
    if template is not None and jinja_file:
        (tmp_path / "chat_template.jinja").write_text(template)
    elif template is not None:
        config["chat_template"] = template
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp_path


def chat(body: dict, path: str = "/v1/chat/completions"):
    return parse_body(new_request({}, path, "POST"), json.dumps({"model": "m", **body}).encode())


def test_a_model_directory_loads_its_template_from_either_file(tmp_path):
    a = load_tokenizer(str(model_dir(tmp_path / "a", jinja_file=True)))
    b = load_tokenizer(str(model_dir(tmp_path / "b", jinja_file=False)))
    c = load_tokenizer(str(model_dir(tmp_path / "c", template=None)))
    assert isinstance(a, HFTokenizer) and a.chat_template is not None
    assert b.chat_template is not None and b.chat_template.source == SIMPLE
    assert c.chat_template is None  # plain rendering then
    # A tokenizer.json path alone has no template either.
    assert HFTokenizer(tmp_path / "a" / "tokenizer.json").chat_template is None


def test_string_format_joins_text_parts_with_newlines_and_none_is_empty():
    t = ChatTemplate(SIMPLE, SPECIALS)
    assert t.content_format == "string"
    body = {
        "messages": [
            {"role": "system", "content": "sys"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
            {"role": "assistant", "content": None},
        ]
    }
    want = "<|system|>\nsys</s>\n<|user|>\na\nb</s>\n<|assistant|>\n</s>\n<|assistant|>\n"
    assert t.render(body) == want
    assert t.render({**body, "add_generation_prompt": False}) == want[: -len("<|assistant|>\n")]


def test_openai_format_tools_tool_calls_and_kwargs():
    t = ChatTemplate(RICH, SPECIALS)
    assert t.content_format == "openai"  # the template loops over message['content']
    body = {
        "messages": [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "tool_calls": [
                    {"type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
                    {"type": "function", "function": {"name": "g", "arguments": "not json"}},
                ],
            },
            {"role": "tool", "tool_call_id": "1", "content": [{"type": "text", "text": "ok"}]},
        ],
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "chat_template_kwargs": {"think": True, "add_generation_prompt": False},
    }
    # tools as vLLM's model_dump(): description and parameters null; arguments parsed to
    # a dict ({} when not JSON); the tool result flattened to a string ("ok"), which
    # this template iterates by character, and a character has no ['text'] (empty); the
    # request's add_generation_prompt (default true)
    # wins over the one in chat_template_kwargs.
    want = (
        '<s>{"type": "function", "function": {"name": "f", "description": null, '
        '"parameters": null}}\n'
        "<|user|>[hi]</s>"
        '<|assistant|>f{"x": 1}g{}</s>'
        "<|tool|>[][]</s>"
        "<|assistant|><think>"
    )
    assert t.render(body) == want


def test_developer_messages_become_one_leading_system_message():
    t = ChatTemplate(SIMPLE, SPECIALS)
    body = {
        "messages": [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "U"},
            {"role": "developer", "content": "D"},
        ]
    }
    assert t.render(body) == "<|system|>\nS\n\nD</s>\n<|user|>\nU</s>\n<|assistant|>\n"


def test_continue_final_message_cuts_after_the_final_text():
    t = ChatTemplate(SIMPLE, SPECIALS)
    body = {
        "messages": [{"role": "user", "content": "U"}, {"role": "assistant", "content": "The "}],
        "add_generation_prompt": False,
        "continue_final_message": True,
    }
    # Rendered "...The CONTINUE_FINAL_MESSAGE_TAG </s>\n": the template kept the tag's
    # trailing space, so the text is cut right before the tag, "The " intact.
    assert t.render(body) == "<|user|>\nU</s>\n<|assistant|>\nThe "
    with pytest.raises(TemplateRenderError, match="cannot both"):
        t.render({**body, "add_generation_prompt": True})


def test_bos_comes_once_from_the_tokenizer_on_completions_and_from_the_template_on_chats(
    tmp_path,
):
    tok = load_tokenizer(str(model_dir(tmp_path, "{{ bos_token }}" + SIMPLE, bos=True)))
    bos = 0  # the first special token trained
    completion = encode_request(chat({"prompt": "the user"}, "/v1/completions"), tok)
    assert completion[0] == bos and bos not in completion[1:]
    no_special = chat({"prompt": "the user", "add_special_tokens": False}, "/v1/completions")
    assert encode_request(no_special, tok) == completion[1:]
    ids = encode_request(chat({"messages": [{"role": "user", "content": "the user"}]}), tok)
    assert ids[0] == bos and ids.count(bos) == 1  # the template's; none added on top
    assert ids == tok.encode("<s><|user|>\nthe user</s>\n<|assistant|>\n")
    # Client-sent token ids pass through untouched.
    assert encode_request(chat({"prompt": [5, 6, 7]}, "/v1/completions"), tok) == [5, 6, 7]


def test_a_template_that_cannot_render_falls_back_to_plain_rendering_and_counts(tmp_path):
    tok = load_tokenizer(str(model_dir(tmp_path, "{{ raise_exception('no') }}")))
    before = TEMPLATE_FALLBACKS._value.get()
    req = chat({"messages": [{"role": "user", "content": "the user"}]})
    assert encode_request(req, tok) == tok.encode(req.prompt_text)  # plain rendering
    assert TEMPLATE_FALLBACKS._value.get() == before + 1
    # An image part: vLLM inserts a model-specific placeholder the EPP cannot know.
    good = load_tokenizer(str(model_dir(tmp_path / "g")))
    image = {"type": "image_url", "image_url": {"url": "data:,"}}
    req = chat({"messages": [{"role": "user", "content": [image]}]})
    assert encode_request(req, good) == good.encode(req.prompt_text)
    assert TEMPLATE_FALLBACKS._value.get() == before + 2


def build(type_name: str, params: dict):
    spec = PLUGIN_TYPES.lookup(type_name)
    assert spec is not None
    pool = [Endpoint("a", "10.0.0.1", 8000)]
    handle = Handle(rng=random.Random(0), pool=lambda: pool)
    return spec.build(type_name, parse_params(spec.params, params), handle)


def test_one_tokenization_per_request_is_shared_by_both_producers(tmp_path):
    d = str(model_dir(tmp_path))
    approx = build("approx-prefix-cache-producer", {"tokenizer": d, "blockSizeTokens": 2})
    precise = build("precise-prefix-cache-producer", {"tokenizer": d, "blockSizeTokens": 2})
    req = chat({"messages": [{"role": "user", "content": "the user asks"}]})
    state = CycleState()
    endpoints = [snap("a")]
    a = approx.produce(state, req, endpoints)
    ids = prompt_token_ids(state, req, precise.tokenizer)
    assert ids == approx.tokenizer.encode(approx.tokenizer.chat_template.render(req.body))
    # The precise producer reads the list the approximate one stored: swap in other ids
    # and its chain follows them (4 ids at block size 2 = 2 blocks).
    state.write("prompt-tokens:" + precise.tokenizer.name, [1, 2, 3, 4])
    p = precise.produce(state, req, endpoints)
    assert p.total_blocks == 2 and p.prompt_tokens == 4
    assert a.prompt_tokens == len(ids)


def test_cached_tokens_never_include_the_last_prompt_token():
    # 64 tokens, block 32, both blocks held: vLLM recomputes the last token, so it looks
    # up at most 63 tokens → 1 whole block → 32 cached tokens.
    full = PrefixMatchInfo(2, 32, {"a": 2.0}, {"a": 2}, prompt_tokens=64)
    assert full.cached_tokens("a") == 32
    # 70 tokens: up to 69 looked up → 2 whole blocks.
    assert PrefixMatchInfo(3, 32, {"a": 2.0}, {"a": 2}, prompt_tokens=70).cached_tokens("a") == 64
    # Character-cut prompts (prompt_tokens 0) are not capped.
    assert PrefixMatchInfo(2, 32, {"a": 2.0}, {"a": 2}).cached_tokens("a") == 64


def test_reasoning_effort_turns_thinking_on_unless_the_kwargs_say_otherwise():
    t = ChatTemplate("{% if enable_thinking %}T{% else %}F{% endif %}", SPECIALS)
    msgs = [{"role": "user", "content": "U"}]
    assert t.render({"messages": msgs}) == "F"
    assert t.render({"messages": msgs, "reasoning_effort": "high"}) == "T"
    assert t.render({"messages": msgs, "reasoning_effort": "none"}) == "F"
    kwargs = {"enable_thinking": False}
    assert (
        t.render({"messages": msgs, "reasoning_effort": "high", "chat_template_kwargs": kwargs})
        == "F"
    )


def test_the_two_probes_vllms_messages_route_makes():
    """vLLM's Messages route probes the template: does it refuse a system message after
    the first (then inline system messages are merged), and does it render reasoning
    effort "none" differently from every effort (else thinking disabled becomes "low")."""
    from epp.chat_template import ChatTemplate

    strict = ChatTemplate(
        "{% for m in messages %}{% if m.role == 'system' and not loop.first %}"
        "{{ raise_exception('system first') }}{% endif %}{{ m.content }}{% endfor %}",
        {},
    )
    lenient = ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}", {})
    assert strict.merges_inline_system and not lenient.merges_inline_system
    thinking = ChatTemplate(
        "{% for m in messages %}{{ m.content }}{% endfor %}"
        "{% if enable_thinking is defined and not enable_thinking %}/no_think{% endif %}",
        {},
    )
    assert thinking.disabled_thinking_effort == "none"
    assert lenient.disabled_thinking_effort == "low"  # renders "none" like any effort


def test_a_messages_request_is_rendered_with_the_templates_probe_answers():
    import json as _json

    from epp.chat_template import ChatTemplate
    from epp.prompt_tokens import encode_request
    from epp.request import new_request, parse_body

    class Tok:
        name = "chars"

        def __init__(self, source: str) -> None:
            self.chat_template = ChatTemplate(source, {})
            self.texts: list[str] = []

        def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
            self.texts.append(text)
            return [ord(c) for c in text]

    source = (
        "{% for m in messages %}{% if m.role == 'system' and not loop.first %}"
        "{{ raise_exception('system first') }}{% endif %}[{{ m.role }}]{{ m.content }}"
        "{% endfor %}{% if reasoning_effort is defined %}<{{ reasoning_effort }}>{% endif %}"
    )
    body = {
        "model": "m",
        "max_tokens": 4,
        "system": "S.",
        "thinking": {"type": "disabled"},
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "system", "content": "R."},
            {"role": "user", "content": "q2"},
        ],
    }
    req = parse_body(new_request({}, "/v1/messages", "POST"), _json.dumps(body).encode())
    tok = Tok(source)
    encode_request(req, tok)
    # merged (the template refuses a second system message); effort "none" is rendered
    # differently from the others here, so thinking disabled stays "none"
    assert tok.texts == ["[system]S.R.[user]q[user]q2<none>"]
