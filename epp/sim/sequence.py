"""One sequence the engine generates, and how the HTTP handler hears about its progress.

A `SimRequest` carries its token ids (prompt, then generated tokens appended), the KV
blocks it holds, and timestamps in model time. Handlers do not receive a message per
token: they read the request's counters when its `Channel` wakes them, which costs one
future per wait instead of a queue item per token (this matters with 16 servers in one
process). Streaming channels wake on every token; the others only when a request ends.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from epp.sim.kvcache import Block


class State(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


class Channel:
    """Wakes the handler that owns one or more requests (a batched prompt list shares one).

    `stream=False` asks to be woken only when a request finishes or is aborted. A
    notification while nobody waits is remembered, so the next `wait` returns at once:
    a wake-up is never lost, at worst one is spurious (callers re-check their state).
    """

    __slots__ = ("_error", "_pending", "_waiter", "stream")

    def __init__(self, stream: bool = True) -> None:
        self.stream = stream
        self._waiter: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        self._pending = False

    def notify(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        else:
            self._pending = True

    def fail(self, exc: BaseException) -> None:
        """Make the pending (or next) wait raise `exc`: the client went away."""
        self._error = exc
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    async def wait(self) -> None:
        if self._error is not None:
            raise self._error
        if self._pending:
            self._pending = False
            return
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            self._waiter = None


_ids = itertools.count()


@dataclass(eq=False)
class SimRequest:
    """One sequence to generate (one choice of an OpenAI request)."""

    prompt: Sequence[int]
    max_tokens: int
    channel: Channel = field(default_factory=Channel)
    model: str = ""
    lora: str | None = None
    index: int = 0
    finish_reason: str = "length"
    cache_salt: str | None = None
    remote_prefill: bool = False  # decode side of P/D: prompt KV comes from elsewhere
    remote_decode: bool = False  # prefill side of P/D: stop after prefill, keep KV to send
    # Media items: (identifier, placeholder offset, length), vLLM's `mm_features`.
    mm: tuple[tuple[str, int, int], ...] = ()
    id: int = field(default_factory=lambda: next(_ids))
    state: State = State.WAITING
    arrival: float = 0.0
    not_before: float = 0.0
    admitted_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_at: float | None = None
    generated: int = 0
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prefix-cache hit at first scheduling (usage.cached_tokens)
    num_transferred_tokens: int = 0  # prompt tokens whose KV arrived from a prefill server
    preemptions: int = 0
    abort_reason: str = ""
    remote_block_ids: list[int] = field(default_factory=list)  # prefill side, at finish
    transfer_ready_at: float = 0.0  # decode side: when the remote KV has arrived
    tokens: list[int] = field(init=False)
    blocks: list[Block] = field(init=False, default_factory=list)
    block_hashes: list[bytes] = field(init=False, default_factory=list)
    num_cached_blocks: int = field(init=False, default=0)
    extra: dict[str, Any] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.tokens = list(self.prompt)
        self.num_prompt_tokens = len(self.tokens)
        if self.num_prompt_tokens < 1:
            raise ValueError("a request needs at least one prompt token")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")

    @property
    def prompt_tokens(self) -> int:
        return self.num_prompt_tokens

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def done(self) -> bool:
        return self.state in (State.FINISHED, State.ABORTED)

    @property
    def kv_held_tokens(self) -> int:
        return self.num_computed_tokens
