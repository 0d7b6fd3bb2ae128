"""OpenAI request bodies → `InferenceRequest`.

The API is chosen by the path suffix, as the upstream EPP's OpenAI parser does
(`/chat/completions`, `/completions`, `/embeddings`, `/responses`). Parsing checks only
what routing needs and what would make the model server fail anyway; unknown fields
pass through untouched. Every refusal is an `EppError` with status 400 and a message
naming the field.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from epp import anthropic
from epp.errors import bad_request
from epp.headers import FAIRNESS_ID, MODEL_REWRITE, OBJECTIVE, REQUEST_ID
from epp.limits import BodyLimits, prompt_too_long
from epp.media import MediaItem, chat_part_media
from epp.session_key import DEFAULT_SOURCES as DEFAULT_SESSION_SOURCES
from epp.session_key import session_key

DEFAULT_BODY_LIMITS = BodyLimits()

# A client's x-request-id is kept only if it is 1..128 printable ASCII characters without
# spaces (UUIDs, W3C trace ids, Envoy's own); anything else is replaced by a fresh UUID,
# so a tab, a newline or a megabyte never reaches the logs or the model server.
MAX_REQUEST_ID_CHARS = 128
_REQUEST_ID_OK = re.compile(rf"[!-~]{{1,{MAX_REQUEST_ID_CHARS}}}")
# A JSON \u escape of a UTF-16 surrogate: json.loads accepts a lone one, which then
# breaks every UTF-8 encode downstream (prefix hashing, the forwarded body).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")

# Upstream's estimate when no tokenizer is configured (GIE approximateprefix, llm-d deciders).
CHARS_PER_TOKEN = 4

API_CHAT = "chat"
API_COMPLETIONS = "completions"
API_EMBEDDINGS = "embeddings"
API_RESPONSES = "responses"
API_MESSAGES = "messages"  # Anthropic's Messages API (epp.anthropic)
API_OTHER = "other"
API_NONE = "none"  # a body-less request (GET)

_SUFFIXES = (
    ("/chat/completions", API_CHAT),
    ("/completions", API_COMPLETIONS),
    ("/embeddings", API_EMBEDDINGS),
    ("/responses", API_RESPONSES),
    ("/messages", API_MESSAGES),  # /v1/messages/count_tokens is API_OTHER: passed through
)


def api_for_path(path: str) -> str:
    path = path.split("?", 1)[0].rstrip("/")
    for suffix, api in _SUFFIXES:
        if path.endswith(suffix):
            return api
    return API_OTHER


def is_anthropic_path(path: str) -> bool:
    """/v1/messages and /v1/messages/count_tokens: their clients read Anthropic's error
    shape (`EppError.anthropic`)."""
    path = path.split("?", 1)[0].rstrip("/")
    return path.endswith("/messages") or path.endswith("/messages/count_tokens")


@dataclass(slots=True)
class InferenceRequest:
    """Everything scheduling needs to know about one request, parsed once."""

    request_id: str
    path: str = "/"
    method: str = "POST"
    api: str = API_NONE
    headers: Mapping[str, str] = field(default_factory=dict)
    body: dict[str, Any] | None = None
    model: str = ""
    target_model: str = ""
    prompt_text: str = ""
    # The prompt as token ids when the client sent ids (/v1/completions accepts them):
    # the exact tokens the server caches, so prefix hashing uses them, not text. A batch
    # of several token-id prompts gives [] (no single prefix to route on).
    prompt_token_ids: list[int] | None = None
    prompt_token_count: int = 0
    max_tokens: int | None = None
    stream: bool = False
    objective: str | None = None
    fairness_id: str | None = None
    cache_salt: str | None = None
    # /v1/messages: the chat-completions body vLLM converts it to (what its template renders).
    chat_body: dict[str, Any] | None = None
    # Media items in prompt order (`epp.media`), and where the first one's marker starts
    # in `prompt_text` (-1: none): the precise index stops its match before it.
    media: tuple[MediaItem, ...] = ()
    media_at: int = -1
    # Characters the server reads but the prompt text leaves out (Anthropic documents):
    # counted in the estimate, so --max-prompt-tokens bounds them too.
    extra_chars: int = 0
    # Where the session key is read from (`BodyLimits.session_sources`); the key itself is
    # read only when a plugin or flow control asks (`session_key`).
    session_sources: tuple[str, ...] = DEFAULT_SESSION_SOURCES
    _session_key: str | bool | None = False  # False: not read yet
    # OpenAI's prompt_cache_key: a prefix-routing hint (plugins/prefix/cache_key_hint.py).
    prompt_cache_key: str | None = None

    @property
    def session_key(self) -> str | None:
        """The client's session: the first of `session_sources` the request carries
        (`epp.session_key`), read on first use: the default config never asks."""
        key = self._session_key
        if key is False:
            key = self._session_key = session_key(self.headers, self.body, self.session_sources)
        return key  # type: ignore[return-value]

    @session_key.setter
    def session_key(self, value: str | None) -> None:
        self._session_key = value

    @property
    def fairness_key(self) -> str | None:
        """Flow control's fairness id: the client's `x-gateway-inference-fairness-id`, else
        the session key (as llm-d falls back to the agent identity)."""
        return self.fairness_id or self.session_key

    # The objective's priority, set by the director before scheduling (admitters read it).
    priority: int = 0

    @property
    def prompt_tokens_estimate(self) -> int:
        """Prompt length in tokens: exact for token-id prompts, else characters / 4
        (upstream's rule)."""
        if self.prompt_token_count:
            return self.prompt_token_count
        chars = len(self.prompt_text) + self.extra_chars
        return max(1, chars // CHARS_PER_TOKEN) if chars else 0

    @property
    def expected_output_tokens(self) -> int:
        """max_tokens when given, else 1.5 × prompt (upstream inflight-load-producer's guess)."""
        if self.max_tokens is not None:
            return self.max_tokens
        return round(1.5 * self.prompt_tokens_estimate)

    def body_for_upstream(self) -> bytes | None:
        """The body to forward when the model must change (header or rewrite), else None."""
        if self.body is None or self.target_model == self.model:
            return None
        body = dict(self.body)
        body["model"] = self.target_model
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def new_request(headers: Mapping[str, str], path: str, method: str) -> InferenceRequest:
    """A request from its headers alone; the body, if any, is added by `parse_body`."""
    return InferenceRequest(
        request_id=valid_request_id(headers.get(REQUEST_ID)) or str(uuid.uuid4()),
        path=path,
        method=method,
        headers=headers,
        objective=valid_request_id(headers.get(OBJECTIVE)),
        fairness_id=valid_request_id(headers.get(FAIRNESS_ID)),
    )


def valid_request_id(value: str | None) -> str | None:
    """`value` if it is an acceptable request id (see _REQUEST_ID_OK), else None. The
    objective and fairness-id headers (client-chosen by design, as in GIE) are held to
    the same rule: a value that is not a short printable token is ignored."""
    return value if value and _REQUEST_ID_OK.fullmatch(value) else None


def parse_body(
    req: InferenceRequest, raw: bytes, limits: BodyLimits = DEFAULT_BODY_LIMITS
) -> InferenceRequest:
    """Fill `req` from the raw body; raises EppError(400) on anything unusable."""
    if not raw or not raw.strip():
        raise bad_request("request body is empty; expected a JSON object")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad_request(f"request body is not valid UTF-8 (byte {e.start})") from None
    body = _loads(text, limits.max_json_depth)
    if not isinstance(body, dict):
        raise bad_request(f"request body must be a JSON object, got a JSON {_json_kind(body)}")

    model = body.get("model")
    if model is None:
        raise bad_request("field 'model' is missing from the request body")
    if not isinstance(model, str) or not model:
        raise bad_request("field 'model' must be a non-empty string")

    req.body = body
    req.api = api_for_path(req.path)
    req.model = model
    req.target_model = req.headers.get(MODEL_REWRITE) or model
    req.stream = _bool_field(body, "stream")
    req.max_tokens = _max_tokens(body)
    salt = body.get("cache_salt")
    req.cache_salt = salt if isinstance(salt, str) and salt else None
    key = body.get("prompt_cache_key")
    req.prompt_cache_key = key if isinstance(key, str) and key else None
    if req.api == API_COMPLETIONS:
        req.prompt_token_ids, req.prompt_token_count = _token_id_prompt(body)
    if req.prompt_token_ids is None:
        messages = body.get("messages")
        if isinstance(messages, list) and len(messages) > limits.max_messages:
            raise bad_request(
                f"field 'messages' has {len(messages)} messages, over the limit of "
                f"{limits.max_messages} (set by epp serve --max-messages)"
            )
        if req.api == API_CHAT or req.api == API_MESSAGES:
            _read_conversation(req, body)
        else:
            req.prompt_text = _PROMPT_READERS.get(req.api, _no_prompt)(body)
    if req.prompt_tokens_estimate > limits.max_prompt_tokens:
        raise prompt_too_long(req.prompt_tokens_estimate, limits.max_prompt_tokens)
    req.session_sources = limits.session_sources
    return req


def _loads(text: str, max_depth: int) -> Any:
    """json.loads with every way it can fail turned into a 400 naming the problem."""
    try:
        body = json.loads(text)
    except json.JSONDecodeError as e:
        raise bad_request(
            f"request body is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}"
        ) from None
    except RecursionError:
        raise bad_request(
            f"request body nests deeper than {max_depth} levels (set by epp serve --max-json-depth)"
        ) from None
    except ValueError as e:  # int() of more than sys.get_int_max_str_digits() digits
        raise bad_request(f"request body has a number the parser refuses: {e}"[:300]) from None
    # Depth can exceed the limit only if there are more brackets than the limit: one
    # count of each bracket byte (C speed) spares almost every request the walk.
    if text.count("[") + text.count("{") > max_depth and _depth_over(body, max_depth):
        raise bad_request(
            f"request body nests deeper than {max_depth} levels (set by epp serve --max-json-depth)"
        )
    if _SURROGATE_ESCAPE.search(text) is not None:
        try:
            json.dumps(body, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise bad_request(
                "request body has a lone UTF-16 surrogate (a \\uD800-\\uDFFF escape without "
                "its pair): it is not valid Unicode text"
            ) from None
    return body


def _depth_over(value: Any, limit: int) -> bool:
    """True if `value` nests more than `limit` arrays/objects deep (iterative: no recursion)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(v, dict):
            stack.extend((c, depth + 1) for c in v.values() if isinstance(c, dict | list))
        elif isinstance(v, list):
            stack.extend((c, depth + 1) for c in v if isinstance(c, dict | list))
    return False


def _json_kind(value: object) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number"
    )


def _bool_field(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad_request(f"field '{name}' must be a boolean, got {_json_kind(value)}")
    return value


def _max_tokens(body: dict[str, Any]) -> int | None:
    for name in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise bad_request(f"field '{name}' must be a non-negative integer, got {value!r}")
        return value
    return None


def _completions_prompt(body: dict[str, Any]) -> str:
    if "prompt" not in body:
        raise bad_request("field 'prompt' is missing; /v1/completions needs a prompt")
    prompt = body["prompt"]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        return " ".join(prompt)
    raise bad_request("field 'prompt' must be a string, a list of strings, or a list of token ids")


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value
    )


def _token_id_prompt(body: dict[str, Any]) -> tuple[list[int] | None, int]:
    """(ids, count) for a prompt of token ids or a batch of them; (None, 0) otherwise."""
    prompt = body.get("prompt")
    if not isinstance(prompt, list) or not prompt:
        return None, 0
    if _is_ids(prompt):
        return prompt, len(prompt)
    if all(_is_ids(p) for p in prompt):
        return (prompt[0] if len(prompt) == 1 else []), sum(len(p) for p in prompt)
    return None, 0


def _message_text(content: Any, where: str, media: list[MediaItem] | None = None) -> str:
    """A message's text parts joined, each media part as its marker at its place
    (`epp.media`; appended to `media` when given)."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict):
                raise bad_request(f"{where}.content[{i}] must be an object with a 'type'")
            if part.get("type") == "text":
                text = part.get("text")
                if not isinstance(text, str):
                    raise bad_request(f"{where}.content[{i}].text must be a string")
                parts.append(text)
            else:
                item = chat_part_media(part, f"{where}.content[{i}]")
                if item is not None:
                    parts.append(item.marker)
                    if media is not None:
                        media.append(item)
        return "".join(parts)
    raise bad_request(f"{where}.content must be a string or a list of content parts")


def render_chat(messages: list[dict[str, Any]]) -> str:
    """A plain rendering of the conversation, stable across requests sharing a prefix."""
    return "".join(f"<|{m['role']}|>\n{m['text']}\n" for m in messages)


def _read_conversation(req: InferenceRequest, body: dict[str, Any]) -> None:
    """Chat and Messages requests: the plain rendering (media markers in place), the
    media items, and for Messages the converted chat body vLLM renders."""
    chat = body
    if req.api == API_MESSAGES:
        anthropic.validate(body)
        chat = req.chat_body = anthropic.to_chat_body(body)
        req.extra_chars = anthropic.document_chars(body)
    media: list[MediaItem] = []
    # A Messages body can convert to no messages at all (only documents, which vLLM's
    # converter drops): nothing to render then, and no 400 of the EPP's own.
    empty = chat is not body and not chat["messages"]
    rendered = "" if empty else _chat_prompt(chat, media)
    req.prompt_text = anthropic.tools_text(chat) + rendered if "tools" in chat else rendered
    if media:
        req.media = tuple(media)
        req.media_at = req.prompt_text.find(media[0].marker)


def _chat_prompt(body: dict[str, Any], media: list[MediaItem] | None = None) -> str:
    messages = body.get("messages")
    if messages is None:
        raise bad_request("field 'messages' is missing; /v1/chat/completions needs messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("field 'messages' must be a non-empty list of messages")
    rendered = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad_request(f"{where} must be an object with 'role' and 'content'")
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise bad_request(f"{where}.role must be a non-empty string")
        text = _message_text(m.get("content"), where, media)
        if role == "assistant" and ("tool_calls" in m or "reasoning" in m):
            text = _extras(m) + text
        rendered.append({"role": role, "text": text})
    return render_chat(rendered)


def _extras(m: dict[str, Any]) -> str:
    """An assistant turn's reasoning and tool calls, which the template writes into the
    prompt too: in the plain rendering (and so in the prompt estimate)."""
    reasoning = m.get("reasoning")
    calls = m.get("tool_calls")
    out = reasoning if isinstance(reasoning, str) else ""
    if calls:
        out += json.dumps(calls, ensure_ascii=False)
    return out


def _embeddings_input(body: dict[str, Any]) -> str:
    if "input" not in body:
        raise bad_request("field 'input' is missing; /v1/embeddings needs an input")
    value = body["input"]
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return " ".join(v if isinstance(v, str) else json.dumps(v) for v in value)
    raise bad_request("field 'input' must be a string or a list")


def _responses_input(body: dict[str, Any]) -> str:
    if "input" not in body:
        raise bad_request("field 'input' is missing; /v1/responses needs an input")
    value = body["input"]
    instructions = body.get("instructions")
    head = instructions if isinstance(instructions, str) else ""
    return head + (value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))


def _no_prompt(body: dict[str, Any]) -> str:
    return ""


_PROMPT_READERS = {
    API_COMPLETIONS: _completions_prompt,
    API_EMBEDDINGS: _embeddings_input,
    API_RESPONSES: _responses_input,
}
