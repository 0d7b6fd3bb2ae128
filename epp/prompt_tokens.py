"""A request's prompt as the model server's token ids: rendered and tokenized once per
request, shared by every plugin that asks for it with the same tokenizer.

The cache lives in the request's `CycleState` (created per request, dropped with it), under
`prompt-tokens:<tokenizer name>`: the approximate and the precise prefix producers, a P/D
decider or any later consumer configured with the same model read one list of ids.

How vLLM 0.32 turns a request into ids (`vllm/entrypoints/openai/*/protocol.py`):
- token ids sent by the client (/v1/completions) pass through unchanged;
- /v1/completions text: tokenized WITH special tokens (`add_special_tokens` defaults to
  true; a client may send false), so a tokenizer that adds BOS gets it here;
- /v1/chat/completions: rendered by the model's chat template (`epp.chat_template`) and
  tokenized WITHOUT special tokens (transformers' `apply_chat_template(tokenize=True)`),
  so the BOS comes only from the template. A template that cannot render a request (an
  image part, a template's raise_exception, a shape it does not expect) falls back to
  the plain rendering (`epp.request.render_chat`), counted in
  `epp_chat_template_fallbacks_total`; the client never sees an error from it (the
  server answers whatever it answers);
- /v1/messages: converted to the chat body vLLM builds (`epp.anthropic`), then as chat;
- anything else (embeddings, responses): the extracted prompt text, no special tokens.
"""

from __future__ import annotations

import logging

from prometheus_client import Counter

from epp import anthropic
from epp.chat_template import ChatTemplate, TemplateRenderError
from epp.observability import REGISTRY
from epp.request import API_CHAT, API_COMPLETIONS, API_MESSAGES, InferenceRequest
from epp.scheduling.types import CycleState
from epp.tokenizer import Tokenizer

log = logging.getLogger(__name__)

_KEY = "prompt-tokens:"

TEMPLATE_FALLBACKS = Counter(
    "epp_chat_template_fallbacks_total",
    "Chat requests the model's chat template could not render; their prefix blocks were "
    "hashed from the plain rendering instead.",
    registry=REGISTRY,
)


def prompt_token_ids(
    state: CycleState | None, request: InferenceRequest, tokenizer: Tokenizer
) -> list[int]:
    """The request's token ids under `tokenizer`, computed at most once per request."""
    key = _KEY + tokenizer.name
    if state is not None:
        ids = state.read(key)
        if ids is not None:
            return ids
    ids = encode_request(request, tokenizer)
    if state is not None:
        state.write(key, ids)
    return ids


def encode_request(request: InferenceRequest, tokenizer: Tokenizer) -> list[int]:
    """The token ids the model server will compute for this request (see the module doc)."""
    if request.prompt_token_ids is not None:
        return request.prompt_token_ids
    body = request.body or {}
    if request.api == API_CHAT or request.api == API_MESSAGES:
        template = getattr(tokenizer, "chat_template", None)
        if template is not None:
            try:
                return tokenizer.encode(template.render(_chat_body(request, template)))
            except TemplateRenderError as e:
                TEMPLATE_FALLBACKS.inc()
                log.debug("chat template fallback for %s: %s", request.request_id, e)
        return tokenizer.encode(request.prompt_text)
    if request.api == API_COMPLETIONS:
        special = body.get("add_special_tokens", True)
        return tokenizer.encode(request.prompt_text, add_special_tokens=special is not False)
    return tokenizer.encode(request.prompt_text)


def _chat_body(request: InferenceRequest, template: ChatTemplate) -> dict:
    """What the template renders: the chat body itself, or for /v1/messages the chat
    body vLLM converts it to, with this template's answers to vLLM's two probes."""
    if request.api != API_MESSAGES or request.chat_body is None:
        return request.body or {}
    body = request.body or {}
    thinking = body.get("thinking")
    disabled = isinstance(thinking, dict) and thinking.get("type") == "disabled"
    effort = template.disabled_thinking_effort if disabled else "none"
    if template.merges_inline_system or effort != "none":
        return anthropic.to_chat_body(
            body, merge_inline_system=template.merges_inline_system, disabled_effort=effort
        )
    return request.chat_body
