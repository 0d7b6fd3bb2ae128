"""The lock-file elector: one holder at a time, and the lock passes on when the holder's
process dies (SIGKILL: no clean-up code runs, the kernel drops the flock)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from epp.election.lockfile import LockFileElector

HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(600)
"""


def test_one_holder_at_a_time_and_release_passes_it_on(tmp_path):
    lock = tmp_path / "planner.lock"
    a, b = LockFileElector(lock, "a"), LockFileElector(lock, "b")
    assert a.try_acquire() and a.is_leader()
    assert not b.try_acquire() and not b.is_leader()
    assert b.holder() == "a"
    a.release()
    assert not a.is_leader()
    assert b.try_acquire() and b.holder() == "b"
    assert not a.try_acquire()
    b.release()


def test_a_killed_holder_process_frees_the_lock(tmp_path):
    lock = tmp_path / "planner.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(lock)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == b"held"
        me = LockFileElector(lock, "me")
        assert not me.try_acquire()
        holder.kill()
        holder.wait(timeout=10)
        assert me.try_acquire() and me.is_leader()
        me.release()
    finally:
        holder.kill()
        holder.wait(timeout=10)


async def test_start_follows_until_the_lock_is_free(tmp_path):
    lock = tmp_path / "planner.lock"
    a, b = LockFileElector(lock, "a", retry_period=0.01), LockFileElector(lock, "b", 0.01)
    await a.start()
    await b.start()
    assert a.is_leader() and not b.is_leader()
    await a.stop()
    for _ in range(1000):  # b polls every 0.01 s; no bound on how long that takes here
        if b.is_leader():
            break
        await asyncio.sleep(0.01)
    assert b.is_leader() and b.holder() == "b"
    await b.stop()
    assert lock.exists()  # never deleted: a new file would be a different lock
