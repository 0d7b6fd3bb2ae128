"""Token ids the client sent as the prompt, which need no tokenizer.

`/v1/completions` accepts a prompt of token ids. The parser keeps no text for it (only
spaces standing in for its length, so load estimates work), and hashing those spaces
would make every token-id prompt of a similar length "share a prefix". The ids are the
exact tokens the server caches, so the prefix producers hash them directly.
"""

from __future__ import annotations

from epp.request import API_COMPLETIONS, InferenceRequest


def _ids(value: object) -> list[int] | None:
    if isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value
    ):
        return value
    return None


def prompt_token_ids(request: InferenceRequest) -> list[int] | None:
    """The prompt's token ids, or None when the prompt is text.

    A batch of several token-id prompts gives []: there is no one prefix to route on.
    """
    if request.api != API_COMPLETIONS or not request.body:
        return None
    prompt = request.body.get("prompt")
    if not isinstance(prompt, list) or not prompt:
        return None
    ids = _ids(prompt)
    if ids is not None:
        return ids
    if all(isinstance(p, list) for p in prompt):
        single = _ids(prompt[0]) if len(prompt) == 1 else None
        return single if single is not None else []
    return None
