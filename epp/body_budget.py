"""The server-wide request-body budget, shared fairly between clients.

The EPP must hold a request's whole body before it can route it (the JSON has the model
and the prompt), so unfinished bodies are memory a client makes the EPP keep. One global
bound (`--max-buffered-bytes`) keeps the process alive but lets whoever fills it first
lock everyone else out: 32 connections each holding an unfinished 8 MiB body fill 256 MiB
exactly, and every other request is refused until the body timeout fires. So the budget
is also split, as a production proxy splits its buffers:

- **per connection** (`--max-buffered-bytes-per-connection`, default 1/8 of the budget):
  one downstream connection (Envoy's `connection.id` attribute) may hold at most this
  much across its streams (HTTP/2 multiplexes many requests on one connection).
- **per source address** (`--max-buffered-bytes-per-source`, default 1/4): one client
  address (Envoy's `source.address` attribute, else the last `x-forwarded-for` entry,
  the one the gateway appended) may hold at most this much across its connections.
- **a reserve for small requests** (`--small-body-reserve-bytes`, default 1/8): bodies
  larger than `--small-body-bytes` (1 MiB: a 250K-token prompt) together never take
  more than the budget minus the reserve, so ordinary requests always find room even
  while large bodies from many addresses fill the rest. A body is large as soon as its
  `content-length` or the bytes it has sent say so.

A chunk past a client's own share gets 429 (`client_body_buffer_full`: that client is
over its share, others are not); past the whole budget, 503 (`body_buffer_full`).
The minimum body data rate (slow bodies refused early) is the servicer's timer
(epp/extproc/server.py), configured here with the rest.

Single-threaded by design: only the event loop's streams take and give back.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from epp.config.errors import ConfigError
from epp.errors import EppError
from epp.memtrim import Trimmer

MiB = 1024 * 1024
DEFAULT_SMALL_BODY_BYTES = 1 * MiB
# Kestrel's MinRequestBodyDataRate has a 5 s grace period; its 240 B/s rate only catches
# slowloris trickles. 64 KiB/s (512 kbit/s, a poor mobile uplink) refuses a body that
# arrives slower than any real client sends one, while a body of up to 320 KiB always
# has the whole grace period.
DEFAULT_MIN_BODY_RATE = 64 * 1024
DEFAULT_RATE_GRACE = 5.0


@dataclass(frozen=True, slots=True)
class BodyShares:
    """How the body budget is shared; None = the default fraction of the budget."""

    per_connection: int | None = None
    per_source: int | None = None
    small_reserve: int | None = None
    small_body: int = DEFAULT_SMALL_BODY_BYTES
    min_rate: float = DEFAULT_MIN_BODY_RATE  # bytes/s; 0 switches the rate check off
    rate_grace: float = DEFAULT_RATE_GRACE

    def __post_init__(self) -> None:
        for name in ("per_connection", "per_source", "small_body"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ValueError(f"{name} must be >= 1, got {v}")
        if self.small_reserve is not None and self.small_reserve < 0:
            raise ValueError(f"small_reserve must be >= 0, got {self.small_reserve}")
        if self.min_rate < 0:
            raise ValueError(f"min_rate must be >= 0, got {self.min_rate}")
        if self.rate_grace < 0:
            raise ValueError(f"rate_grace must be >= 0, got {self.rate_grace}")


class BodyTicket:
    """One stream's hold on the budget: who holds it and how much."""

    __slots__ = ("connection", "held", "large", "source")

    def __init__(self, source: str | None, connection: str | None, large: bool) -> None:
        self.source = source
        self.connection = connection
        self.large = large
        self.held = 0


class BodyBudget:
    """Request-body bytes held across every open stream, bounded by `limit` and shared
    by `shares` (see the module doc)."""

    def __init__(self, limit: int, shares: BodyShares | None = None) -> None:
        if limit < 1:
            raise ValueError(f"max_buffered_bytes must be >= 1, got {limit}")
        shares = shares or BodyShares()
        self.limit = limit
        self.per_connection = shares.per_connection or max(1, limit // 8)
        self.per_source = shares.per_source or max(1, limit // 4)
        reserve = limit // 8 if shares.small_reserve is None else shares.small_reserve
        if reserve >= limit:
            raise ValueError(
                f"small_reserve ({reserve}) must be below max_buffered_bytes ({limit})"
            )
        self.reserve = reserve
        self.small_body = shares.small_body
        self.held = 0
        self.held_large = 0
        self.by_source: dict[str, int] = {}
        self.by_connection: dict[str, int] = {}
        self.trimmer = Trimmer()  # large bodies given back: memory back to the OS

    def ticket(
        self, source: str | None = None, connection: str | None = None, declared: int = 0
    ) -> BodyTicket:
        """A stream's hold, before its first chunk; `declared`: its content-length."""
        return BodyTicket(source, connection, declared > self.small_body)

    def take(self, n: int, t: BodyTicket | None = None) -> None:
        """Reserve `n` more bytes for `t`'s stream or raise EppError(429/503); a refused
        chunk takes nothing. Without a ticket, only the total is checked."""
        if t is None:
            self._check_total(n)
            self.held += n
            return
        large = t.large or t.held + n > self.small_body
        moving = t.held if large and not t.large else 0  # a small body just became large
        self._check_total(n)
        if large and self.held_large + moving + n > self.limit - self.reserve:
            raise EppError(
                503,
                f"large request bodies (over {self.small_body} bytes) hold "
                f"{self.held_large} bytes, at their share of the endpoint picker's body "
                f"budget ({self.limit - self.reserve} of {self.limit}; the rest is kept "
                "for small requests: epp serve --small-body-reserve-bytes); retry shortly",
                "body_buffer_full",
            )
        if t.source is not None:
            have = self.by_source.get(t.source, 0)
            if have + n > self.per_source:
                raise _client_over(
                    f"this client address holds {have} bytes of unfinished request bodies",
                    self.per_source,
                    "--max-buffered-bytes-per-source",
                )
        if t.connection is not None:
            have = self.by_connection.get(t.connection, 0)
            if have + n > self.per_connection:
                raise _client_over(
                    f"this connection holds {have} bytes of unfinished request bodies",
                    self.per_connection,
                    "--max-buffered-bytes-per-connection",
                )
        if large:
            t.large = True
            self.held_large += moving + n
        self.held += n
        t.held += n
        if t.source is not None:
            self.by_source[t.source] = self.by_source.get(t.source, 0) + n
        if t.connection is not None:
            self.by_connection[t.connection] = self.by_connection.get(t.connection, 0) + n

    def release(self, t: BodyTicket) -> None:
        """Give back everything `t` holds (its body was parsed, refused or abandoned)."""
        n, t.held = t.held, 0
        if not n:
            return
        self.held = max(0, self.held - n)
        if t.large:
            self.held_large = max(0, self.held_large - n)
            self.trimmer.freed_bytes(n)
        if t.source is not None:
            _drop(self.by_source, t.source, n)
        if t.connection is not None:
            _drop(self.by_connection, t.connection, n)

    def give_back(self, n: int) -> None:
        """Give back `n` bytes taken without a ticket."""
        self.held = max(0, self.held - n)

    def _check_total(self, n: int) -> None:
        if self.held + n > self.limit:
            raise EppError(
                503,
                f"the endpoint picker is holding {self.held} bytes of request bodies, at its "
                f"limit of {self.limit} (epp serve --max-buffered-bytes); retry shortly",
                "body_buffer_full",
            )


def _client_over(what: str, limit: int, flag: str) -> EppError:
    return EppError(
        429,
        f"{what}, at its share of {limit} (epp serve {flag}); finish or close the "
        "requests already sent, then retry",
        "client_body_buffer_full",
    )


def _drop(counts: dict[str, int], key: str, n: int) -> None:
    left = counts.get(key, 0) - n
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)


def add_body_share_flags(p: argparse.ArgumentParser) -> None:
    """`epp serve`'s flags for the body budget's shares (next to --max-buffered-bytes)."""
    p.add_argument(
        "--max-buffered-bytes-per-connection",
        type=int,
        default=None,
        metavar="BYTES",
        help="unfinished request-body bytes one downstream connection (Envoy's connection.id "
        "attribute) may hold; a chunk beyond gets 429 (default 1/8 of --max-buffered-bytes)",
    )
    p.add_argument(
        "--max-buffered-bytes-per-source",
        type=int,
        default=None,
        metavar="BYTES",
        help="unfinished request-body bytes one client address (Envoy's source.address "
        "attribute, else the last x-forwarded-for entry) may hold; a chunk beyond gets 429 "
        "(default 1/4 of --max-buffered-bytes)",
    )
    p.add_argument(
        "--small-body-reserve-bytes",
        type=int,
        default=None,
        metavar="BYTES",
        help="part of --max-buffered-bytes that bodies over --small-body-bytes can never "
        "take, so ordinary requests find room while large ones fill the rest "
        "(default 1/8 of --max-buffered-bytes)",
    )
    p.add_argument(
        "--small-body-bytes",
        type=int,
        default=DEFAULT_SMALL_BODY_BYTES,
        metavar="BYTES",
        help=f"a body whose content-length or bytes so far exceed this is large "
        f"(default {DEFAULT_SMALL_BODY_BYTES})",
    )
    p.add_argument(
        "--min-body-rate",
        type=float,
        default=DEFAULT_MIN_BODY_RATE,
        metavar="BYTES_PER_S",
        help="a request body arriving slower than this on average (after "
        "--min-body-rate-grace) gets 408 before --body-timeout, as Kestrel's "
        f"MinRequestBodyDataRate; 0 = off (default {DEFAULT_MIN_BODY_RATE})",
    )
    p.add_argument(
        "--min-body-rate-grace",
        type=float,
        default=DEFAULT_RATE_GRACE,
        metavar="SECONDS",
        help=f"seconds a body may take before --min-body-rate applies ({DEFAULT_RATE_GRACE:g})",
    )


def body_shares_from_args(args: argparse.Namespace) -> BodyShares:
    """The flags above, each checked; raises ConfigError naming the flag."""
    for name in (
        "max_buffered_bytes_per_connection",
        "max_buffered_bytes_per_source",
        "small_body_bytes",
    ):
        v = getattr(args, name)
        if v is not None and v <= 0:
            raise ConfigError("", f"--{name.replace('_', '-')} must be > 0")
    for name in ("small_body_reserve_bytes", "min_body_rate", "min_body_rate_grace"):
        if (getattr(args, name) or 0) < 0:
            raise ConfigError("", f"--{name.replace('_', '-')} must be >= 0")
    reserve = args.small_body_reserve_bytes
    if reserve is not None and reserve >= args.max_buffered_bytes:
        raise ConfigError(
            "",
            "--small-body-reserve-bytes must be below --max-buffered-bytes (the rest is "
            "what large bodies may use)",
        )
    return BodyShares(
        per_connection=args.max_buffered_bytes_per_connection,
        per_source=args.max_buffered_bytes_per_source,
        small_reserve=reserve,
        small_body=args.small_body_bytes,
        min_rate=args.min_body_rate,
        rate_grace=args.min_body_rate_grace,
    )
