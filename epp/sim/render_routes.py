"""The simulator's render routes: POST /v1/completions/render and POST
/v1/chat/completions/render answer a request's token ids without running it, as vLLM's
(vllm/entrypoints/scale_out/render/api_router.py, vLLM 0.32): completions get a list of
`GenerateRequest`s (one per prompt), chat one.

Why: vllm-router's `cache_aware` policy (0.1.17) does not tokenize an HTTP worker's
requests itself; it asks the worker's render route for the token ids and, without one
("Prefix input preparation unavailable ... render_unavailable" in its debug log), counts
the decision as `missing_tokens` and balances load instead. With these routes it
matches prefixes on the simulator's own token ids, as it does on a real vLLM.

vllm-router renders every request at EVERY worker (8 render calls per request on 8
servers) and gives up on a worker that answers late ("preparation_unavailable"). On real
servers those are 8 processes on 8 hosts working in parallel; `epp sim --replicas 8` is
one Python process, so the replicas share one answer per body (`_CACHE`, the last
`CACHE_SIZE` bodies): the first replica tokenizes, the others answer from the cache, and
the process spends on a request's renders what one vLLM server would.
"""

from __future__ import annotations

import itertools
import json
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from aiohttp import web

from epp.sim.openai import ApiError, InferenceRequest, Kind, parse

if TYPE_CHECKING:
    from epp.sim.server import SimServer

_IDS = itertools.count()
CACHE_SIZE = 64
_CACHE: OrderedDict[tuple[str, bytes], bytes] = OrderedDict()  # (route, body) -> answer


class RenderRoutes:
    def __init__(self, server: SimServer) -> None:
        self.server = server

    def register(self, router: web.UrlDispatcher) -> None:
        router.add_post("/v1/completions/render", self.completions)
        router.add_post("/v1/chat/completions/render", self.chat)

    async def completions(self, request: web.Request) -> web.Response:
        return await self._answer(request, "completion")

    async def chat(self, request: web.Request) -> web.Response:
        return await self._answer(request, "chat")

    async def _answer(self, request: web.Request, kind: Kind) -> web.Response:
        raw = await request.read()
        key = (f"{self.server.config.model}/{request.path}", raw)
        body = _CACHE.get(key)
        if body is None:
            body = json.dumps(self._render(kind, raw)).encode()
            _CACHE[key] = body
            if len(_CACHE) > CACHE_SIZE:
                _CACHE.popitem(last=False)
        return web.Response(body=body, content_type="application/json")

    def _render(self, kind: Kind, raw: bytes) -> Any:
        """The same validation as the inference routes (unknown model 404, too long 400)."""
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise ApiError(400, f"Invalid JSON body: {e}") from None
        req = parse(
            kind,
            body,
            self.server.config,
            tokenizer=self.server.tokenizer,
            render=self.server.render,
            models=self.server.served_models(),
        )
        if kind == "chat":
            return generate_request(req, req.prompts[0], f"chatcmpl-render-{next(_IDS)}")
        base = f"cmpl-render-{next(_IDS)}"
        return [
            generate_request(req, ids, base if len(req.prompts) == 1 else f"{base}-{i}")
            for i, ids in enumerate(req.prompts)
        ]


def generate_request(
    req: InferenceRequest, ids: tuple[int, ...], request_id: str
) -> dict[str, Any]:
    """The fields of vLLM's `GenerateRequest` a router reads (token_in_token_out/protocol.py):
    the ids, the model, the output budget and the stream flag."""
    return {
        "request_id": request_id,
        "token_ids": list(ids),
        "sampling_params": {"max_tokens": req.max_tokens},
        "model": req.model,
        "stream": req.stream,
        "cache_salt": req.cache_salt,
        "priority": 0,
    }
