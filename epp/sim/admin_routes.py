"""The simulator's admin routes: LoRA adapters (POST /v1/load_lora_adapter,
/v1/unload_lora_adapter), the KV cache (GET /kv_event_sources, POST /reset_prefix_cache)
and faults with counters (GET|POST /admin)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from aiohttp import web

from epp.sim.lora import LoraError
from epp.sim.openai import ApiError, read_json

if TYPE_CHECKING:
    from epp.sim.server import SimServer

log = logging.getLogger("epp.sim")


class AdminRoutes:
    def __init__(self, server: SimServer) -> None:
        self.server = server

    def register(self, router: web.UrlDispatcher) -> None:
        router.add_post("/v1/load_lora_adapter", self.load_lora)
        router.add_post("/v1/unload_lora_adapter", self.unload_lora)
        router.add_get("/kv_event_sources", self.kv_event_sources)
        router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        router.add_get("/admin", self.admin_get)
        router.add_post("/admin", self.admin_post)

    async def load_lora(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        name = body.get("lora_name") if isinstance(body, dict) else None
        path = body.get("lora_path") if isinstance(body, dict) else None
        if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
            raise ApiError(400, "Both 'lora_name' and 'lora_path' must be provided.")
        if name == self.server.config.model:
            raise ApiError(400, f"The lora adapter '{name}' has already been loaded.")
        try:
            message = self.server.lora.load(name, path)
        except LoraError as e:
            raise ApiError(e.status, e.message) from None
        log.info("%s: %s", self.server.name, message)
        return web.Response(text=message)

    async def unload_lora(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        name = body.get("lora_name") if isinstance(body, dict) else None
        if not isinstance(name, str) or not name:
            raise ApiError(400, "'lora_name' needs to be provided to unload a LoRA adapter.")
        try:
            message = self.server.lora.unload(name)
        except LoraError as e:
            raise ApiError(e.status, e.message) from None
        log.info("%s: %s", self.server.name, message)
        return web.Response(text=message)

    async def kv_event_sources(self, request: web.Request) -> web.Response:
        sources = [p.source() for p in self.server.publishers if p is not None]
        return web.json_response(sources)

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        if not all([e.reset_prefix_cache() for e in self.server.engines]):
            log.warning("%s: prefix cache not reset: blocks are in use", self.server.name)
        return web.Response()

    async def admin_get(self, request: web.Request) -> web.Response:
        return web.json_response(self.server.admin_state())

    async def admin_post(self, request: web.Request) -> web.Response:
        changes = await read_json(request)
        if not isinstance(changes, dict):
            raise ApiError(400, "admin body must be a JSON object of faults")
        try:
            self.server.faults.update(changes)
        except ValueError as e:
            raise ApiError(400, str(e)) from None
        log.info("%s: faults now %s", self.server.name, self.server.faults.to_dict())
        return web.json_response(self.server.admin_state())
