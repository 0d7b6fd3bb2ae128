"""Tokens for the simulator, from the tokenizer the EPP uses (`epp.tokenizer`).

Prefix-cache routing only lines up with the server's KV blocks if the EPP and the
server cut a prompt into the same token ids, so the simulator does not have its own
tokenizer: it loads `epp.tokenizer.load_tokenizer(spec)`, the simple deterministic one
by default or a Hugging Face `tokenizer.json` (`--tokenizer PATH`). One instance per
spec is shared by all replicas in a process.

Generated text is built from `filler_token`, each of which the simple tokenizer counts
as exactly one token: re-tokenizing a response yields the `completion_tokens` it
reports. The generated token *ids* (what KV blocks of generated text hash) are each
filler word's first id under the server's tokenizer.
"""

from __future__ import annotations

import functools

from epp.tokenizer import SimpleTokenizer, Tokenizer, load_tokenizer

_SIMPLE = SimpleTokenizer()

# Short common words, so streamed output reads as text in a terminal during demos.
_FILLER_WORDS = (
    "the", "model", "is", "a", "simulated", "server", "and", "this", "text", "has",
    "no", "meaning", "but", "it", "counts", "tokens",
)  # fmt: skip


@functools.lru_cache(maxsize=8)
def shared_tokenizer(spec: str | None) -> Tokenizer:
    """The tokenizer for `spec` (None/"simple" or a tokenizer.json path), loaded once."""
    return load_tokenizer(spec)


def tokenize(text: str) -> list[str]:
    return _SIMPLE.tokenize(text)


def count_tokens(text: str) -> int:
    return _SIMPLE.count(text)


def filler_token(index: int) -> str:
    """The text of generated token number `index` (0-based); a space then one word."""
    return " " + _FILLER_WORDS[index % len(_FILLER_WORDS)]


def filler_text(n: int) -> str:
    return "".join(filler_token(i) for i in range(n))


def filler_ids(tokenizer: Tokenizer) -> list[int]:
    """Token id of each filler word under `tokenizer` (the cycle generated text follows)."""
    return [(tokenizer.encode(filler_token(i)) or [0])[0] for i in range(len(_FILLER_WORDS))]
