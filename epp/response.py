"""Reading a model server's response as it streams past: first token, token times, usage.

`ResponseMeter.feed(chunk, now)` is called once per response body chunk on the request
loop, so it must be cheap: it never parses the JSON of an ordinary token event. For an
SSE stream (`text/event-stream`) it keeps complete lines (a partial last line waits for the
next chunk) and counts, in one regex scan, the choices that carry text (`"content"`,
`"text"`, reasoning or tool-call `"arguments"` with a non-empty string value); only the
last event that names `"usage"` is kept raw and parsed once, when the response ends
(vLLM sends it as the last event when the client asked for
`stream_options.include_usage`; with continuous usage stats every event has one and the
last wins). An `"error"` event (a server that fails
mid-stream, as vLLM and `epp sim` do) is parsed to mark the response failed. A plain JSON
body up to `max_json_bytes` (64 KiB: any completion of ordinary length) is kept and parsed
at the end; a larger one (embeddings, long completions) keeps only its last 4 KiB, where
OpenAI servers put `usage`, and that object alone is parsed, so memory and the parse stay
bounded whatever the size. Its "first token" is the end of the body, since nothing
reaches the client earlier.

Times are whatever clock the caller passes; the meter never reads one (tests drive it).
bench/response_chunk.py measures `feed` per chunk (about 2 us, against 4-7 us for one
`json.loads` of the same event; docs/BENCHMARKS.md).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

# A choice that carries output: chat `delta.content`, completions `text`, reasoning text,
# or tool-call arguments, with a non-empty JSON string value. An escaped quote inside a
# string (`\\"text\\":`) cannot match, since a backslash sits before the closing quote.
# Anthropic's Messages stream carries output in `content_block_delta` events as
# `text`, `thinking` or `partial_json` (tool input) deltas.
_TOKEN = re.compile(
    rb'"(?:content|text|reasoning_content|reasoning|arguments|thinking|partial_json)"\s*:\s*"(?!")'
)
DEFAULT_MAX_JSON_BYTES = 64 * 1024
_TAIL_BYTES = 4096
# `"usage": {...}` with at most one nested object (prompt_tokens_details).
_USAGE = re.compile(rb'"usage"\s*:\s*(\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\})')


@dataclass(frozen=True, slots=True)
class Usage:
    """OpenAI `usage`: prompt, completion and cached prompt tokens (0 when not reported).

    Anthropic's (`input_tokens`, `output_tokens`, `cache_read_input_tokens`,
    `cache_creation_input_tokens`) is read too: its `input_tokens` leaves out the cache
    reads and writes (vLLM 0.32 `_build_anthropic_usage`), so the prompt is their sum."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0

    @classmethod
    def from_json(cls, obj: object) -> Usage | None:
        if not isinstance(obj, dict):
            return None
        if "input_tokens" in obj:
            return cls._from_anthropic(obj)
        details = obj.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        prompt, completion = obj.get("prompt_tokens"), obj.get("completion_tokens")
        if not isinstance(prompt, int) or not isinstance(completion, int):
            return None
        return cls(prompt, completion, cached if isinstance(cached, int) else 0)

    @classmethod
    def _from_anthropic(cls, obj: dict) -> Usage | None:
        uncached, completion = obj.get("input_tokens"), obj.get("output_tokens")
        if not isinstance(uncached, int) or not isinstance(completion, int):
            return None
        read = obj.get("cache_read_input_tokens")
        read = read if isinstance(read, int) else 0
        created = obj.get("cache_creation_input_tokens")
        created = created if isinstance(created, int) else 0
        return cls(uncached + read + created, completion, read)


class ResponseMeter:
    """One response body, fed chunk by chunk; read the results after `finish`."""

    __slots__ = (
        "_body",
        "_body_size",
        "_tail",
        "_usage_line",
        "error_status",
        "first_token_at",
        "last_token_at",
        "max_json_bytes",
        "streamed",
        "token_events",
        "usage",
    )

    def __init__(self, streamed: bool, max_json_bytes: int = DEFAULT_MAX_JSON_BYTES) -> None:
        self.streamed = streamed
        self.max_json_bytes = max_json_bytes
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.token_events = 0  # SSE events that carried output
        self.usage: Usage | None = None
        self.error_status = 0  # set when an error event or an error JSON body was seen
        self._tail = b""
        self._usage_line: bytes | None = None
        self._body: list[bytes] = []
        self._body_size = 0

    def feed(self, chunk: bytes, now: float) -> bool:
        """Take one body chunk; True when it carried the response's first token."""
        if not self.streamed:
            self._body_size += len(chunk)
            self._body.append(chunk)
            if self._body_size > self.max_json_bytes:  # keep the tail only, bounded
                self._body = [b"".join(self._body)[-_TAIL_BYTES:]]
            return False
        data = self._tail + chunk if self._tail else chunk
        cut = data.rfind(b"\n") + 1  # complete lines only; the rest waits for the next chunk
        if cut < len(data):
            self._tail, data = data[cut:], data[:cut]
        else:
            self._tail = b""
        if not data:
            return False
        # One scan of the chunk: each match is one choice that carries output.
        tokens = len(_TOKEN.findall(data))
        usage_at = data.rfind(b'"usage"')
        if usage_at >= 0:
            self._usage_line = _line_at(data, usage_at)
        elif not tokens and b'"error"' in data:
            for line in data.split(b"\n"):
                if line.startswith(b"data:") and b'"error"' in line:
                    self._read_error(line)
        if not tokens:
            return False
        self.token_events += tokens
        self.last_token_at = now
        if self.first_token_at is None:
            self.first_token_at = now
            return True
        return False

    def finish(self, now: float) -> bool:
        """The body ended; parses what was kept. True when this was the first token
        (a non-streamed body with content)."""
        if self._tail:
            self.feed(b"\n", now)
        if self.streamed:
            line = self._usage_line
            if line is not None and line.startswith(b"data:"):
                obj = _json(line[5:])
                self.usage = Usage.from_json(obj.get("usage")) if isinstance(obj, dict) else None
            return False
        size, body = self._body_size, b"".join(self._body)
        self._body = []
        if not size:
            return False
        if size > self.max_json_bytes:
            found = _USAGE.search(body)
            self.usage = Usage.from_json(_json(found.group(1))) if found else None
        else:
            obj = _json(body)
            if isinstance(obj, dict):
                self.usage = Usage.from_json(obj.get("usage"))
                if "error" in obj and "choices" not in obj and "content" not in obj:
                    self.error_status = _error_status(obj["error"])
                elif obj.get("object") == "error":  # vLLM's older error shape
                    self.error_status = _error_status(obj)
        self.token_events = 1
        self.first_token_at = self.last_token_at = now
        return True

    @property
    def output_tokens(self) -> int:
        """Completion tokens from usage, else the count of token-carrying events."""
        return self.usage.completion_tokens if self.usage else self.token_events

    def itl_s(self) -> float:
        """Mean gap between output tokens after the first (TPOT); NaN below two tokens.

        With usage the span first→last token event is divided by completion tokens − 1
        (a server may batch several tokens per event); without, by events − 1. A JSON
        body arrives at once: no gap was observed.
        """
        n = self.output_tokens
        first, last = self.first_token_at, self.last_token_at
        if not self.streamed or first is None or last is None or n < 2:
            return math.nan
        return (last - first) / (n - 1)

    def _read_error(self, line: bytes) -> None:
        obj = _json(line[5:])
        if isinstance(obj, dict) and "error" in obj and not obj.get("choices"):
            self.error_status = _error_status(obj["error"])


def _line_at(data: bytes, pos: int) -> bytes:
    start = data.rfind(b"\n", 0, pos) + 1
    end = data.find(b"\n", pos)
    return data[start : end if end >= 0 else len(data)]


def _json(raw: bytes) -> object:
    try:
        return json.loads(raw)
    except ValueError:
        return None


# Anthropic's error types (its API reference), for an error that names no code.
_ANTHROPIC_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "overloaded_error": 529,
}


def _error_status(error: object) -> int:
    """The HTTP status an error object names (OpenAI/vLLM put it in `code`; Anthropic's
    shape names only a `type`), else 500."""
    if not isinstance(error, dict):
        return 500
    code = error.get("code")
    if isinstance(code, int) and 400 <= code <= 599:
        return code
    kind = error.get("type")
    return _ANTHROPIC_STATUS.get(kind, 500) if isinstance(kind, str) else 500
