"""The servicer's one-timer-per-stream body deadline (`_BodyDeadline`) behaves as the
`asyncio.timeout_at` around each message wait that it replaced. Real asyncio, no
timing asserted: the tests only wait for the deadline to pass."""

from __future__ import annotations

import asyncio

import pytest

from epp.extproc.server import _BodyDeadline


async def _never() -> None:
    await asyncio.Future()  # a message that never comes


async def within(deadline: _BodyDeadline, wait):
    """One wait under the deadline, composed of the three calls the servicer's loop
    makes (begin, fired on CancelledError, end)."""
    try:
        deadline.begin()
    except TimeoutError:
        wait.close()  # never awaited: no "coroutine was never awaited" warning
        raise
    try:
        return await wait
    except asyncio.CancelledError:
        if deadline.fired():
            raise TimeoutError from None
        raise
    finally:
        deadline.end()


def test_a_wait_past_the_deadline_raises_timeout_and_the_task_is_not_left_cancelled() -> None:
    async def main() -> int:
        deadline = _BodyDeadline(asyncio.get_running_loop(), 0.01)
        with pytest.raises(TimeoutError):
            await within(deadline, _never())
        task = asyncio.current_task()
        assert task is not None
        return task.cancelling()

    assert asyncio.run(main()) == 0  # uncancelled: the stream can go on to answer 408


def test_a_wait_that_starts_after_the_deadline_raises_at_once() -> None:
    async def main() -> None:
        deadline = _BodyDeadline(asyncio.get_running_loop(), 0.01)
        await asyncio.sleep(0.02)  # past it, while not waiting (the stream was busy)
        with pytest.raises(TimeoutError):
            await within(deadline, _never())

    asyncio.run(main())


def test_messages_before_the_deadline_pass_and_cancel_disarms_it() -> None:
    async def main() -> list[int]:
        deadline = _BodyDeadline(asyncio.get_running_loop(), 0.05)
        got = []
        for i in range(3):  # three messages arrive in time, one timer for all of them
            got.append(await within(deadline, asyncio.sleep(0, result=i)))
        deadline.cancel()  # routed: the deadline no longer applies
        await asyncio.sleep(0.1)  # well past it: nothing fires into the task
        return got

    assert asyncio.run(main()) == [0, 1, 2]


def test_someone_elses_cancel_is_not_turned_into_a_timeout() -> None:
    async def waiter(deadline: _BodyDeadline) -> None:
        await within(deadline, _never())

    async def main() -> None:
        deadline = _BodyDeadline(asyncio.get_running_loop(), 30.0)
        task = asyncio.ensure_future(waiter(deadline))
        await asyncio.sleep(0)
        task.cancel()  # Envoy reset the stream
        with pytest.raises(asyncio.CancelledError):
            await task
        deadline.cancel()

    asyncio.run(main())
