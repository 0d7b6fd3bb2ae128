"""Media items of a request (images, audio, video) and their place in the prefix identity.

vLLM keys the KV blocks that hold a media item's placeholder tokens with that item's
hash (`vllm/v1/core/kv_cache_utils.py`: a block's extra keys name every media item whose
placeholder range overlaps it), so two prompts with the same text and different images
share blocks only up to the first differing image. The EPP cannot run the model's
processor, so it keys an item by what identifies it on the wire:

- inline data (a `data:` URL, `input_audio.data`, an Anthropic base64 `source`): an
  xxh3-128 digest of the encoded payload, so identical bytes share and different bytes
  diverge (the same picture re-encoded differently is a miss the server would not have);
- a remote URL: a digest of the URL itself. vLLM fetches the URL and hashes the content,
  so two URLs of one picture are one item to the server and two here (a miss), and a
  URL whose content changes between requests is one item here and two to the server
  (a predicted hit the server does not have).

Each item enters the plain rendering of the prompt (`epp.request.render_chat`) at its
place as a marker ` DIGEST<|media|>`, so both prefix chains built from that text (or
its token ids) diverge at the first differing item and share across identical items.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import xxhash

from epp.errors import bad_request

# The digest comes first (after a space, so no tokenizer merges it with the text before
# it): two items' markers differ from their first token, where the server's blocks differ.
MARKER_OPEN = " "
MARKER_CLOSE = "<|media|>"
# The simulator's placeholder for an item: a marker of the same shape (same token count
# under the simple tokenizer) whose text is the same for every item, as vLLM's
# placeholder tokens are; the item's identity goes into the block hash instead.
PLACEHOLDER = MARKER_OPEN + "0" * 32 + MARKER_CLOSE

# Chat content-part types that carry media (OpenAI chat, vLLM's extensions, Responses).
_URL_PARTS = {
    "image_url": "image",
    "input_image": "image",
    "video_url": "video",
    "audio_url": "audio",
}


@dataclass(frozen=True, slots=True)
class MediaItem:
    """One media item: its kind, the digest that keys it, and whether the digest is of
    inline bytes (True) or of a remote URL (False)."""

    kind: str
    digest: str
    inline: bool

    @property
    def marker(self) -> str:
        return MARKER_OPEN + self.digest + MARKER_CLOSE


def digest(data: str) -> str:
    return xxhash.xxh3_128_hexdigest(data.encode("utf-8", "surrogatepass"))


def from_url(kind: str, url: str) -> MediaItem:
    """A `data:` URL is keyed by its payload; any other URL by itself."""
    if url.startswith("data:"):
        return MediaItem(kind, digest(url.partition(",")[2]), True)
    return MediaItem(kind, digest(url), False)


def chat_part_media(part: Mapping[str, Any], where: str) -> MediaItem | None:
    """The media item of an OpenAI chat content part, None for a text part or a type the
    EPP does not know (passed through untouched). A media part without its payload is
    a 400 naming the field: the server would refuse it too."""
    kind = part.get("type")
    if not isinstance(kind, str):
        return None
    if kind in _URL_PARTS:
        value = part.get(kind)
        url = value.get("url") if isinstance(value, Mapping) else value
        if not isinstance(url, str) or not url:
            raise bad_request(f"{where}.{kind}.url must be a non-empty string")
        return from_url(_URL_PARTS[kind], url)
    if kind == "input_audio":
        audio = part.get("input_audio")
        data = audio.get("data") if isinstance(audio, Mapping) else None
        if not isinstance(data, str) or not data:
            raise bad_request(f"{where}.input_audio.data must be a non-empty base64 string")
        return MediaItem("audio", digest(data), True)
    return None
