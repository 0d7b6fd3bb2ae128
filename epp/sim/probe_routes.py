"""The simulator's probe routes: GET /health and GET /metrics (which the `healthy` and
`metrics` faults break)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from aiohttp import web

from epp.sim.metrics import CONTENT_TYPE

if TYPE_CHECKING:
    from epp.sim.server import SimServer

# How often (real seconds) the server checks whether waiting clients have gone, and a
# hung /metrics whether it may answer after all.
POLL_SECONDS = 0.05


class ProbeRoutes:
    def __init__(self, server: SimServer) -> None:
        self.server = server

    def register(self, router: web.UrlDispatcher) -> None:
        router.add_get("/health", self.health)
        router.add_get("/metrics", self.metrics)

    async def health(self, request: web.Request) -> web.Response:
        if not self.server.faults.healthy:
            return web.Response(status=503)
        return web.Response()

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        self.server.stats.metrics_scrapes += 1
        if not self.server.faults.metrics:
            self.server.stats.metrics_hung += 1
            # Never answer: the scraper must hit its own timeout, as with a wedged
            # server. Give up only if the client leaves, the server stops, or the
            # fault is lifted (then answer late, as a slow server would).
            while not self.server.faults.metrics:
                transport = request.transport
                if self.server.stopping or transport is None or transport.is_closing():
                    if transport is not None:
                        transport.close()
                    raise asyncio.CancelledError
                await asyncio.sleep(POLL_SECONDS)
        return web.Response(
            body=self.server.render_metrics(), headers={"Content-Type": CONTENT_TYPE}
        )
