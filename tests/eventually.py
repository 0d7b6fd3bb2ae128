"""Wait for an event, not for a time: poll a condition until it holds, and fail naming
what never happened after a generous deadline.

The deadline only bounds a broken run (a loaded machine may take ten times longer than
an idle one; a test must pass on both), so no test asserts on how long something took.
`cond` may be a plain function, a coroutine function, or a blocking function
(`blocking=True`: it runs in a thread, so an HTTP query does not stall the loop).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_INTERVAL_S = 0.02


async def eventually(
    cond: Callable[[], object | Awaitable[object]],
    what: str = "the condition",
    timeout: float = DEFAULT_TIMEOUT_S,
    *,
    interval: float = DEFAULT_INTERVAL_S,
    blocking: bool = False,
) -> float:
    """Await until `cond()` is truthy; returns the seconds it took (for a log line, not an
    assertion); AssertionError naming `what` after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while True:
        result = await asyncio.to_thread(cond) if blocking else cond()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return loop.time() - start
        if loop.time() - start > timeout:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(interval)


def eventually_sync(
    cond: Callable[[], object],
    what: str = "the condition",
    timeout: float = DEFAULT_TIMEOUT_S,
    *,
    interval: float = DEFAULT_INTERVAL_S,
) -> float:
    """`eventually` for code without an event loop."""
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)
    return time.monotonic() - start
