"""The remote-prefill protocol of llm-d's NIXL v2 connector, as pure byte/JSON rewrites.

llm-d's `pd-sidecar` (`pkg/sidecar/proxy/connector_nixlv2.go`) defines it:

- prefill leg: the client's body with `kv_transfer_params` asking the prefill server to
  keep the KV for a remote decoder, `stream: false`, no `stream_options`, and a one-token
  limit (`max_tokens` and `max_completion_tokens`; `max_output_tokens` for /v1/responses)
  so the prefill server does only the prompt;
- decode leg: the client's body as sent (its own stream and token-limit fields, absent
  ones absent) plus the prefill response's `kv_transfer_params`, which tell the decoder
  where to pull the KV from;
- the decode response reports the prefill's `cached_tokens`: the decoder received the
  whole prompt's KV, so its own count would say the entire prompt was a cache hit.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from epp.headers import ENCODER_HOSTS_PORTS, PREFILLER_HOST_PORT

# Paths on which a remote prefill is run (llm-d: chat, completions, responses).
PD_APIS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/responses": "responses",
}

# Per-connection headers a proxy must not forward (RFC 9110 §7.6.1), plus what the
# HTTP client recomputes.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
_NOT_FORWARDED = HOP_BY_HOP | {"host", "content-length", PREFILLER_HOST_PORT, ENCODER_HOSTS_PORTS}

# Paths whose media an encode server may encode first (the APIs that carry media parts).
ENCODE_APIS = {
    "/v1/chat/completions": "chat",
    "/v1/responses": "responses",
    "/v1/messages": "messages",
}


def encode_api(method: str, path: str) -> str | None:
    """The API of a request whose media may go to an encode server first, else None."""
    if method != "POST":
        return None
    return ENCODE_APIS.get(path.rstrip("/") or "/")


def pd_api(method: str, path: str) -> str | None:
    """The API a P/D request uses, or None when this request is only proxied."""
    if method != "POST":
        return None
    return PD_APIS.get(path.rstrip("/") or "/")


def path_label(path: str) -> str:
    """A bounded metric label: the known API paths, else `other`."""
    p = path.rstrip("/")
    return p if p in PD_APIS or p in ("/v1/models", "/health", "/metrics") else "other"


def first_prefiller(value: str | None) -> str | None:
    """The header may carry a comma list (llm-d); the first entry is used."""
    if not value:
        return None
    first = value.split(",", 1)[0].strip()
    return first or None


def upstream_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The client's headers minus hop-by-hop ones, Host, Content-Length and the P/D header."""
    return [(k, v) for k, v in headers if k.lower() not in _NOT_FORWARDED]


def downstream_headers(
    headers: Iterable[tuple[str, str]], *, keep_length: bool
) -> list[tuple[str, str]]:
    drop = HOP_BY_HOP if keep_length else HOP_BY_HOP | {"content-length"}
    return [(k, v) for k, v in headers if k.lower() not in drop]


def prefill_body(body: Mapping[str, Any], api: str) -> dict[str, Any]:
    out = dict(body)
    out["kv_transfer_params"] = {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
    return one_token(out, api)


def encode_body(body: Mapping[str, Any], api: str) -> dict[str, Any]:
    """The encode leg: the client's body asking for one token, not streamed (vLLM's
    disaggregated-encoder proxy sends the encoder the request with `max_tokens: 1`)."""
    return one_token(dict(body), api)


def one_token(out: dict[str, Any], api: str) -> dict[str, Any]:
    out["stream"] = False
    out.pop("stream_options", None)
    if api == "responses":
        out["max_output_tokens"] = 1
    elif api == "messages":
        out["max_tokens"] = 1
    else:
        out["max_tokens"] = 1
        out["max_completion_tokens"] = 1
    return out


def decode_body(body: Mapping[str, Any], kv_transfer_params: Mapping[str, Any]) -> dict[str, Any]:
    """The client's original body (stream and token-limit fields as sent) + the KV handle."""
    out = dict(body)
    out["kv_transfer_params"] = dict(kv_transfer_params)
    return out


def _usage_dicts(obj: Any) -> list[dict[str, Any]]:
    """`usage` objects in a response or SSE chunk (the Responses API nests it in `response`)."""
    out = []
    for holder in (obj, obj.get("response") if isinstance(obj, dict) else None):
        if isinstance(holder, dict) and isinstance(holder.get("usage"), dict):
            out.append(holder["usage"])
    return out


def _details_key(usage: Mapping[str, Any]) -> str:
    return "input_tokens_details" if "input_tokens" in usage else "prompt_tokens_details"


def cached_tokens(obj: Any) -> int | None:
    """`usage.prompt_tokens_details.cached_tokens` (or the Responses API's input_* form)."""
    for usage in _usage_dicts(obj):
        details = usage.get(_details_key(usage))
        if isinstance(details, dict):
            value = details.get("cached_tokens")
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return None


def set_cached_tokens(obj: Any, value: int) -> bool:
    """Write `value` as every usage's cached_tokens; False if `obj` carries no usage."""
    usages = _usage_dicts(obj)
    for usage in usages:
        key = _details_key(usage)
        details = usage.get(key)
        if not isinstance(details, dict):
            details = usage[key] = {}
        details["cached_tokens"] = value
    return bool(usages)


def rewrite_json_usage(raw: bytes, value: int) -> bytes:
    """A whole JSON response with cached_tokens rewritten; unchanged if not JSON."""
    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return raw
    if not set_cached_tokens(obj, value):
        return raw
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


class SseUsageRewriter:
    """Rewrites cached_tokens in the usage chunks of a server-sent-event stream.

    Bytes pass through as they arrive, except an incomplete last line, which waits for
    its newline (an event is never split across a rewrite). Only `data:` lines that
    mention "usage" are parsed, so token chunks cost one substring search.
    """

    def __init__(self, value: int) -> None:
        self.value = value
        self._pending = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self._pending + chunk
        cut = data.rfind(b"\n") + 1
        self._pending = data[cut:]
        complete = data[:cut]
        if b'"usage"' not in complete:
            return complete
        return b"".join(self._line(line) for line in complete.splitlines(keepends=True))

    def flush(self) -> bytes:
        rest, self._pending = self._pending, b""
        return self._line(rest) if rest else b""

    def _line(self, line: bytes) -> bytes:
        if not line.startswith(b"data:") or b'"usage"' not in line:
            return line
        content = line.rstrip(b"\r\n")
        ending = line[len(content) :]
        try:
            obj = json.loads(content[5:].strip())
        except (ValueError, UnicodeDecodeError):
            return line
        if not set_cached_tokens(obj, self.value):
            return line
        return (
            b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + ending
        )
