"""Cold-start delay from zero replicas: how long the first request waits when the pool
is empty and the planner has to start a replica (`min-endpoint: 0`).

One `EppServer` with `--planner` (local connector, `epp sim` replicas) behind a real
Envoy. Each round scales the pool to zero (drain, stop), then sends one completion and
times it at the client: hold in the EPP + process start + health check + scrape + the
request itself. Prints every round and the median.

    .venv/bin/python bench/cold_start.py --rounds 5
    .venv/bin/python bench/cold_start.py --rounds 2 --cold-start-timeout 900 --command \
      "/work/venv-vllm/bin/python scripts/vllm/serve.py --model \
       /work/venv-vllm/models/tiny-llama --served-model-name tiny --port {port}"
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp

from epp.harness.envoy import EnvoyOptions, astart_envoy
from epp.harness.procs import ProcessGroup
from epp.planner.core.config import load_planner_file
from epp.planner.live.loop import ManualTicks
from epp.records import Role
from epp.serve import EppServer, ServeOptions


async def main(rounds: int, command: str, cold_start_timeout: float) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="epp-cold-"))
    cfg = load_planner_file(
        f'mode: load\nmin-endpoint: 0\nmin-gpu-budget: 0\nworker-command: "{command}"\n'
        f'statefile: "{tmp}/state.json"\ncold-start-timeout: {cold_start_timeout}\n'
        f"worker-ready-timeout: {cold_start_timeout}\n"
    )
    opts = ServeOptions(host="127.0.0.1", grpc_port=0, health_port=0, metrics_port=0,
                        planner=cfg, pool_name="cold")  # fmt: skip
    server = EppServer(opts, planner_ticks=ManualTicks())  # no decisions: only wake-ups
    await server.start()
    conn = server.planner.connector  # type: ignore[union-attr]
    async with ProcessGroup() as pg:
        envoy = await astart_envoy(
            pg,
            EnvoyOptions.loopback(server.grpc_port, server.health_port),
            timeout=60,
        )
        body = {"model": "tiny", "prompt": "wake up", "max_tokens": 5}
        times = []
        timeout = aiohttp.ClientTimeout(total=cold_start_timeout + 60)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for i in range(rounds):
                await conn.set_replicas(Role.AGGREGATED, 0)
                await conn.settle()
                start = time.monotonic()
                async with session.post(envoy.url + "/v1/completions", json=body) as r:
                    await r.read()
                    status = r.status
                times.append(time.monotonic() - start)
                print(f"round {i}: {times[-1]:.2f} s (status {status})", flush=True)
    await server.stop()
    print(f"cold start from zero ({command}): median {statistics.median(times):.2f} s "
          f"over {rounds} rounds (min {min(times):.2f}, max {max(times):.2f})")  # fmt: skip


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--command", default="epp sim --port {port}")
    p.add_argument(
        "--cold-start-timeout", type=float, default=60,
        help="seconds the first request may wait (and a replica may take to be healthy)",
    )  # fmt: skip
    a = p.parse_args()
    asyncio.run(main(a.rounds, a.command, a.cold_start_timeout))
