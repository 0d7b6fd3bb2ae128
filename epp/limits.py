"""Limits on what one client request may cost the EPP, and the server-wide body budget.

Each limit answers a hostile-input probe (docs/RELIABILITY.md) with a clear 4xx instead of a
crash, a stall or unbounded memory. Every one is an `epp serve` flag; the defaults are
here, once.

- `max_json_depth` (128): the C JSON parser recurses once per nesting level and raises
  RecursionError near Python's limit (1,000); real OpenAI bodies nest < 20 deep (a tool's
  JSON schema is the deepest part), so 128 refuses only abuse.
- `max_messages` (10,000): chat messages per request; the probe sent 10k-message bodies,
  the prompt rendering is linear in them.
- `max_prompt_tokens` (1,048,576): the prompt estimate (characters / 4, or the count of
  token ids) above the largest context window any served model has (1M).
- `max_request_headers` (100) and `max_request_headers_kb` (60): Envoy's HCM defaults
  (`max_request_headers_count`, `max_request_headers_kb`). Envoy checks the request
  after the EPP's mutation against them and answers an empty 500 when it crosses them,
  so the EPP refuses (431, with a JSON body) a request whose own headers plus those the
  EPP will add plus those Envoy adds after it (`ENVOY_ADDS`) would cross them.
- `max_buffered_bytes` (256 MiB): request-body bytes held across all open streams
  (each stream may hold up to `--max-body-bytes`); 60 slow 32 MiB bodies once cost
  1.8 GiB. A chunk that would cross it gets 503 (retry later), not the process's memory.
  How it is shared between clients (per connection, per source address, a reserve for
  small requests, a minimum body data rate): epp/body_budget.py.
- `body_timeout` (30 s): a body with no `end_of_stream` within this after its headers
  is answered 408 and its bytes are freed.
"""

from __future__ import annotations

from dataclasses import dataclass

from epp.body_budget import BodyBudget as BodyBudget  # the budget lives there
from epp.errors import EppError
from epp.session_key import DEFAULT_SOURCES

# What the EPP may set on a routed request: the destination endpoint, a generated
# x-request-id, content-length, x-prefiller-host-port (each ~100 bytes at most).
HEADERS_ADDED = 4
HEADER_BYTES_ADDED = 512
# Headers Envoy 1.40 adds after ext_proc that count against max_request_headers_count
# (the router's x-envoy-expected-rq-timeout-ms and the like). Measured through the
# shipped deploy/envoy/envoy.yaml (docs/RELIABILITY.md, §1f): with the EPP adding one
# header, 96 regular headers in the EPP's view passed and 97 got Envoy's empty 500,
# i.e. 96 + 1 + 3 = 100 is the last count that fits.
ENVOY_ADDS = 3


@dataclass(frozen=True, slots=True)
class BodyLimits:
    """What `parse_body` refuses, each with a 400 naming the flag that sets it, and
    where it reads the session key (`epp.session_key`, --session-key-sources)."""

    max_json_depth: int = 128
    max_messages: int = 10_000
    max_prompt_tokens: int = 1_048_576
    session_sources: tuple[str, ...] = DEFAULT_SOURCES

    def __post_init__(self) -> None:
        for name in ("max_json_depth", "max_messages", "max_prompt_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


@dataclass(frozen=True, slots=True)
class HeaderLimits:
    """The gateway's header limits the EPP must not push a request over."""

    max_count: int = 100
    max_kb: int = 60

    def __post_init__(self) -> None:
        if self.max_count <= HEADERS_ADDED + ENVOY_ADDS:
            raise ValueError(
                f"max_count must be > {HEADERS_ADDED + ENVOY_ADDS}, got {self.max_count}"
            )
        if self.max_kb < 1:
            raise ValueError(f"max_kb must be >= 1, got {self.max_kb}")

    def check(self, count: int, size: int, added: int = HEADERS_ADDED) -> None:
        """Raise EppError(431) if `count` regular headers (pseudo-headers such as :path
        are not counted) of `size` bytes (names + values), plus `added` by the EPP and
        ENVOY_ADDS by Envoy, cross a limit."""
        if count + added + ENVOY_ADDS > self.max_count:
            raise EppError(
                431,
                f"request has {count} headers; the gateway allows {self.max_count} including "
                f"the {added} the endpoint picker adds and {ENVOY_ADDS} Envoy adds: "
                "send fewer headers",
                "request_header_fields_too_large",
            )
        if size + HEADER_BYTES_ADDED > self.max_kb * 1024:
            raise EppError(
                431,
                f"request headers total {size} bytes; the gateway allows {self.max_kb} KiB "
                "including the endpoint picker's own: send smaller headers",
                "request_header_fields_too_large",
            )


def prompt_too_long(tokens: int, limit: int) -> EppError:
    """400 with OpenAI's code for a prompt longer than the context (what vLLM answers)."""
    return EppError(
        400,
        f"prompt of about {tokens} tokens exceeds the limit of {limit} "
        "(set by epp serve --max-prompt-tokens)",
        "context_length_exceeded",
    )
