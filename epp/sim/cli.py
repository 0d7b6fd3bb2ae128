"""`epp sim`: serve N simulated vLLM replicas from one process until SIGINT/SIGTERM.

Prints `sim <name> listening on <url>` per replica (flushed) once all are up; scripts
and tests wait for those lines, which is also how they learn ports chosen by `--port 0`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys

from epp.sim.cluster import SimCluster
from epp.sim.config import SimConfig

_DEFAULTS = SimConfig()


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
    p.add_argument("--model", default=d.model, help=f"served model name (default {d.model})")
    p.add_argument(
        "--lora-modules", nargs="*", default=[], metavar="NAME[=PATH]",
        help="LoRA adapters also served (PATH is ignored)",
    )  # fmt: skip
    p.add_argument("--max-loras", type=int, default=d.max_loras)
    p.add_argument(
        "--max-num-seqs", type=int, default=d.max_num_seqs,
        help=f"max concurrently running requests; the rest queue FIFO (default {d.max_num_seqs})",
    )  # fmt: skip
    p.add_argument("--prefill-ms-per-token", type=float, default=d.prefill_ms_per_token)
    p.add_argument(
        "--decode-ms-per-token", type=float, default=d.decode_ms_per_token,
        help="model time of one decode step (one token for every running sequence)",
    )  # fmt: skip
    p.add_argument(
        "--batch-slowdown", type=float, default=d.batch_slowdown,
        help="extra decode step time per additional running sequence, as a fraction",
    )  # fmt: skip
    p.add_argument(
        "--time-scale", type=float, default=d.time_scale,
        help="run the model this many times faster than real time; metrics stay in model time",
    )  # fmt: skip
    p.add_argument("--kv-capacity-tokens", type=int, default=d.kv_capacity_tokens)
    p.add_argument("--block-size", type=int, default=d.block_size)
    p.add_argument(
        "--enable-prefix-caching", action=argparse.BooleanOptionalAction,
        default=d.enable_prefix_caching,
        help="only reported in vllm:cache_config_info for now",
    )  # fmt: skip
    p.add_argument("--default-max-tokens", type=int, default=d.default_max_tokens)
    p.add_argument(
        "--failure-rate", type=float, default=d.failure_rate,
        help="fraction of inference requests answered with HTTP 500",
    )  # fmt: skip
    p.add_argument("--seed", type=int, default=d.seed, help="seed for injected failures")


def config_from_args(args: argparse.Namespace) -> SimConfig:
    return SimConfig(
        model=args.model,
        lora_modules=tuple(m.split("=", 1)[0] for m in args.lora_modules),
        max_loras=args.max_loras,
        max_num_seqs=args.max_num_seqs,
        prefill_ms_per_token=args.prefill_ms_per_token,
        decode_ms_per_token=args.decode_ms_per_token,
        batch_slowdown=args.batch_slowdown,
        time_scale=args.time_scale,
        kv_capacity_tokens=args.kv_capacity_tokens,
        block_size=args.block_size,
        enable_prefix_caching=args.enable_prefix_caching,
        default_max_tokens=args.default_max_tokens,
        failure_rate=args.failure_rate,
        seed=args.seed,
    )


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
        config_from_args(args)
    except ValueError as e:
        print(f"epp sim: {e}", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(args))
    except OSError as e:  # typically a port already in use
        print(f"epp sim: {e}", file=sys.stderr)
        return 1
    return 0
