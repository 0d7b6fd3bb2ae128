"""`epp_event_loop_tasks`: how many asyncio tasks are alive on the EPP's event loop.

Every open ext_proc stream, scrape and watcher is a task; a count that keeps growing
under steady load is a leak (the soak, `make soak`, plots it). Set when /metrics is
read, on the loop itself (`asyncio.all_tasks` is only safe from the loop's thread).
"""

from __future__ import annotations

import asyncio

from prometheus_client import Gauge

from epp.observability import REGISTRY

LOOP_TASKS = Gauge(
    "epp_event_loop_tasks",
    "asyncio tasks alive on the EPP's event loop when /metrics was read.",
    registry=REGISTRY,
)


def update_loop_tasks() -> None:
    """Call on the loop, right before the registry is rendered."""
    LOOP_TASKS.set(len(asyncio.all_tasks()))
