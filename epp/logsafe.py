"""Client-chosen text on its way into a log line: clipped and escaped.

A request id, a model name or a header value comes from the client; printed raw, a
newline forges a log line, a tab breaks parsers, a megabyte floods the log (docs/RELIABILITY.md
§1h). Every log call that prints client text passes it through `clip`.
"""

from __future__ import annotations

MAX_FIELD_CHARS = 300


def clip(text: str, limit: int = MAX_FIELD_CHARS) -> str:
    """At most `limit` characters, with control characters escaped (a tab prints as \\t)."""
    clipped = text[:limit] + ("…" if len(text) > limit else "")
    return (
        clipped.encode("unicode_escape").decode("ascii") if not clipped.isprintable() else clipped
    )
