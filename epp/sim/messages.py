"""The simulator's Anthropic Messages API: POST /v1/messages, as vLLM 0.32 serves it.

vLLM converts a Messages request into a chat request (`epp.anthropic.to_chat_body`, the
same conversion the EPP makes), runs it through the chat path and converts the answer
back (`vllm/entrypoints/anthropic/serving.py`): a non-streamed body
`{"type": "message", "content": [{"type": "text", ...}], "stop_reason", "usage"}` and a
stream of `event: NAME` / `data: {...}` pairs: `message_start`, `content_block_start`,
one `content_block_delta` (`text_delta`) per token, `content_block_stop`,
`message_delta` (stop reason and usage), `message_stop`. Usage is Anthropic's:
`input_tokens` leaves out `cache_read_input_tokens` (vLLM's `_build_anthropic_usage`).
Errors come in Anthropic's shape (`{"type": "error", "error": {"type", "message"}}`).
`POST /v1/messages/count_tokens` answers `{"input_tokens": N}`.
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any

from aiohttp import web

from epp import anthropic
from epp.errors import EppError
from epp.sim.openai import ApiError, parse, read_json

if TYPE_CHECKING:
    from epp.sim.openai_routes import OpenAIRoutes

_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def anthropic_usage(usage: dict[str, Any]) -> dict[str, Any]:
    """OpenAI usage → Anthropic's, as vLLM 0.32 builds it."""
    cached = usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
    return {
        "input_tokens": max(0, usage["prompt_tokens"] - cached),
        "output_tokens": usage["completion_tokens"],
        "cache_read_input_tokens": cached,
    }


def event(name: str, data: dict[str, Any]) -> str:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n"


class MessagesBuilder:
    """The bodies of one Messages response (the role of `ResponseBuilder` for chat)."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.id = f"msg_{uuid.uuid4().hex}"

    def full(
        self,
        texts: list[str],
        finish_reasons: list[str],
        usage_: dict[str, Any],
        kv_transfer_params: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "content": [{"type": "text", "text": texts[0]}],
            "model": self.model,
            "stop_reason": _STOP_REASONS.get(finish_reasons[0]),
            "stop_sequence": None,
            "usage": anthropic_usage(usage_),
            "kv_transfer_params": kv_transfer_params,
        }

    # The SSE framing `OpenAIRoutes.stream` writes (ResponseBuilder has the same four).
    def sse_start(self, usage_: dict[str, Any]) -> str:
        message = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": self.model,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {**anthropic_usage(usage_), "output_tokens": 0},
        }
        block = {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "text", "text": ""},
        }
        return event("message_start", {"type": "message_start", "message": message}) + event(
            "content_block_start", block
        )

    def sse_token(self, index: int, text: str, first: bool, finish_reason: str | None) -> str:
        delta = {"type": "text_delta", "text": text}
        return event(
            "content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}
        )

    def sse_end(self, finish_reason: str, usage_: dict[str, Any], include_usage: bool) -> str:
        delta = {"stop_reason": _STOP_REASONS.get(finish_reason), "stop_sequence": None}
        return (
            event("content_block_stop", {"type": "content_block_stop", "index": 0})
            + event(
                "message_delta",
                {"type": "message_delta", "delta": delta, "usage": anthropic_usage(usage_)},
            )
            + event("message_stop", {"type": "message_stop"})
        )

    def sse_error(self, status: int, message: str) -> str:
        return event("error", {"type": "error", "error": _error(status, message)["error"]})


def _error(status: int, message: str) -> dict[str, Any]:
    return json.loads(EppError(status, message, anthropic=True).body())


class MessagesRoutes:
    def __init__(self, openai: OpenAIRoutes) -> None:
        self.openai = openai

    def register(self, router: web.UrlDispatcher) -> None:
        router.add_post("/v1/messages", self.messages)
        router.add_post("/v1/messages/count_tokens", self.count_tokens)

    def chat_body(self, body: Any) -> dict[str, Any]:
        """The chat request vLLM converts a Messages body to (400 in Anthropic's shape)."""
        if not isinstance(body, dict):
            raise ApiError(400, "request body must be a JSON object")
        # vLLM merges inline system messages when the template refuses them after the
        # first (the plain rendering accepts them anywhere).
        template = getattr(self.openai.server.render, "template", None)
        merge = template is not None and template.merges_inline_system
        try:
            anthropic.validate(body)
            chat = anthropic.to_chat_body(body, merge_inline_system=merge)
        except EppError as e:
            raise ApiError(e.status, e.message) from None
        return chat

    async def messages(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await read_json(request)
            chat = self.chat_body(body)
            chat["max_tokens"] = body["max_tokens"]
            chat["stream"] = body.get("stream") or False
            chat["stream_options"] = {"include_usage": True}
            for name in ("cache_salt", "kv_transfer_params"):
                if body.get(name) is not None:
                    chat[name] = body[name]
            return await self.openai.run(request, chat, MessagesBuilder(chat["model"]))
        except ApiError as e:
            self.openai.server.stats.requests_rejected += e.status < 500
            return web.json_response(_error(e.status, e.message), status=e.status)

    async def count_tokens(self, request: web.Request) -> web.Response:
        try:
            body = await read_json(request)
            if isinstance(body, dict):
                body.setdefault("max_tokens", 1)
            chat = self.chat_body(body)
            server = self.openai.server
            req = parse(
                "chat",
                chat,
                server.config,
                tokenizer=server.tokenizer,
                render=server.render,
                models=server.served_models(),
            )
        except ApiError as e:
            return web.json_response(_error(e.status, e.message), status=e.status)
        return web.json_response({"input_tokens": len(req.prompts[0])})
