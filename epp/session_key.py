"""A request's session, from whatever the client sends to name it.

Clients name their conversation in different places; the first source in an ordered
list that the request carries wins (`epp serve --session-key-sources`). The default
order:

1. the agent clients' own session headers, in llm-d-router's order (its
   `agent-identity` plugin, `pkg/epp/framework/plugins/requestcontrol/requestheader/
   agentidentity/agent_identity.go`): `x-claude-code-session-id` (Claude Code),
   `x-session-affinity` (OpenCode), `session-id` (Codex >= 0.131) and `session_id`
   (Codex 0.130);
2. `prompt_cache_key` in the body (OpenAI's field for requests that share a prefix);
3. `metadata.user_id` in the body (Anthropic's Messages API);
4. `user` in the body (OpenAI's end-user id);
5. the `x-session-token` header (llm-d's session-affinity scorer's default header).

The key feeds the session-affinity scorer and is flow control's fairness id when the
request names none (`x-gateway-inference-fairness-id`), as llm-d derives the fairness id
from the agent identity. A key longer than 128 characters, or with characters outside
printable ASCII, is replaced by a digest of it, so what a client sends bounds neither
memory nor a metric label's length.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

DEFAULT_SOURCES: tuple[str, ...] = (
    "header:x-claude-code-session-id",
    "header:x-session-affinity",
    "header:session-id",
    "header:session_id",
    "body:prompt_cache_key",
    "body:metadata.user_id",
    "body:user",
    "header:x-session-token",
)
MAX_KEY_CHARS = 128
_PRINTABLE = re.compile(rf"[!-~]{{1,{MAX_KEY_CHARS}}}")


def parse_sources(spec: str) -> tuple[str, ...]:
    """`header:NAME` and `body:FIELD[.FIELD]` entries, comma-separated; "" = none.
    Raises ValueError naming a bad entry."""
    out = []
    for raw in spec.split(","):
        entry = raw.strip()
        if not entry:
            continue
        kind, _, name = entry.partition(":")
        if kind not in ("header", "body") or not name.strip():
            raise ValueError(
                f"session key source {entry!r}: expected header:NAME or body:FIELD[.FIELD]"
            )
        out.append(f"{kind}:{name.strip().lower() if kind == 'header' else name.strip()}")
    return tuple(out)


def session_key(
    headers: Mapping[str, str], body: Mapping[str, Any] | None, sources: Sequence[str]
) -> str | None:
    """The first source's non-empty value, normalised (see the module doc); None if the
    request carries none of them. On every request's path: the sources are parsed once."""
    for header, path in _compiled(tuple(sources)):
        if header is not None:
            value: Any = headers.get(header)
        elif body is None:
            continue
        else:
            value = body.get(path[0])
            for part in path[1:]:
                value = value.get(part) if isinstance(value, Mapping) else None
        if value and isinstance(value, str) and (value := value.strip()):
            return normalise(value)
    return None


@functools.lru_cache(maxsize=16)
def _compiled(sources: tuple[str, ...]) -> tuple[tuple[str | None, tuple[str, ...]], ...]:
    """(header name, None) or (None, body field path) per source."""
    return tuple(
        (s[7:], ()) if s.startswith("header:") else (None, tuple(s[5:].split("."))) for s in sources
    )


def normalise(value: str) -> str:
    if _PRINTABLE.fullmatch(value):
        return value
    raw = value.encode("utf-8", "replace")
    return "blake2b:" + hashlib.blake2b(raw, digest_size=16).hexdigest()
