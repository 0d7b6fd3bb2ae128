"""Leader election among EPP processes on one machine: an exclusive `flock` on a file.

The kernel holds the lock for the open file and drops it when the holder's process ends
in any way (exit, SIGKILL, crash), so there is no lease to expire and no clock to trust:
a follower polls `flock(LOCK_EX | LOCK_NB)` every `retry_period` and wins within one
period of the leader's death. Two holders at once are impossible on a local filesystem
(flock is not reliable on NFS: keep the file on local disk). The file is never deleted:
a new file at the same path would be a different lock.

The local connector's default lock is its statefile's path + `.lock`, so every EPP that
would adopt the same replicas competes for the same lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
from pathlib import Path

log = logging.getLogger("epp.election")


class LockFileElector:
    def __init__(self, path: str | Path, identity: str, retry_period: float = 1.0) -> None:
        if retry_period <= 0:
            raise ValueError(f"retry_period must be > 0, got {retry_period}")
        self.path = Path(os.path.expanduser(str(path)))
        self.identity = identity
        self.retry_period = retry_period
        self._fd: int | None = None
        self._leader = False
        self._task: asyncio.Task[None] | None = None

    def describe(self) -> str:
        return f"leader election: lock file {self.path} as {self.identity}"

    def is_leader(self) -> bool:
        return self._leader

    def try_acquire(self) -> bool:
        """One non-blocking attempt; True once this candidate holds the lock."""
        if self._leader:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        # For people: who holds it. Readers must not infer the holder from it alone.
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{self.identity}\n".encode(), 0)
        self._leader = True
        log.info("leader election: %s acquired %s", self.identity, self.path)
        return True

    def holder(self) -> str:
        """What the current (or last) holder wrote into the file ('' if nothing)."""
        with contextlib.suppress(OSError):
            return self.path.read_text().strip()
        return ""

    async def start(self) -> None:
        if self._task is None and not self.try_acquire():
            log.info(
                "leader election: %s is a follower (%s held by %s)",
                self.identity, self.path, self.holder() or "?",
            )  # fmt: skip
            self._task = asyncio.create_task(self._poll())

    async def _poll(self) -> None:
        while not self.try_acquire():
            await asyncio.sleep(self.retry_period)
        self._task = None

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        self.release()

    def release(self) -> None:
        """Drop the lock (closing the descriptor unlocks it); a follower wins next poll."""
        self._leader = False
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
