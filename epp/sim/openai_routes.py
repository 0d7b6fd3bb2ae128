"""The simulator's OpenAI routes: POST /v1/completions, POST /v1/chat/completions (whole
or streamed answers, the P/D `kv_transfer_params` legs) and GET /v1/models."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from aiohttp import web

from epp.sim import pd
from epp.sim.messages import MessagesBuilder, MessagesRoutes
from epp.sim.openai import (
    ApiError,
    InferenceRequest,
    Kind,
    ResponseBuilder,
    models_body,
    parse,
    read_json,
    usage,
)
from epp.sim.sequence import Channel, SimRequest, State
from epp.sim.tokenizer import filler_text, filler_token

if TYPE_CHECKING:
    from epp.sim.server import SimServer


class OpenAIRoutes:
    def __init__(self, server: SimServer) -> None:
        self.server = server

    def register(self, router: web.UrlDispatcher) -> None:
        router.add_post("/v1/completions", self.completions)
        router.add_post("/v1/chat/completions", self.chat)
        router.add_get("/v1/models", self.models)
        MessagesRoutes(self).register(router)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self.inference(request, "completion")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self.inference(request, "chat")

    async def models(self, request: web.Request) -> web.Response:
        adapters = {a.name: a.path for a in self.server.lora.adapters.values()}
        return web.json_response(models_body(self.server.config, adapters))

    def count_kv_transfer(self, kind: pd.Kind) -> None:
        if kind != "none":
            self.server.stats.kv_transfer[kind] += 1

    async def inference(self, request: web.Request, kind: Kind) -> web.StreamResponse:
        return await self.run(request, await read_json(request), kind)

    async def run(
        self, request: web.Request, body: Any, kind: Kind | MessagesBuilder
    ) -> web.StreamResponse:
        """Serve one request; `kind` is an OpenAI kind, or a Messages builder for a
        /v1/messages request already converted to chat (epp.sim.messages)."""
        builder = kind if isinstance(kind, MessagesBuilder) else None
        kind = "chat" if builder is not None else kind
        self.server.stats.requests_received += 1
        req = parse(
            kind,
            body,
            self.server.config,
            tokenizer=self.server.tokenizer,
            render=self.server.render,
            models=self.server.served_models(),
        )
        self.count_kv_transfer(req.kv_kind)
        if self.server.stopping:
            raise ApiError(503, "server is shutting down")
        if (
            self.server.faults.fail_rate > 0
            and self.server.rng.random() < self.server.faults.fail_rate
        ):
            self.server.stats.requests_failed += 1
            raise ApiError(500, "simulated failure (fault injection)")

        if self.server.config.ec_role == "encode":
            return await self.encode(req, builder or ResponseBuilder(kind, req.model))
        role = self.server.config.kv_role
        remote_decode = req.kv_kind == "do_remote_decode" and pd.honours(role, req.kv_kind)
        remote_prefill = req.kv_kind == "do_remote_prefill" and pd.honours(role, req.kv_kind)
        channel = Channel(stream=req.stream)
        seqs = [
            SimRequest(
                ids,
                1 if remote_decode else req.max_tokens,
                channel,
                model=req.model,
                lora=req.lora,
                index=i,
                finish_reason="length" if remote_decode else req.finish_reason,
                cache_salt=req.cache_salt,
                remote_prefill=remote_prefill,
                remote_decode=remote_decode,
                mm=req.mm,
            )
            for i, ids in enumerate(req.prompts)
        ]
        delay = self.server.faults.delay_ms / 1000.0
        engine = self.server.engine_for(request)
        for seq in seqs:
            engine.submit(seq, delay)
        if builder is None:
            builder = ResponseBuilder(kind, req.model)
        self.server.inflight[channel] = request
        try:
            if req.stream:
                return await self.stream(request, builder, seqs, req.include_usage)
            return await self.complete(builder, req, seqs, remote_decode)
        except ConnectionResetError:
            self.server.stats.requests_aborted += 1
            return web.Response(status=499)  # nobody is listening; nginx's "client closed"
        except asyncio.CancelledError:  # the client disconnected (handler_cancellation)
            self.server.stats.requests_aborted += 1
            raise
        finally:
            self.server.inflight.pop(channel, None)
            for seq in seqs:  # no-op for finished ones; frees slots if the client left
                engine.abort(seq)

    async def encode(
        self, req: InferenceRequest, builder: ResponseBuilder | MessagesBuilder
    ) -> web.Response:
        """The encode role (`epp.sim.encode`): encode the media, answer one token."""
        encoded, hits = await self.server.encoder.encode(f[0] for f in req.mm)
        stats = self.server.stats
        stats.mm_items_encoded += encoded
        stats.encoder_cache_hits += hits
        stats.requests_succeeded += 1
        prompt = sum(len(p) for p in req.prompts)
        return web.json_response(builder.full([filler_text(1)], ["length"], usage(prompt, 1, 0)))

    def usage(self, seqs: list[SimRequest]) -> dict[str, Any]:
        return usage(
            sum(s.num_prompt_tokens for s in seqs),
            sum(s.generated for s in seqs),
            sum(s.num_cached_tokens for s in seqs),
        )

    def count_success(self, seqs: list[SimRequest]) -> None:
        self.server.stats.requests_succeeded += 1
        self.server.stats.prompt_tokens += sum(s.num_prompt_tokens for s in seqs)
        self.server.stats.completion_tokens += sum(s.generated for s in seqs)
        self.server.stats.cached_tokens += sum(s.num_cached_tokens for s in seqs)

    def aborted(self, seqs: list[SimRequest]) -> SimRequest | None:
        return next((s for s in seqs if s.state is State.ABORTED), None)

    async def complete(
        self,
        builder: ResponseBuilder | MessagesBuilder,
        req: InferenceRequest,
        seqs: list[SimRequest],
        remote_decode: bool,
    ) -> web.Response:
        channel = seqs[0].channel
        while True:
            aborted = self.aborted(seqs)
            if aborted is not None:
                self.server.stats.requests_aborted += 1
                raise ApiError(503, aborted.abort_reason)
            if all(s.state is State.FINISHED for s in seqs):
                break
            await channel.wait()
        self.count_success(seqs)
        params = None
        if remote_decode:
            params = pd.prefill_answer(
                self.server.engine_id,
                seqs[0].remote_block_ids,
                self.server.advertised_host,
                self.server.port,
            )
        texts = [filler_text(s.generated) for s in seqs]
        finishes = [s.finish_reason for s in seqs]
        return web.json_response(builder.full(texts, finishes, self.usage(seqs), params))

    async def stream(
        self,
        request: web.Request,
        builder: ResponseBuilder | MessagesBuilder,
        seqs: list[SimRequest],
        include_usage: bool,
    ) -> web.StreamResponse:
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)

        channel = seqs[0].channel
        sent = [0] * len(seqs)
        remaining = len(seqs)
        started = False
        try:
            while remaining:
                out: list[str] = []
                for i, seq in enumerate(seqs):
                    finished = seq.state is State.FINISHED
                    while sent[i] < seq.generated:
                        k = sent[i]
                        if not started:
                            out.append(builder.sse_start(self.usage(seqs)))
                            started = True
                        last = finished and k + 1 == seq.generated
                        reason = seq.finish_reason if last else None
                        out.append(builder.sse_token(i, filler_token(k), k == 0, reason))
                        sent[i] += 1
                        remaining -= last
                if out:
                    await resp.write("".join(out).encode())
                aborted = self.aborted(seqs)
                if aborted is not None:
                    self.server.stats.requests_aborted += 1
                    await resp.write(builder.sse_error(503, aborted.abort_reason).encode())
                    return resp
                if remaining:
                    await channel.wait()
            end = builder.sse_end(seqs[0].finish_reason, self.usage(seqs), include_usage)
            await resp.write(end.encode())
            await resp.write_eof()
        except ConnectionResetError:
            self.server.stats.requests_aborted += 1
            return resp
        self.count_success(seqs)
        return resp
