"""Routing on REAL vLLM servers: shared-prefix chats through Envoy, per-setup nonce.

    .venv/bin/epp bench routing --real-vllm                    # 3 servers, 4 setups
    .venv/bin/epp bench routing --real-vllm --servers 2 --requests 60

Needs the real-vLLM tier's environment (`make test-vllm` installs `.venv-vllm` and the
tiny model). The servers (`scripts/vllm/serve.py`, block size 32, prefix caching, KV
events to one socket) start once — 2-3 minutes — and serve every setup; each setup puts
a fresh nonce at the head of every prompt, so no setup's cache helps the next one.

Workload (seeded, the same order for every setup): `--groups` groups of users share a
long system prompt; each request is a chat [system, user question] with one of
`--questions` questions of its group, sent by `--concurrency` closed-loop clients,
`--output-tokens` tokens out. Each server's KV cache is cut to `--num-blocks` blocks
(`--num-gpu-blocks-override`), so the groups' prefixes fit in the pool when each
server keeps its own groups, but not all on one server: spreading a group re-prefills it.

Setups: `rr` Envoy ROUND_ROBIN alone; `epp-load` Envoy + EPP, queue + kv-cache scorers;
`epp-approx` config/prefix-weighted.yaml (prefix 3, queue 2, KV 2) with `tokenizer:`
the model directory;
`epp-precise` config/precise-prefix.yaml, the same tokenizer, bound where the servers
publish their KV events.

Reported per setup: the pool's prefix-cache hit rate (sum over servers of the deltas of
`vllm:prefix_cache_hits_total` / `vllm:prefix_cache_queries_total`, tokens), against the
workload's IDEAL: one server with an unbounded cache, i.e. each request hits the longest
whole-block prefix it shares with any earlier request, minus vLLM's last-token rule
(computed with the EPP's own tokenization of the same chats); latency p50/p90 of whole
requests; errors.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import aiohttp

from epp.harness.envoy import EnvoyOptions, render_direct, start_envoy
from epp.harness.localstack import start_epp_behind_envoy
from epp.harness.procs import HttpReady, ProcessGroup, free_port, wait_ready
from epp.prompt_tokens import encode_request
from epp.request import new_request, parse_body
from epp.tokenizer import HFTokenizer

ROOT = Path(__file__).resolve().parents[1]
SERVE = ROOT / "scripts" / "vllm" / "serve.py"
SETUPS = ["rr", "epp-load", "epp-approx", "epp-precise"]
LABELS = {
    "rr": "(a) Envoy round-robin",
    "epp-load": "(b) EPP load (queue+kv)",
    "epp-approx": "(c) EPP approx prefix, model tokenizer",
    "epp-precise": "(d) EPP precise prefix, model tokenizer",
}
BLOCK = 32
MODEL = "tiny"
LOAD_CONFIG = (ROOT / "config" / "load-only.yaml").read_text()
COUNTER_RE = re.compile(
    r"^(vllm:prefix_cache_hits_total|vllm:prefix_cache_queries_total)(?:\{[^}]*\})?\s+(\S+)",
    re.MULTILINE,
)
TEXT_SOURCE = (
    "The endpoint picker sends each request to the model server that already holds the "
    "longest prefix of its prompt in its key value cache and weighs that against the "
    "queue and the cache pressure of every candidate before it answers the proxy. "
)
TEXT = TEXT_SOURCE.split(" ")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="epp bench routing --real-vllm", description=__doc__)
    p.add_argument("--setups", default=",".join(SETUPS), help=f"comma list of {SETUPS}")
    p.add_argument("--servers", type=int, default=3)
    p.add_argument("--groups", type=int, default=6)
    p.add_argument("--questions", type=int, default=4)
    p.add_argument("--system-words", type=int, default=300, help="words per system prompt")
    p.add_argument("--requests", type=int, default=96, help="per setup")
    p.add_argument("--concurrency", type=int, default=3)
    p.add_argument("--output-tokens", type=int, default=4)
    p.add_argument("--num-blocks", type=int, default=64, help="KV blocks per server (x32 tokens)")
    p.add_argument(
        "--max-model-len",
        type=int,
        default=1024,
        help="at most (num-blocks - 1) x 32: vLLM keeps one block back and refuses to start",
    )
    p.add_argument("--run-dir", help="keep the servers' logs here (default: a temporary dir)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    p.add_argument("--model-dir", default=str(ROOT / ".venv-vllm" / "models" / "tiny-llama"))
    p.add_argument("--startup-timeout", type=float, default=900.0)
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args(argv)
    args.setups = [s for s in args.setups.split(",") if s]
    bad = [s for s in args.setups if s not in SETUPS]
    if bad:
        p.error(f"unknown setups {bad}; known: {SETUPS}")
    if args.max_model_len > (args.num_blocks - 1) * BLOCK:
        p.error(
            f"--max-model-len {args.max_model_len} needs more than --num-blocks {args.num_blocks}"
        )
    if not Path(args.python).is_file():
        p.error(f"no vLLM python at {args.python}: run `make test-vllm` first")
    if not (Path(args.model_dir) / "tokenizer.json").is_file():
        p.error(f"no model at {args.model_dir}: run `make test-vllm` first")
    return args


def workload(args: argparse.Namespace, nonce: str) -> list[dict]:
    """Chat bodies; the same sequence for every setup but for the nonce."""
    rng = random.Random(args.seed)
    systems = [
        f"[{nonce}] group {g}: " + " ".join(rng.choice(TEXT) for _ in range(args.system_words))
        for g in range(args.groups)
    ]
    questions = [
        [f"question {q} of group {g}: " + " ".join(rng.choice(TEXT) for _ in range(12))
         for q in range(args.questions)]
        for g in range(args.groups)
    ]  # fmt: skip
    bodies = []
    for _ in range(args.requests):
        g, q = rng.randrange(args.groups), rng.randrange(args.questions)
        messages = [
            {"role": "system", "content": systems[g]},
            {"role": "user", "content": questions[g][q]},
        ]
        bodies.append({"model": MODEL, "messages": messages, "max_tokens": args.output_tokens})
    return bodies


def ideal_hit_rate(bodies: list[dict], tok: HFTokenizer) -> float:
    """Hits / prompt tokens with one unbounded cache (whole blocks, last token computed)."""
    seen: set[tuple[int, ...]] = set()
    hits = total = 0
    for body in bodies:
        req = parse_body(new_request({}, "/v1/chat/completions", "POST"), json.dumps(body).encode())
        ids = encode_request(req, tok)
        n_blocks = 0
        for b in range((len(ids) - 1) // BLOCK):
            if tuple(ids[: (b + 1) * BLOCK]) in seen:
                n_blocks = b + 1
            else:
                break
        for b in range(len(ids) // BLOCK):
            seen.add(tuple(ids[: (b + 1) * BLOCK]))
        hits += n_blocks * BLOCK
        total += len(ids)
    return hits / total if total else 0.0


def start_servers(pg: ProcessGroup, args: argparse.Namespace, kv_port: int) -> list[int]:
    """All servers boot in parallel; wait for each in turn."""
    procs = []
    for i in range(args.servers):
        port = free_port()
        argv = [
            args.python, str(SERVE), "--model", args.model_dir, "--served-model-name", MODEL,
            "--port", str(port), "--block-size", str(BLOCK), "--max-num-seqs", "16",
            "--max-model-len", str(args.max_model_len), "--kv-events", f"tcp://127.0.0.1:{kv_port}",
            "--cpus", str(i % max(1, os.cpu_count() or 1)),
            "--", "--num-gpu-blocks-override", str(args.num_blocks),
        ]  # fmt: skip
        procs.append((port, pg.spawn(f"vllm-{i}", argv)))
    for port, proc in procs:
        wait_ready(proc, HttpReady(f"http://127.0.0.1:{port}/health"), args.startup_timeout)
    return [port for port, _ in procs]


def config_for(setup: str, tmp: Path, args: argparse.Namespace, kv_port: int) -> Path:
    path = tmp / f"{setup}.yaml"
    if setup == "epp-load":
        path.write_text(LOAD_CONFIG)
    elif setup == "epp-approx":
        # The weighted blend (prefix 3, queue 2, KV 2), as measured in docs/BENCHMARKS.md.
        text = (ROOT / "config" / "prefix-weighted.yaml").read_text()
        anchor = "- type: approx-prefix-cache-producer\n  parameters:\n"
        assert anchor in text, "config/prefix-weighted.yaml changed shape"
        text = text.replace(anchor, f"{anchor}    tokenizer: {args.model_dir}\n")
        path.write_text(text)
    else:
        text = (ROOT / "config" / "precise-prefix.yaml").read_text()
        text = text.replace("endpoint: tcp://*:5557", f"endpoint: tcp://127.0.0.1:{kv_port}")
        text = text.replace("tokenizer: simple", f"tokenizer: {args.model_dir}")
        text = re.sub(r"blockSizeTokens: \d+", f"blockSizeTokens: {BLOCK}", text)
        assert args.model_dir in text and str(kv_port) in text
        path.write_text(text)
    return path


async def counters(http: aiohttp.ClientSession, ports: list[int]) -> tuple[float, float]:
    hits = queries = 0.0
    for port in ports:
        async with http.get(f"http://127.0.0.1:{port}/metrics") as r:
            for name, value in COUNTER_RE.findall(await r.text()):
                if name.startswith("vllm:prefix_cache_hits"):
                    hits += float(value)
                else:
                    queries += float(value)
    return hits, queries


async def drive(url: str, ports: list[int], bodies: list[dict], args) -> dict:
    latencies: list[float] = []
    errors = 0
    queue = list(enumerate(bodies))
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
        h0, q0 = await counters(http, ports)

        async def client() -> None:
            nonlocal errors
            while queue:
                _, body = queue.pop(0)
                t0 = time.perf_counter()
                try:
                    async with http.post(url + "/v1/chat/completions", json=body) as r:
                        await r.read()
                        ok = r.status == 200
                except (TimeoutError, aiohttp.ClientError):
                    ok = False
                if ok:
                    latencies.append(time.perf_counter() - t0)
                else:
                    errors += 1

        t_start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(args.concurrency)))
        wall = time.perf_counter() - t_start
        await asyncio.sleep(1.0)  # counters are updated a moment after the replies
        h1, q1 = await counters(http, ports)
    lat = sorted(latencies)
    return {
        "hit_rate": (h1 - h0) / (q1 - q0) if q1 > q0 else None,
        "hits": h1 - h0,
        "queries": q1 - q0,
        "p50": statistics.median(lat) if lat else None,
        "p90": lat[min(len(lat) - 1, int(0.9 * len(lat)))] if lat else None,
        "req_s": len(lat) / wall if wall > 0 else 0.0,
        "errors": errors,
    }


def start_router(pg: ProcessGroup, setup: str, ports: list[int], tmp: Path, args, kv_port: int):
    if setup == "rr":
        options = EnvoyOptions(
            listener_port=free_port(), admin_port=free_port(), listen_address="127.0.0.1"
        )
        config = render_direct(options, [("127.0.0.1", p) for p in ports], "ROUND_ROBIN")
        return start_envoy(pg, options, config=config, timeout=60).url
    endpoints = [f"--endpoint=vllm-{i}=127.0.0.1:{p}" for i, p in enumerate(ports)]
    config = config_for(setup, tmp, args, kv_port)
    envoy, _ = start_epp_behind_envoy(pg, [*endpoints, "--config", str(config)])
    return envoy.url


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    tok = HFTokenizer(args.model_dir)
    rows = []
    kv_port = free_port()
    with ProcessGroup(args.run_dir, grace_s=20.0) as servers:
        t0 = time.monotonic()
        ports = start_servers(servers, args, kv_port)
        sys.stderr.write(f"{args.servers} vLLM servers ready in {time.monotonic() - t0:.0f} s\n")
        for setup in args.setups:
            nonce = uuid.uuid4().hex[:12]
            bodies = workload(args, nonce)
            ideal = ideal_hit_rate(bodies, tok)
            with tempfile.TemporaryDirectory() as tmp, ProcessGroup() as pg:
                url = start_router(pg, setup, ports, Path(tmp), args, kv_port)
                if setup == "epp-precise":
                    time.sleep(2.0)  # the servers' PUB sockets reconnect to the new SUB
                row = asyncio.run(drive(url, ports, bodies, args))
            row.update(setup=setup, ideal=ideal)
            rows.append(row)
            sys.stderr.write(f"{time.strftime('%H:%M:%S')} {setup}: {row}\n")
    print(
        f"real vLLM (CPU, tiny Llama): {args.servers} servers x {args.num_blocks} blocks x "
        f"{BLOCK} tokens; {args.groups} groups x {args.questions} questions, system "
        f"{args.system_words} words, {args.requests} chat requests per setup, "
        f"concurrency {args.concurrency}, {args.output_tokens} output tokens\n"
    )
    print("| setup | pool hit rate | ideal | of ideal | p50 | p90 | req/s | errors |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        hit = "-" if r["hit_rate"] is None else f"{100 * r['hit_rate']:.1f} %"
        share = "-" if not r["hit_rate"] or not r["ideal"] else f"{r['hit_rate'] / r['ideal']:.2f}"
        p50 = "-" if r["p50"] is None else f"{r['p50'] * 1000:.0f} ms"
        p90 = "-" if r["p90"] is None else f"{r['p90'] * 1000:.0f} ms"
        print(
            f"| {LABELS[r['setup']]} | {hit} | {100 * r['ideal']:.1f} % | {share} | {p50} | "
            f"{p90} | {r['req_s']:.2f} | {r['errors']} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0
