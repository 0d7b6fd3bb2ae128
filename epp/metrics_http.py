"""The EPP's HTTP port: Prometheus `/metrics`, `/debug/endpoints` and whatever else the
caller mounts (the status page).

Off the ext_proc port on purpose: a scrape or a browser never competes with routing
for a gRPC stream, and the port can be firewalled apart.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from epp.datastore import Datastore
from epp.loop_tasks import update_loop_tasks
from epp.observability import REGISTRY


async def start_metrics_http(
    datastore: Datastore,
    host: str,
    port: int,
    mount: Callable[[web.Application], None] = lambda app: None,
) -> tuple[web.AppRunner, int]:
    """Serve on `host:port` (0: any free port); returns the runner and the bound port."""

    async def metrics(_: web.Request) -> web.Response:
        update_loop_tasks()
        return web.Response(
            body=generate_latest(REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def endpoints(_: web.Request) -> web.Response:
        ds = datastore
        rows = [
            {
                "name": s.name,
                "address": s.hostport,
                "labels": dict(s.endpoint.labels),
                "healthy": s.healthy,
                "last_error": ds.last_error(s.name),
                "models": sorted(s.models) if s.models is not None else None,
                "waiting": s.metrics.waiting_queue_size,
                "running": s.metrics.running_requests,
                "kv_cache_usage": s.metrics.kv_cache_usage,
                "inflight_requests": s.inflight_requests,
                "inflight_tokens": s.inflight_tokens,
                "inflight_prefill_tokens": s.inflight_prefill_tokens,
            }
            for s in ds.snapshot()
        ]
        return web.json_response(rows, dumps=lambda o: json.dumps(o, indent=2))

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    mount(app)
    app.router.add_get("/debug/endpoints", endpoints)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, bound
