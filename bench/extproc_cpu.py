"""CPU per request of an ext_proc server driven over gRPC directly (no Envoy): the
minimal servicer (`bench/minimal_extproc.py`) and `epp serve` (this checkout, and others
with `--baseline`), side by side in one run.

`bench/overhead.py` measures the same thing behind Envoy, with an HTTP load generator and
a simulator answering every request: seven processes on the machine, so on a shared
2-vCPU VM its windows are slow and noisy. Here a separate client process plays Envoy's
part only: `--concurrency` concurrent ext_proc streams, each the two messages Envoy sends
for a small POST in FULL_DUPLEX_STREAMED mode (request headers with the protocol config,
then the ~300-byte body with end_of_stream), read until the body's last streamed chunk,
then closed. The servers' CPU (utime + stime of every thread, from /proc) is read at the
edges of each window; the EPP's idle CPU (its scraper: `epp sim --replicas 8` scraped
every 50 ms, as in overhead.py) over an equal window without traffic gives the net row.
Windows rotate over the servers, `--rounds` times; medians.

    .venv/bin/python bench/extproc_cpu.py [--seconds 5] [--rounds 3] [--concurrency 16]
    .venv/bin/python bench/extproc_cpu.py --baseline /work/main      # old vs new, one run
    .venv/bin/python bench/extproc_cpu.py --epp-arg=--refresh-metrics-interval=1
    .venv/bin/python bench/extproc_cpu.py --rate 800   # the same offered load to each

`--rate` paces the client (that many request starts per second across its streams) so
every server sees the same load: as fast as each answers, a slower server gets fewer
requests per loop turn, and fixed costs per wake-up would weigh more on it.

What it leaves out: Envoy, HTTP, the upstream; the gRPC/HTTP2 work is the same as behind
Envoy (one stream per request, two messages each way).

`--response-chunks N` compares the two response paths instead (minimal servicer left out):
`epp serve --response-path on`, where after routing the client sends the response headers
and N body chunks (the last with end_of_stream) on the same stream and reads each one back,
as Envoy does in FULL_DUPLEX_STREAMED; and `--response-path observer`, where the routing
stream ends at routing and a second stream, as Envoy's observability-mode filter opens it,
carries the request headers with the `x-epp-route-id` the EPP set, the response headers and
the N chunks, with no answers to wait for.

    .venv/bin/python bench/extproc_cpu.py --response-chunks 18   # 16 tokens + usage + [DONE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: the bench package beside it
    sys.path.insert(0, str(REPO))

from bench.overhead import (  # noqa: E402
    SIM_ARGS,
    cpu_seconds,
    hot_spots,
    machine_busy_seconds,
    request_body,
    start_epp,
    start_minimal,
    start_sims,
)
from epp.harness.procs import ProcessGroup  # noqa: E402


def _messages() -> list[bytes]:
    from request_cpu import messages  # the same two messages bench/request_cpu.py parses

    return messages(body=request_body())


def _response_messages(chunks: int) -> list:
    """Response headers and `chunks` SSE token chunks (vLLM-shaped), the last with
    end_of_stream: what Envoy sends for a streamed completion."""
    from envoy.config.core.v3 import base_pb2
    from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

    hdrs = {":status": "200", "content-type": "text/event-stream"}
    out = [
        pb.ProcessingRequest(
            response_headers=pb.HttpHeaders(
                headers=base_pb2.HeaderMap(
                    headers=[
                        base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in hdrs.items()
                    ]
                )
            )
        )
    ]
    event = (
        b'data: {"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" a"}]}\n\n'
    )
    for i in range(chunks):
        out.append(
            pb.ProcessingRequest(
                response_body=pb.HttpBody(body=event, end_of_stream=i == chunks - 1)
            )
        )
    return out


# ---------------------------------------------------------------- the client (child)


async def _client(
    port: int,
    concurrency: int,
    warmup: float,
    seconds: float,
    pid: int,
    path: str,
    chunks: int,
    rate: float = 0.0,
) -> dict:
    import grpc
    from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
    from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

    from epp.headers import ROUTE_ID

    raw = _messages()
    response = _response_messages(chunks) if path != "none" else []
    state = {"measuring": False, "running": True, "done": 0, "errors": 0, "first": ""}
    loop = asyncio.get_running_loop()
    next_start = [loop.time()]  # --rate: the next request's slot, shared by the workers

    async def pace() -> None:
        """Wait for this request's slot: `rate` starts per second across all workers."""
        now = loop.time()
        slot = next_start[0] = max(next_start[0], now)
        next_start[0] += 1 / rate
        if slot > now:
            await asyncio.sleep(slot - now)

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.ExternalProcessorStub(channel)

        async def one() -> None:
            call = stub.Process()
            for data in raw:
                await call.write(pb.ProcessingRequest.FromString(data))
            route_id = ""
            while True:  # read(), not `async for`: the in-path response writes after it
                resp = await call.read()
                if resp is grpc.aio.EOF:
                    break
                if resp.HasField("immediate_response"):
                    raise RuntimeError(f"refused: {resp.immediate_response.body[:200]!r}")
                for h in resp.request_headers.response.header_mutation.set_headers:
                    if h.header.key == ROUTE_ID:
                        route_id = h.header.raw_value.decode()
                if resp.request_body.response.body_mutation.streamed_response.end_of_stream:
                    break
            if path == "on":  # the response on the same stream, each message answered
                for msg in response:
                    await call.write(msg)
                    await call.read()
            call.cancel()  # Envoy closes the stream once it has what it needs
            if path == "observer":  # Envoy's observability-mode filter: a stream of its own
                first = pb.ProcessingRequest.FromString(raw[0])
                first.ClearField("protocol_config")
                first.request_headers.headers.headers.add(key=ROUTE_ID, raw_value=route_id.encode())
                obs = stub.Process()
                for msg in [first, *response]:
                    msg.observability_mode = True
                    await obs.write(msg)
                await obs.done_writing()
                async for _ in obs:  # none expected; the EPP ends the stream at the end
                    pass

        async def worker() -> None:
            while state["running"]:
                if rate:
                    await pace()
                try:
                    await one()
                except Exception as e:  # counted; the first one is reported
                    if state["measuring"]:
                        state["errors"] += 1
                        state["first"] = state["first"] or repr(e)[:300]
                    await asyncio.sleep(0.01)
                    continue
                if state["measuring"]:
                    state["done"] += 1

        tasks = [asyncio.create_task(worker()) for _ in range(concurrency)]
        await asyncio.sleep(warmup)
        c0, m0, t0 = cpu_seconds(pid), machine_busy_seconds(), time.perf_counter()
        s0 = time.process_time()
        state["measuring"] = True
        await asyncio.sleep(seconds)
        state["measuring"] = False
        c1, m1, t1 = cpu_seconds(pid), machine_busy_seconds(), time.perf_counter()
        s1 = time.process_time()
        state["running"] = False
        await asyncio.gather(*tasks, return_exceptions=True)
    return {
        "requests": state["done"],
        "errors": state["errors"],
        "first_error": state["first"],
        "elapsed": t1 - t0,
        "server_cpu": c1 - c0,
        "client_cpu": s1 - s0,
        "machine_cpu": m1 - m0,
    }


def client_main(argv: Sequence[str]) -> None:
    ap = argparse.ArgumentParser(prog="extproc_cpu.py _client")
    for name in ("port", "concurrency", "pid"):
        ap.add_argument(f"--{name}", type=int, required=True)
    ap.add_argument("--warmup", type=float, required=True)
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--path", choices=("none", "on", "observer"), default="none")
    ap.add_argument("--chunks", type=int, default=0)
    ap.add_argument("--rate", type=float, default=0.0)
    a = ap.parse_args(argv)
    result = asyncio.run(
        _client(a.port, a.concurrency, a.warmup, a.seconds, a.pid, a.path, a.chunks, a.rate)
    )
    print(json.dumps(result), flush=True)


# ---------------------------------------------------------------- the parent


def window(port: int, pid: int, args: argparse.Namespace, path: str = "none") -> dict:
    argv = [
        sys.executable, __file__, "_client", "--port", str(port), "--pid", str(pid),
        "--concurrency", str(args.concurrency), "--warmup", str(args.warmup),
        "--seconds", str(args.seconds), "--path", path,
        "--chunks", str(args.response_chunks), "--rate", str(args.rate),
    ]  # fmt: skip
    out = subprocess.run(argv, check=True, capture_output=True, text=True, cwd=REPO)
    return json.loads(out.stdout.strip().splitlines()[-1])


def profile(pg: ProcessGroup, label: str, pid: int, port: int, args: argparse.Namespace) -> str:
    """py-spy (non-blocking, 250 Hz) over one more window of `label` under load."""
    out_dir = args.profile_dir or pg.run_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"pyspy-{pid}.txt"
    seconds = math.ceil(args.warmup + args.seconds)
    argv = [
        args.py_spy, "record", "--pid", str(pid), "--duration", str(seconds), "--rate", "250",
        "--format", "raw", "--output", str(out), "--nonblocking",
    ]  # fmt: skip
    spy = pg.spawn(f"py-spy-{pid}", argv)
    w = window(port, pid, args)
    spy.popen.wait(timeout=seconds + 30)
    ms_per_req = w["server_cpu"] / max(w["requests"], 1) * 1e3
    return f"{label} ({out}):\n" + hot_spots(out.read_text(), ms_per_req, top=30)


def perf_profile(
    pg: ProcessGroup, label: str, pid: int, port: int, args: argparse.Namespace
) -> str:
    """`perf record` (native frames: gRPC's Cython core, CPython, protobuf) over one more
    window of `label` under load; the top symbols by self time."""
    out_dir = args.profile_dir or pg.run_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"perf-{pid}.data"
    seconds = math.ceil(args.warmup + args.seconds)
    argv = ["perf", "record", "-F", "499", "-g", "-p", str(pid), "-o", str(out)]
    argv += ["--", "sleep", str(seconds)]
    rec = pg.spawn(f"perf-{pid}", argv)
    w = window(port, pid, args)
    rec.popen.wait(timeout=seconds + 60)
    report = subprocess.run(
        ["perf", "report", "-i", str(out), "--no-children", "--sort", "dso,sym", "--stdio",
         "-g", "none", "--percent-limit", "0.7"],
        capture_output=True, text=True, check=False,
    ).stdout  # fmt: skip
    ms_per_req = w["server_cpu"] / max(w["requests"], 1) * 1e3
    lines = [ln for ln in report.splitlines() if ln.strip() and not ln.startswith("#")]
    return f"{label} perf ({out}), {ms_per_req:.3f} ms CPU/req:\n" + "\n".join(lines[:45])


def idle_rate(pid: int, seconds: float) -> float:
    c0, t0 = cpu_seconds(pid), time.perf_counter()
    time.sleep(seconds)
    return (cpu_seconds(pid) - c0) / (time.perf_counter() - t0)


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_client"]:
        client_main(argv[1:])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="measured seconds per window")
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument(
        "--rate",
        type=float,
        default=0.0,
        metavar="REQ_PER_S",
        help="offer this many requests per second to every server (default: as fast as "
        "each answers); the same rate for all compares them at the same batching",
    )
    ap.add_argument("--baseline", type=Path, action="append", default=[], metavar="CHECKOUT")
    ap.add_argument("--epp-arg", action="append", default=[], metavar="FLAG")
    ap.add_argument("--py-spy", metavar="BIN", help="then profile each server under load")
    ap.add_argument("--perf", action="store_true", help="then `perf record` each server")
    ap.add_argument("--profile-dir", type=Path, help="keep the raw profiles here")
    ap.add_argument(
        "--response-chunks",
        type=int,
        default=0,
        metavar="N",
        help="compare --response-path on vs observer with N response chunks per request",
    )
    args = ap.parse_args(argv)
    if args.response_chunks < 0:
        ap.error("--response-chunks must be >= 0")
    if args.rate < 0:
        ap.error("--rate must be >= 0 requests per second (0: as fast as each server answers)")
    started = time.monotonic()
    with ProcessGroup() as pg:
        _, hostports = start_sims(pg, SIM_ARGS)
        servers: list[tuple[str, int, int, bool]] = []  # label, pid, port, scrapes
        paths: dict[str, str] = {}  # label → the response path the client plays
        if args.response_chunks:
            for mode in ("on", "observer"):
                pid, port, _ = start_epp(pg, hostports, f"epp-{mode}", mode, extra=args.epp_arg)
                label = f"epp serve --response-path {mode}, {args.response_chunks} chunks"
                servers.append((label, pid, port, True))
                paths[label] = mode
        else:
            pid, port, _ = start_minimal(pg, hostports[0])
            servers.append(("minimal ext_proc", pid, port, False))
            pid, port, _ = start_epp(pg, hostports, extra=args.epp_arg)
            servers.append(("epp serve (this checkout)", pid, port, True))
        for i, checkout in enumerate(args.baseline):
            pid, port, _ = start_epp(
                pg, hostports, f"epp{i}", checkout=checkout.resolve(), extra=args.epp_arg
            )
            servers.append((f"epp serve ({checkout})", pid, port, True))
        results: dict[str, list[dict]] = {s[0]: [] for s in servers}
        idles: dict[str, list[float]] = {s[0]: [] for s in servers}
        for r in range(args.rounds):
            order = servers[r % len(servers) :] + servers[: r % len(servers)]
            for label, pid, port, _ in order:
                idles[label].append(idle_rate(pid, min(args.seconds, 3.0)))
                w = window(port, pid, args, paths.get(label, "none"))
                results[label].append(w)
                print(
                    f"round {r + 1}: {label}: {w['requests'] / w['elapsed']:.0f} req/s, "
                    f"{w['server_cpu'] / max(w['requests'], 1) * 1e3:.3f} ms CPU/req, "
                    f"errors {w['errors']} {w['first_error']}, machine "
                    f"{w['machine_cpu'] / w['elapsed']:.2f} CPUs",
                    flush=True,
                )
        profiles = [profile(pg, s[0], s[1], s[2], args) for s in servers] if args.py_spy else []
        if args.perf:
            profiles += [perf_profile(pg, s[0], s[1], s[2], args) for s in servers]
    print(
        f"\n`python bench/extproc_cpu.py {' '.join(argv)}`: {args.rounds} rounds of "
        f"{args.seconds:g} s, concurrency {args.concurrency}, medians\n"
    )
    print("| server | req/s | CPU ms/req | net of idle ms/req | idle ms CPU/s | vs the first row |")
    print("|---|---:|---:|---:|---:|---:|")
    base = None
    for label, *_ in servers:
        ws = results[label]
        per = statistics.median(w["server_cpu"] / max(w["requests"], 1) * 1e3 for w in ws)
        net = statistics.median(
            (w["server_cpu"] - idle * w["elapsed"]) / max(w["requests"], 1) * 1e3
            for w, idle in zip(ws, idles[label], strict=True)
        )
        rate = statistics.median(w["requests"] / w["elapsed"] for w in ws)
        idle = statistics.median(idles[label]) * 1e3
        base = base or per
        print(f"| {label} | {rate:.0f} | {per:.3f} | {net:.3f} | {idle:.0f} | {per / base:.2f}x |")
    for text in profiles:
        print("\n" + text)
    print(f"\nwhole run {time.monotonic() - started:.0f} s; pid of this run {os.getpid()}")


if __name__ == "__main__":
    main()
