"""`epp sim`: serve N simulated vLLM replicas from one process until SIGINT/SIGTERM.

Prints `sim <name> listening on <url>` per replica (flushed) once all are up; scripts
and tests wait for those lines, which is also how they learn ports chosen by `--port 0`.

Settings resolve in three layers: `SimConfig`'s defaults, then `--preset`'s values,
then every flag given explicitly (so `--preset llama-3.1-8b-h100 --max-num-seqs 64`
is the 8B server with a smaller batch).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
from dataclasses import fields
from typing import Any

from epp.sim import presets
from epp.sim.chat import load_renderer
from epp.sim.cluster import SimCluster
from epp.sim.config import EC_ROLES, KV_EVENT_FORMATS, KV_ROLES, KVEventsConfig, SimConfig
from epp.sim.tokenizer import shared_tokenizer

_DEFAULTS = SimConfig()
_FIELDS = {f.name for f in fields(SimConfig)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = _DEFAULTS
    p = parser
    p.add_argument("--replicas", type=int, default=1, help="number of servers (default 1)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument(
        "--port", type=int, default=8000,
        help="port of replica 0; replica i uses port+i. 0 picks free ports (default 8000)",
    )  # fmt: skip
    p.add_argument("--name-prefix", default="sim", help="replica i is named PREFIX-i")
    p.add_argument(
        "--preset", choices=sorted([*presets.PRESETS, *presets.ALIASES]),
        help="calibrated server shape (limits, KV cache, step times); flags override it",
    )  # fmt: skip
    p.add_argument("--model", help=f"served model name (default {d.model})")
    p.add_argument(
        "--lora-modules", nargs="*", metavar="NAME[=PATH]",
        help="LoRA adapters served beside the base model (PATH is only reported)",
    )  # fmt: skip
    p.add_argument("--max-loras", type=int, help="adapters in one batch / GPU slots (1)")
    p.add_argument(
        "--lora-load-ms", type=float,
        help="model ms a step waits to load an adapter that is not resident (0)",
    )  # fmt: skip
    p.add_argument(
        "--max-num-seqs", type=int,
        help=f"max running requests; the rest queue FIFO (default {d.max_num_seqs})",
    )  # fmt: skip
    p.add_argument(
        "--max-num-batched-tokens", type=int,
        help=f"token budget of one step (default {d.max_num_batched_tokens})",
    )  # fmt: skip
    p.add_argument(
        "--long-prefill-token-threshold", type=int,
        help="most prompt tokens one request computes in a step, as vLLM's flag "
        "(default 0: only the step's budget limits it)",
    )  # fmt: skip
    p.add_argument("--step-base-ms", type=float, help="fixed model ms of every step (0)")
    p.add_argument(
        "--weight-read-ms", type=float,
        help="floor of a step's matmul time: reading the weights once (0)",
    )  # fmt: skip
    p.add_argument(
        "--prefill-ms-per-token", type=float,
        help=f"model ms per prompt token computed (default {d.prefill_ms_per_token})",
    )  # fmt: skip
    p.add_argument(
        "--decode-ms-per-token", type=float,
        help="model ms of the decode part of a step (one token for every running sequence)",
    )  # fmt: skip
    p.add_argument(
        "--batch-slowdown", type=float,
        help="extra decode time per additional running sequence, as a fraction (0)",
    )  # fmt: skip
    p.add_argument(
        "--attention-ms-per-ktoken", type=float,
        help="model ms per 1000 context tokens attended in a step (0)",
    )  # fmt: skip
    p.add_argument(
        "--time-scale", type=float,
        help="run the model this many times faster than real time; metrics stay in model time",
    )  # fmt: skip
    p.add_argument(
        "--kv-capacity-tokens", type=int,
        help=f"KV-cache size in tokens (default {d.kv_capacity_tokens})",
    )  # fmt: skip
    p.add_argument("--num-gpu-blocks", type=int, help="KV-cache size in blocks (instead)")
    p.add_argument("--block-size", type=int, help=f"tokens per KV block (default {d.block_size})")
    p.add_argument(
        "--max-model-len", type=int, help="longest prompt + output (default: the cache size)"
    )
    p.add_argument(
        "--enable-prefix-caching", action=argparse.BooleanOptionalAction,
        help="reuse cached KV blocks across requests (default on, as in vLLM V1)",
    )  # fmt: skip
    p.add_argument(
        "--tokenizer", metavar="PATH",
        help="a Hugging Face tokenizer.json (or its folder); default: the EPP's simple one",
    )  # fmt: skip
    p.add_argument(
        "--chat-template", metavar="PATH",
        help="Jinja chat template (.jinja or tokenizer_config.json; needs jinja2); "
        "default: the EPP's rendering",
    )  # fmt: skip
    p.add_argument(
        "--default-max-tokens", type=int,
        help=f"output length when a request sets none (default {d.default_max_tokens})",
    )  # fmt: skip
    p.add_argument(
        "--kv-events-config", metavar="JSON",
        help="vLLM's KV-events JSON, e.g. '{\"enable_kv_cache_events\": true, "
        "\"publisher\": \"zmq\", \"endpoint\": \"tcp://*:5557\"}'",
    )  # fmt: skip
    p.add_argument(
        "--kv-events-format", choices=KV_EVENT_FORMATS,
        help="events as tagged maps (vLLM 0.32, default) or positional arrays (older vLLM)",
    )  # fmt: skip
    p.add_argument(
        "--kv-offload-blocks", type=int,
        help="a CPU tier of this many KV blocks behind the GPU cache: evicted blocks move "
        "there, announced in KV events with medium CPU (default 0: none)",
    )  # fmt: skip
    p.add_argument(
        "--data-parallel-size", type=int,
        help="data-parallel ranks behind the one port, as vLLM's --data-parallel-size with "
        "one API server: X-data-parallel-rank picks one, else the least loaded (default 1)",
    )  # fmt: skip
    p.add_argument(
        "--kv-role", choices=KV_ROLES,
        help="P/D legs honoured: both (default), prefill, decode, none",
    )  # fmt: skip
    p.add_argument(
        "--kv-transfer-ms-per-token", type=float,
        help=f"decode side: model ms to pull one prompt token's KV "
        f"(default {d.kv_transfer_ms_per_token})",
    )  # fmt: skip
    p.add_argument(
        "--ec-role", choices=EC_ROLES,
        help="encode: an encoder-only server for encode/prefill/decode disaggregation "
        "(answers one token after encoding the request's media); none (default)",
    )  # fmt: skip
    p.add_argument(
        "--encode-ms-per-item", type=float,
        help=f"encode role: model ms to encode one media item not in the encoder cache "
        f"(default {d.encode_ms_per_item})",
    )  # fmt: skip
    p.add_argument(
        "--encoder-cache-items", type=int,
        help=f"encode role: media items the encoder cache holds (default "
        f"{d.encoder_cache_items})",
    )  # fmt: skip
    p.add_argument(
        "--failure-rate", type=float,
        help="fraction of inference requests answered with HTTP 500",
    )  # fmt: skip
    p.add_argument("--seed", type=int, help="seed for injected failures")


def config_from_args(args: argparse.Namespace) -> SimConfig:
    """Defaults <- preset <- explicit flags. Raises ValueError on a bad combination."""
    explicit: dict[str, Any] = {
        name: value
        for name, value in vars(args).items()
        if name in _FIELDS and value is not None and name not in ("preset", "kv_events")
    }
    if args.lora_modules is not None:
        explicit["lora_modules"] = tuple(args.lora_modules)
    if args.num_gpu_blocks is not None:
        if args.kv_capacity_tokens is not None:
            raise ValueError("give --num-gpu-blocks or --kv-capacity-tokens, not both")
        explicit["kv_capacity_tokens"] = None  # resolved below, once block_size is known
    if args.kv_events_config:
        try:
            raw = json.loads(args.kv_events_config)
        except ValueError as e:
            raise ValueError(f"--kv-events-config is not JSON: {e}") from None
        explicit["kv_events"] = KVEventsConfig.from_dict(raw)
    if explicit.get("kv_capacity_tokens", 0) is None:
        block = explicit.get("block_size")
        if block is None:
            block = presets.get(args.preset).values.get("block_size") if args.preset else None
        explicit["kv_capacity_tokens"] = args.num_gpu_blocks * (block or _DEFAULTS.block_size)
    config = presets.config_for(args.preset, **explicit)
    events = config.kv_events
    if (
        getattr(args, "replicas", 1) > 1
        and events is not None
        and events.enabled
        and events.topic
        and "{port}" not in events.topic
    ):
        raise ValueError(
            "with --replicas > 1 each replica needs its own KV-events topic: leave 'topic'"
            " empty (kv@{host}:{port}@{model}) or put {port} in it"
        )
    return config


async def serve(args: argparse.Namespace) -> None:
    cluster = SimCluster(
        args.replicas,
        config_from_args(args),
        host=args.host,
        base_port=args.port,
        name_prefix=args.name_prefix,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await cluster.start()
    try:
        for server in cluster:
            print(f"sim {server.name} listening on {server.url}", flush=True)
        await stop.wait()
    finally:
        await cluster.stop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)


def run(args: argparse.Namespace) -> int:
    if args.replicas < 1:
        print("epp sim: --replicas must be >= 1", file=sys.stderr)
        return 2
    try:
        config = config_from_args(args)
        shared_tokenizer(config.tokenizer)  # fail now, not in every replica
        load_renderer(config.chat_template)
    except (ValueError, OSError, RuntimeError) as e:
        print(f"epp sim: {e}", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(args))
    except OSError as e:  # typically a port already in use
        print(f"epp sim: {e}", file=sys.stderr)
        return 1
    return 0
