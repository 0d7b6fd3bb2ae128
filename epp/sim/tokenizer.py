"""The simulator's stand-in tokenizer: cheap, deterministic, dependency-free.

A token is a run of word characters (`\\w+`) or one other non-space character, so
"Hello, world!" is 4 tokens. That is close enough to a BPE count on English text for
load and KV-cache accounting, costs one regex pass, and needs no vocabulary file. It
lives alone in this module so a real (pluggable) tokenizer can replace it later
without touching the engine or the HTTP layer.

Generated text is built from `filler_token`, each of which this tokenizer counts as
exactly one token: re-tokenizing a response yields the `completion_tokens` it reports.
"""

from __future__ import annotations

import re

_TOKEN_RE = re.compile(r"\w+|[^\w\s]")

# Short common words, so streamed output reads as text in a terminal during demos.
_FILLER_WORDS = (
    "the", "model", "is", "a", "simulated", "server", "and", "this", "text", "has",
    "no", "meaning", "but", "it", "counts", "tokens",
)  # fmt: skip


def tokenize(text: str) -> list[str]:
    return _TOKEN_RE.findall(text)


def count_tokens(text: str) -> int:
    return sum(1 for _ in _TOKEN_RE.finditer(text))


def filler_token(index: int) -> str:
    """The text of generated token number `index` (0-based); a space then one word."""
    return " " + _FILLER_WORDS[index % len(_FILLER_WORDS)]


def filler_text(n: int) -> str:
    return "".join(filler_token(i) for i in range(n))
