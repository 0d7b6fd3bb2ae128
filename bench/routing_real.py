"""Routing on REAL vLLM servers: shared-prefix chats through each setup, per-setup nonce.

    .venv/bin/epp bench routing --real-vllm                    # 3 servers, every setup
    .venv/bin/epp bench routing --real-vllm --servers 2 --requests 60 --setups rr,epp-sticky

Needs the real-vLLM tier's environment (`make test-vllm` installs `.venv-vllm` and the
tiny model; `--python` / `--model-dir` point elsewhere) and, for the `vr-` setups,
vllm-router 0.1.17 in a venv of its own (`--router`). The servers (`scripts/vllm/serve.py`,
block size 32, prefix caching, `--enable-scale-out` for the render routes vllm-router
calls, each publishing its KV events on a port it binds) start once — 2-10 minutes — and
serve every setup; each setup puts a fresh nonce at the head of every prompt, so no
setup's cache helps the next one. `--repeat N` runs every setup N times, interleaved, and
reports the medians.

Workload (seeded, the same order for every setup): `--groups` groups of users share a
long system prompt; each request is a chat [system, user question] with one of
`--questions` questions of its group, sent by `--concurrency` closed-loop clients,
`--output-tokens` tokens out. Each server's KV cache is cut to `--num-blocks` blocks
(`--num-gpu-blocks-override`), so the groups' prefixes fit in the pool when each
server keeps its own groups, but not all on one server: spreading a group re-prefills it.

Setups: `rr` Envoy ROUND_ROBIN alone; `epp-load` Envoy + EPP, queue + kv-cache scorers;
`epp-approx` config/prefix-weighted.yaml (prefix 3, queue 2, KV 2) with `tokenizer:`
the model directory; `epp-sticky` config/prefix-aware.yaml (the shipped default, "sticky
until saturated"), the same tokenizer; `epp-precise` config/precise-prefix.yaml (the
default's shape on the precise index) and `epp-precise-weighted` config/precise-weighted.yaml
(llm-d's blend), both in connect mode (the EPP dials every server's publisher), the same
tokenizer; `vr-cache` /
`vr-kv` vllm-router `--policy cache_aware` / `kv_aware` over the same servers (no Envoy),
kv_aware fed by every server's KV events re-published under the empty topic
(bench/routing_vr.py `EmptyTopicRelay`: vllm-router 0.1.17 reads only that topic, the
EPP needs llm-d's `kv@host:port@model`, and a vLLM server has one topic).

Reported per setup: the pool's prefix-cache hit rate (sum over servers of the deltas of
`vllm:prefix_cache_hits_total` / `vllm:prefix_cache_queries_total`, tokens), against the
workload's IDEAL: one server with an unbounded cache, i.e. each request hits the longest
whole-block prefix it shares with any earlier request, minus vLLM's last-token rule
(computed with the EPP's own tokenization of the same chats); latency p50/p90 of whole
requests; errors; for vllm-router its own prefix-routing decisions by outcome.
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
from contextlib import ExitStack
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: the bench package beside it
    sys.path.insert(0, str(ROOT))

from bench import routing_vr  # noqa: E402
from epp.harness.envoy import EnvoyOptions, render_direct, start_envoy  # noqa: E402
from epp.harness.localstack import start_epp_behind_envoy  # noqa: E402
from epp.harness.procs import HttpReady, ProcessGroup, free_port, free_port_range, wait_ready  # noqa: E402
from epp.prompt_tokens import encode_request  # noqa: E402
from epp.request import new_request, parse_body  # noqa: E402
from epp.tokenizer import HFTokenizer  # noqa: E402

SERVE = ROOT / "scripts" / "vllm" / "serve.py"
SETUPS = [
    "rr",
    "epp-load",
    "epp-approx",
    "epp-sticky",
    "epp-precise",
    "epp-precise-weighted",
    "vr-cache",
    "vr-kv",
]
LABELS = {
    "rr": "(a) Envoy round-robin",
    "epp-load": "(b) EPP load (queue+kv)",
    "epp-approx": "(c) EPP approx prefix (weighted blend), model tokenizer",
    "epp-sticky": "(e) EPP sticky until saturated (default), model tokenizer",
    "epp-precise": "(d) EPP precise prefix, sticky shape, model tokenizer",
    "epp-precise-weighted": "(d') EPP precise prefix, weighted blend, model tokenizer",
    "vr-cache": "(f) vllm-router cache_aware",
    "vr-kv": "(f) vllm-router kv_aware (KV events)",
}
# vLLM 0.32 registers its render routes (`/v1/completions/render`, `/v1/chat/completions/
# render`), which vllm-router asks for token ids, only with this flag
# (vllm/entrypoints/scale_out/factories.py: `register_scale_out_api_routers`).
VLLM_EXTRA = ["--enable-scale-out"]
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
# vllm-router's start and counters, shared with the simulator bench (bench/routing_vr.py).
VR = routing_vr


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
    p.add_argument("--router", default="/tmp/vr-venv/bin/vllm-router", help="vllm-router binary")
    p.add_argument("--repeat", type=int, default=1, help="runs per setup (interleaved); medians")
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
    if any(s.startswith("vr-") for s in args.setups) and not Path(args.router).is_file():
        p.error(f"no vllm-router at {args.router}: pip install vllm-router==0.1.17 in its own venv")
    if args.repeat < 1:
        p.error(f"--repeat must be >= 1, got {args.repeat}")
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


def server_argv(args: argparse.Namespace, i: int, port: int, kv_port: int) -> list[str]:
    """Server i: its KV events on a PUB socket it binds itself (`tcp://*:kv_port`), under
    llm-d's topic `kv@127.0.0.1:<port>@tiny` (scripts/vllm/serve.py's default). Bound
    publishers let every subscriber dial them: the EPP's precise producer in connect mode
    and, through `EmptyTopicRelay`, vllm-router's `--kv-event-source`s."""
    return [
        args.python, str(SERVE), "--model", args.model_dir, "--served-model-name", MODEL,
        "--port", str(port), "--block-size", str(BLOCK), "--max-num-seqs", "16",
        "--max-model-len", str(args.max_model_len), "--kv-events", f"tcp://*:{kv_port}",
        "--cpus", str(i % max(1, os.cpu_count() or 1)),
        "--", "--num-gpu-blocks-override", str(args.num_blocks), *VLLM_EXTRA,
    ]  # fmt: skip


def start_servers(pg: ProcessGroup, args: argparse.Namespace) -> list[tuple[int, int]]:
    """All servers boot in parallel; wait for each in turn. [(HTTP port, KV-events port)]."""
    kv_base = free_port_range(args.servers)
    procs = []
    for i in range(args.servers):
        port = free_port()
        argv = server_argv(args, i, port, kv_base + i)
        procs.append((port, kv_base + i, pg.spawn(f"vllm-{i}", argv)))
    for port, _, proc in procs:
        wait_ready(proc, HttpReady(f"http://127.0.0.1:{port}/health"), args.startup_timeout)
    return [(port, kv_port) for port, kv_port, _ in procs]


def with_tokenizer(text: str, model_dir: str) -> str:
    """An approximate-prefix config with `tokenizer:` the model directory (its chat
    template renders the chats as the servers do)."""
    anchor = "- type: approx-prefix-cache-producer\n  parameters:\n"
    if anchor not in text:
        raise ValueError("no approx-prefix-cache-producer with parameters in the config")
    return text.replace(anchor, f"{anchor}    tokenizer: {model_dir}\n")


def precise_connect(text: str, model_dir: str) -> str:
    """config/precise-prefix.yaml in connect mode (the EPP dials every server's bound
    publisher, port from each endpoint's `epp.kv-events-port` label), the model's
    tokenizer and the servers' block size."""
    bind = "mode: bind\n    endpoint: tcp://*:5557\n"
    if bind not in text or "tokenizer: simple" not in text:
        raise ValueError("config/precise-prefix.yaml changed shape")
    text = text.replace(bind, "mode: connect\n")
    text = text.replace("tokenizer: simple", f"tokenizer: {model_dir}")
    return re.sub(r"blockSizeTokens: \d+", f"blockSizeTokens: {BLOCK}", text)


CONFIG_FILES = {
    "epp-approx": "prefix-weighted.yaml",  # the weighted blend (prefix 3, queue 2, KV 2)
    "epp-sticky": "prefix-aware.yaml",  # the shipped default (config/default.yaml)
    "epp-precise": "precise-prefix.yaml",  # the default's shape on the precise index
    "epp-precise-weighted": "precise-weighted.yaml",  # llm-d's blend (prefix 3, queue 2, KV 2)
}


def config_for(setup: str, tmp: Path, args: argparse.Namespace) -> Path:
    path = tmp / f"{setup}.yaml"
    if setup == "epp-load":
        path.write_text(LOAD_CONFIG)
        return path
    text = (ROOT / "config" / CONFIG_FILES[setup]).read_text()
    if setup.startswith("epp-precise"):
        path.write_text(precise_connect(text, args.model_dir))
    else:
        path.write_text(with_tokenizer(text, args.model_dir))
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


def start_router(
    stack: ExitStack,
    pg: ProcessGroup,
    setup: str,
    pool: list[tuple[int, int]],
    tmp: Path,
    args: argparse.Namespace,
) -> str:
    """`setup`'s proxy in front of the pool (its URL); a KV-events relay, if any, lives
    as long as `stack`."""
    ports = [port for port, _ in pool]
    if setup == "rr":
        options = EnvoyOptions(
            listener_port=free_port(), admin_port=free_port(), listen_address="127.0.0.1"
        )
        config = render_direct(options, [("127.0.0.1", p) for p in ports], "ROUND_ROBIN")
        return start_envoy(pg, options, config=config, timeout=60).url
    if setup.startswith("vr-"):
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        sources = None
        if setup == "vr-kv":
            relay = stack.enter_context(
                VR.EmptyTopicRelay([f"tcp://127.0.0.1:{k}" for _, k in pool])
            )
            sources = relay.addresses
        return VR.start_router(pg, args.router, setup, urls, 120.0, sources, BLOCK, MODEL)
    endpoints = [f"--endpoint=vllm-{i}=127.0.0.1:{p}" for i, p in enumerate(ports)]
    if setup.startswith("epp-precise"):
        endpoints = [
            f"{e};epp.kv-events-port={k}" for e, (_, k) in zip(endpoints, pool, strict=True)
        ]
    config = config_for(setup, tmp, args)
    envoy, _ = start_epp_behind_envoy(pg, [*endpoints, "--config", str(config)])
    return envoy.url


def run_setup(setup: str, pool: list[tuple[int, int]], args: argparse.Namespace) -> dict:
    """One setup over the shared pool, with a fresh nonce; its row."""
    tok = HFTokenizer(args.model_dir)
    bodies = workload(args, uuid.uuid4().hex[:12])
    ideal = ideal_hit_rate(bodies, tok)
    ports = [port for port, _ in pool]
    with tempfile.TemporaryDirectory() as tmp, ProcessGroup() as pg, ExitStack() as stack:
        url = start_router(stack, pg, setup, pool, Path(tmp), args)
        if setup.startswith("epp-precise") or setup == "vr-kv":
            time.sleep(2.0)  # the subscribers' sockets reach the servers' publishers
        row = asyncio.run(drive(url, ports, bodies, args))
        if setup.startswith("vr-"):  # did it route on prefixes? (its own counters)
            row["router_decisions"] = VR.decisions(url)
    row.update(setup=setup, ideal=ideal)
    return row


MEDIAN_KEYS = ("hit_rate", "ideal", "of_ideal", "p50", "p90", "req_s")


def median_row(runs: list[dict]) -> dict:
    """One setup's runs → their medians (None where no run has the figure); errors summed."""
    row = dict(runs[0])
    for key in MEDIAN_KEYS:
        vals = [r[key] for r in runs if r.get(key) is not None]
        row[key] = statistics.median(vals) if vals else None
    row["errors"] = sum(r["errors"] for r in runs)
    row["runs"] = len(runs)
    return row


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    runs: dict[str, list[dict]] = {setup: [] for setup in args.setups}
    with ProcessGroup(args.run_dir, grace_s=20.0) as servers:
        t0 = time.monotonic()
        pool = start_servers(servers, args)
        sys.stderr.write(f"{args.servers} vLLM servers ready in {time.monotonic() - t0:.0f} s\n")
        for k in range(args.repeat):  # interleaved: every setup once per round
            for setup in args.setups:
                try:
                    row = run_setup(setup, pool, args)
                except Exception as e:  # one setup that fails to start must not end the run
                    sys.stderr.write(f"{setup} run {k + 1} failed: {type(e).__name__}: {e}\n")
                    continue
                row["of_ideal"] = row["hit_rate"] / row["ideal"] if row["hit_rate"] else None
                runs[setup].append(row)
                sys.stderr.write(f"{time.strftime('%H:%M:%S')} {setup} run {k + 1}: {row}\n")
    rows = [median_row(runs[setup]) for setup in args.setups if runs[setup]]
    print(
        f"real vLLM (CPU, tiny Llama): {args.servers} servers x {args.num_blocks} blocks x "
        f"{BLOCK} tokens; {args.groups} groups x {args.questions} questions, system "
        f"{args.system_words} words, {args.requests} chat requests per setup, "
        f"concurrency {args.concurrency}, {args.output_tokens} output tokens; "
        f"median of {args.repeat} run(s)\n"
    )
    print("| setup | pool hit rate | ideal | of ideal | p50 | p90 | req/s | errors |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        hit = "-" if r["hit_rate"] is None else f"{100 * r['hit_rate']:.1f} %"
        share = "-" if r["of_ideal"] is None else f"{r['of_ideal']:.2f}"
        p50 = "-" if r["p50"] is None else f"{r['p50'] * 1000:.0f} ms"
        p90 = "-" if r["p90"] is None else f"{r['p90'] * 1000:.0f} ms"
        print(
            f"| {LABELS[r['setup']]} | {hit} | {100 * r['ideal']:.1f} % | {share} | {p50} | "
            f"{p90} | {r['req_s']:.2f} | {r['errors']} |"
        )
    for setup in args.setups:  # vllm-router: did it route on prefixes? per run
        if setup.startswith("vr-"):
            print(f"\n{setup}: vllm-router decisions per run:")
            for r in runs[setup]:
                print(f"  {r.get('router_decisions')}")
    if args.json:
        Path(args.json).write_text(json.dumps({"median": rows, "runs": runs}, indent=2))
    return 0
