"""`/` (the page) and `/status.json` on the EPP's metrics port."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from importlib import resources

from aiohttp import web

from epp.datastore import Datastore
from epp.observability import REGISTRY
from epp.planner.live.loop import PlannerThread
from epp.status.ring import DecisionRing
from epp.status.snapshot import status

PAGE = resources.files("epp.status").joinpath("page.html").read_bytes()


def add_status_routes(
    app: web.Application,
    *,
    pool_name: str,
    datastore: Datastore,
    decisions: DecisionRing,
    planner: Callable[[], PlannerThread | None],
    commit: Callable[[], str],
) -> None:
    """`planner` and `commit` are read per request: the planner starts after the page
    is served, and the commit is read once the server has started."""

    async def page(_: web.Request) -> web.Response:
        return web.Response(body=PAGE, content_type="text/html", charset="utf-8")

    async def status_json(_: web.Request) -> web.Response:
        body = status(pool_name, datastore, decisions, REGISTRY, planner(), commit())
        return web.Response(
            text=json.dumps(_finite(body)),
            content_type="application/json",
            headers={"Cache-Control": "no-store"},
        )

    app.router.add_get("/", page)
    app.router.add_get("/status.json", status_json)


def _finite(o: object) -> object:
    """NaN and infinities as null: JSON has no such numbers (a browser refuses them)."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, list):
        return [_finite(v) for v in o]
    return o
