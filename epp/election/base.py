"""The interface a planner asks before it acts, and the trivial elector of a lone EPP.

Pure: no I/O here. An elector's `is_leader()` is called from the planner thread and the
request loop, so it must be cheap and safe from any thread (a bool read).
"""

from __future__ import annotations

from typing import Protocol


class Elector(Protocol):
    """One candidate in an election. `start()` joins it (and returns at once: leadership
    may come later), `stop()` leaves it and hands leadership over if held."""

    identity: str

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def is_leader(self) -> bool:
        """True only while this candidate may act. An elector that cannot confirm its
        leadership in time (a lease not renewed) answers False before anyone else can
        win, so two candidates never both answer True."""

    def describe(self) -> str:
        """One line for the log: kind, lock and identity."""


class AlwaysLeader:
    """A single EPP (no election): it always leads."""

    identity = "single"

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def is_leader(self) -> bool:
        return True

    def describe(self) -> str:
        return "no leader election (a single EPP)"
