"""Tokenizers shared by the EPP and the simulator (one module both import).

The EPP and the model server must cut a prompt into the same tokens for prefix-cache
routing to line up with the server's KV blocks. Two kinds:

- `SimpleTokenizer` (default): a token is a run of word characters or one other
  non-space character; ids are a stable hash of the piece. Fast, deterministic, no files.
- `HFTokenizer`: a Hugging Face `tokenizer.json` through the `tokenizers` package (an
  optional dependency, `pip install epp[hf]`), to mirror a real model exactly. Given a
  model *directory* it also loads the model's chat template and special tokens
  (`epp.chat_template`), so chat requests are rendered as the server renders them.

`encode(text, add_special_tokens=...)`: vLLM tokenizes a completion prompt WITH special
tokens (the tokenizer's post-processor adds BOS if it is configured to; vLLM
`CompletionRequest.add_special_tokens` defaults to true) and a rendered chat WITHOUT them
(the template writes its own). The simple tokenizer has no special tokens.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Protocol

import xxhash

from epp.chat_template import ChatTemplate

_TOKEN_RE = re.compile(r"\w+|[^\w\s]")


class Tokenizer(Protocol):
    name: str

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]: ...

    def count(self, text: str) -> int: ...


class SimpleTokenizer:
    name = "simple"
    # Ids of recently seen pieces: text repeats pieces heavily, and a dict lookup is
    # several times cheaper than hashing. Cleared when full, so memory stays bounded.
    _CACHE_LIMIT = 200_000

    def __init__(self, vocab_size: int = 1 << 31) -> None:
        self.vocab_size = vocab_size
        self._ids: dict[str, int] = {}

    def tokenize(self, text: str) -> list[str]:
        return _TOKEN_RE.findall(text)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = self._ids
        pieces = _TOKEN_RE.findall(text)
        try:
            return [ids[p] for p in pieces]
        except KeyError:
            pass
        if len(ids) > self._CACHE_LIMIT:
            ids.clear()
        v = self.vocab_size
        out = []
        for p in pieces:
            i = ids.get(p)
            if i is None:
                i = ids[p] = xxhash.xxh32_intdigest(p.encode()) % v
            out.append(i)
        return out

    def count(self, text: str) -> int:
        return sum(1 for _ in _TOKEN_RE.finditer(text))


class HFTokenizer:
    """A Hugging Face fast tokenizer from `tokenizer.json`, or from a model directory
    (tokenizer.json, plus the chat template and special tokens of tokenizer_config.json
    or chat_template.jinja, in `chat_template`)."""

    chat_template: ChatTemplate | None = None

    def __init__(self, path: str | Path) -> None:
        try:
            from tokenizers import Tokenizer as _HF
        except ImportError as e:  # pragma: no cover - depends on the optional extra
            raise RuntimeError(
                "a tokenizer.json needs the 'tokenizers' package: pip install 'epp[hf]'"
            ) from e
        p = Path(path)
        if p.is_dir():
            self.chat_template = ChatTemplate.from_model_dir(p)
            p = p / "tokenizer.json"
        if not p.is_file():
            raise FileNotFoundError(f"tokenizer file not found: {p}")
        self._tok = _HF.from_file(str(p))
        self.name = f"hf:{path}"

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def count(self, text: str) -> int:
        return len(self.encode(text))


def load_tokenizer(spec: str | None) -> Tokenizer:
    """`None`/`"simple"` → SimpleTokenizer; anything else is a tokenizer.json path or a
    model directory (its `name` keys the per-request token cache, `epp.prompt_tokens`)."""
    if spec in (None, "", "simple"):
        return SimpleTokenizer()
    return HFTokenizer(spec)
