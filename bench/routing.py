"""Routing on named workloads: Envoy alone, the EPP's scorers, vllm-router.

`--scenario NAME` picks a workload with its own defaults (`SCENARIOS`: one-prefix,
many-groups, zero-reuse, decode-bound, long-context, kv-pressure, multi-turn, and
mooncake: the Mooncake trace replayed, bench/routing_trace.py); `--matrix
a,b,...` runs several one after the other and ends with every setup's ratio to
round-robin and the new default's verdict (bench/routing_matrix.py). The default scenario,
many-groups, is a scaled-down copy of llm-d's "73% capacity" benchmark (llm-d-kv-cache
`benchmarking/73-capacity`): groups of users share a long system prompt, each asks one of
a few questions; Poisson arrivals whose rate rises in stages; the groups' prefixes fill
about 6x one server's KV cache (~75 % of the pool's), so a router that spreads a group
over the pool keeps re-prefilling it while one that keeps each group on one server hits.

Every setup gets a fresh pool: ONE `epp sim --replicas 8` process with the calibrated
`llama-3.1-8b-h100` preset (KV cache shrunk by `--kv-tokens`, see below) and the same
seeded request sequence, sent through:

- `rr` / `lr`: a real Envoy alone, ROUND_ROBIN / LEAST_REQUEST (`render_direct`);
- `epp-load`: Envoy + `epp serve`, queue-scorer + kv-cache-utilization-scorer (weights
  1/1, llm-d's "load" configuration);
- `epp-approx`: Envoy + `epp serve --config config/prefix-weighted.yaml` (the weighted
  blend, prefix 3 + queue 2 + KV 2);
- `epp-sticky`: Envoy + `epp serve --config config/prefix-aware.yaml` ("sticky until
  saturated": affinity filter on live load, token-load scorer, prefix tie-break);
- `epp-precise`: Envoy + `epp serve` with config/precise-prefix.yaml's scorers, the
  producer bound on a free port that every simulator publishes its KV events to;
- `epp-rr` / `epp-random`: Envoy + `epp serve` with no scorers and `round-robin-picker`
  (config/epp-rr.yaml) / `random-picker`: the EPP hop with cache-blind placement, so
  `rr` vs `epp-rr` is the hop's cost and `epp-rr` vs `epp-sticky` the placement's;
- `NAME@K` (e.g. `epp-approx@2`): an EPP setup with K `epp serve` replicas behind the one
  Envoy (active-active, `start_epps_behind_envoy`); each keeps its own approximate index,
  and `epp-precise@K` runs the producer in connect mode: every simulator replica binds its
  own KV-events port and every EPP dials all of them (so `epp-precise@1` is the same
  delivery with one EPP); with K > 1 the replicas also share their speculative entries
  (`speculativeSyncBind`/`speculativeSyncPeers`, one config per replica);
  `epp-precise-nosync@K` is the same without that sharing (each replica's own entries only);
- `NAME-obs` (e.g. `epp-sticky-obs`): an EPP setup with the response measured on Envoy's
  observability-mode filter (`--response-path observer`, deploy/envoy/envoy-observer.yaml)
  instead of in Envoy's path, so the two run side by side in one invocation;
- `vr-cache` / `vr-kv` / `vr-p2`: vllm-router (`pip install vllm-router` into a separate
  venv, `--router` gives its binary; skipped when absent) with `--policy cache_aware` /
  `kv_aware` (fed by every simulator's KV events) / `power_of_two`, over the same 8 URLs
  (no Envoy: it is a proxy itself); bench/routing_vr.py, which also reads its prefix
  decisions from its metrics after the run.

Time scale: the simulator runs `--time-scale S` times faster than real time. On a 2-core
machine the limit is the CPU that Envoy, the EPP, the simulator and this client spend per
prompt token, not the model: an 8B model on an H100 prefills ~22k tokens/s per server,
more than this machine can push through a real proxy stack for 8 servers. So S < 1 (the
model runs slower than real time) lets a real rate the machine sustains saturate the
pool. Every time and rate reported is in MODEL time: times = measured x S, rates =
real rate / S, tokens/s = real tokens/s / S; the proxies' own CPU time is scaled by S
too, which makes it small.

    .venv/bin/epp bench routing                      # all setups, default stages
    .venv/bin/epp bench routing --setups rr,epp-precise --rates 20,60 --stage-s 10
    .venv/bin/epp bench routing --matrix all --stage-s 8 --warmup-s 4 --plot m.png
    .venv/bin/epp bench routing --real-vllm          # real vLLM servers instead (routing_real.py)
    .venv/bin/epp bench routing --virtual --matrix all   # placement only, virtual time

Per run, the simulators' and the EPP's CPU (cores, from /proc over the run) are recorded
too (`--scrape-interval`, `--scrape-max-interval` set the EPP's scraping).

Per stage (requests are assigned to the stage they arrive in): output tokens/s (tokens
received during the stage), TTFT p50/p90/p99 (first SSE chunk), prefix-cache hit rate
(sum over the servers of the deltas of `vllm:prefix_cache_hits_total` /
`vllm:prefix_cache_queries_total` over the stage), mean waiting queue (per-server
`vllm:num_requests_waiting` sampled every 0.25 s, averaged over samples and servers),
errors (non-200, no token, or timeout).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: the bench package beside it
    sys.path.insert(0, str(ROOT))

from epp.harness.envoy import EnvoyOptions, render_direct, start_envoy  # noqa: E402
from epp.harness.localstack import start_epp_behind_envoy  # noqa: E402
from epp.harness.procs import HttpReady, ProcessGroup, free_port, free_port_range  # noqa: E402

EPP_CMD = [sys.executable, "-m", "epp.cli"]
_WORDS = [f"{a}{b}{c}" for a in "bcdfgklmnprst" for b in "aeiou" for c in "bdgklmnprst"]
SETUPS = [
    "rr",
    "lr",
    "epp-load",
    "epp-approx",
    "epp-sticky",
    "epp-agent",
    "epp-precise",
    "epp-rr",
    "epp-random",
    "vr-cache",
    "vr-kv",
    "vr-p2",
]
LABELS = {
    "rr": "(a) Envoy round-robin",
    "lr": "(b) Envoy least-request",
    "epp-load": "(c) EPP load (queue+kv)",
    "epp-approx": "(d) EPP weighted blend (prefix-weighted)",
    "epp-sticky": "(g) EPP sticky until saturated (prefix-aware)",
    "epp-agent": "(g') EPP sticky, prefix matched over 64K tokens (agent.yaml)",
    "epp-precise": "(e) EPP precise prefix",
    "epp-rr": "(h) EPP round-robin picker (the hop alone)",
    "epp-random": "(h) EPP random picker",
    "vr-cache": "(f) vllm-router cache_aware",
    "vr-kv": "(f) vllm-router kv_aware (KV events)",
    "vr-p2": "(f) vllm-router power_of_two",
}
CONFIGS = {
    "epp-approx": "prefix-weighted.yaml",
    "epp-sticky": "prefix-aware.yaml",
    "epp-agent": "agent.yaml",
    "epp-rr": "epp-rr.yaml",
}
OBSERVER_SUFFIX = "-obs"  # epp-sticky-obs: epp-sticky with --response-path observer
REPLICA_ONLY = {"epp-precise-nosync"}  # setups that exist only as NAME@K
MATRIX_SETUPS = "rr,lr,epp-load,epp-approx,epp-sticky,epp-precise"

# Named workloads (`--scenario`, `--matrix`), each with its own defaults; explicit flags
# override them. Rates are model req/s around round-robin's knee on 8 servers (measured
# with `--setups rr`, docs/BENCHMARKS.md); time scales keep the wall-clock rate within
# what a 2-core machine pushes through Envoy + EPP + simulator + client.
SCENARIOS: dict[str, dict[str, object]] = {
    # The commonest production shape: one system prompt shared by all traffic.
    "one-prefix": dict(groups=1, questions=3000, system_tokens=2000, question_tokens=100),
    # llm-d "73% capacity", scaled: 48 groups' prefixes are ~6x one server's KV cache.
    "many-groups": dict(groups=48, questions=5, system_tokens=2000, question_tokens=200),
    # Every prompt unique: nothing to win by prefix, only balance.
    "zero-reuse": dict(groups=0, system_tokens=0, question_tokens=1000),
    # Short prompts, long outputs: the load is decode (llm-d's "reasoning" shape).
    "decode-bound": dict(
        groups=8,
        questions=50,
        system_tokens=100,
        question_tokens=50,
        output_tokens=128,
        kv_tokens=2048,  # ~7 sequences per server: the batch, not prefill, is the limit
        # requests last 128 steps: a slower time scale would make them outlast a stage
    ),
    # 8K+ prompts: prefill dominates, 16 groups of 8,000-token documents.
    "long-context": dict(
        groups=16,
        questions=5,
        system_tokens=8000,
        question_tokens=500,
        kv_tokens=32768,
    ),
    # Prefixes 1.5x the whole pool's KV cache (96 x 2,000 vs 8 x 16,384): evictions.
    "kv-pressure": dict(groups=96, questions=5, system_tokens=2000, question_tokens=200),
    # Sessions: each turn resends the whole conversation so far plus a new question.
    "multi-turn": dict(groups=64, turns=8, system_tokens=500, question_tokens=150),
    # Coding-agent sessions of 10-40 turns, each appending a 200-2,000-token tool result
    # (contexts grow to 10-60k tokens), half over /v1/messages (bench/routing_agent.py).
    "agent": dict(
        agent=True,
        groups=24,
        system_tokens=2000,
        output_tokens=50,
        kv_tokens=262144,
        time_scale=0.05,
    ),
    # KV pressure from a real trace: Mooncake's last requests replayed (bench/routing_trace.py),
    # 32 tokens per hash id; the pool's KV (8 x 16,384) holds half the distinct blocks of
    # the ~620 requests replayed with the default stages (3/4 with 10-s stages), so servers
    # evict. Time scale 0.15: 120 req/s of ~1,300-token prompts = 18 req/s of wall clock.
    "mooncake": dict(trace="mooncake", block_tokens=32, output_tokens=128, time_scale=0.15),
}
WORKLOAD_DEFAULTS: dict[str, object] = dict(
    groups=48,
    questions=5,
    turns=0,
    system_tokens=2000,
    question_tokens=200,
    output_tokens=50,
    kv_tokens=16384,
    time_scale=0.25,
    rates="25,50,75",
    trace=None,
    block_tokens=512,
    agent=False,
)
SCENARIO_RATES = {
    "one-prefix": "20,40,60",
    "many-groups": "25,50,75",
    "zero-reuse": "50,100,150",
    "decode-bound": "20,40,60",
    "long-context": "10,20,30",
    "kv-pressure": "25,50,75",
    "multi-turn": "30,60,90",
    "mooncake": "40,80,120",
    "agent": "4,8,12",
}
LOAD_CONFIG = (ROOT / "config" / "load-only.yaml").read_text()
RANDOM_CONFIG = """apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: random-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: random-picker
"""
METRIC_RE = re.compile(
    r"^(vllm:prefix_cache_hits_total|vllm:prefix_cache_queries_total|"
    r"vllm:num_requests_waiting)(?:\{[^}]*\})?\s+([0-9.eE+-]+)",
    re.MULTILINE,
)


# ---------------------------------------------------------------- workload


@dataclass(frozen=True)
class Req:
    at: float  # real seconds after the start
    stage: int  # -1 = warm-up
    prompt: str
    max_tokens: int | None = None  # a trace's own output length; None: --output-tokens
    # The `agent` scenario (bench/routing_agent.py): the request as a chat or Messages
    # body (the simulator's tokens are still `prompt`'s words), and the tokens of the
    # session's previous request (for the ideal hit rate).
    path: str = "/v1/completions"
    body: dict | None = None
    headers: dict | None = None
    previous: int = 0


def words(rng: random.Random, n: int) -> str:
    """n three-letter words: one token each for the simulator's tokenizer and 4 characters
    each (upstream's approximate estimate) for the EPP's character blocks."""
    return " ".join(rng.choice(_WORDS) for _ in range(n))


class Prompts:
    """The scenario's prompt source: shared prefixes (groups x questions), unique prompts
    (groups = 0), or sessions (turns > 0: a session's k-th request is its system prompt and
    its first k questions; after `turns` it starts over as a new session)."""

    def __init__(self, args: argparse.Namespace, rng: random.Random) -> None:
        self.args, self.rng = args, rng
        n = max(args.groups, 0)
        self.systems = [self.system(g) for g in range(n)]
        per = args.turns or args.questions
        self.questions = [
            [f"q{q:02d} " + words(rng, args.question_tokens - 1) for q in range(per)]
            for _ in range(n if not args.turns else 0)
        ]
        self.turn = [0] * n
        self.session = list(range(n))

    def system(self, g: int) -> str:
        if self.args.system_tokens <= 0:
            return ""
        return f"g{g:04d} " + words(self.rng, self.args.system_tokens - 1) + " "

    def next(self) -> str:
        a, rng = self.args, self.rng
        if a.groups <= 0:
            return f"u{rng.random():.12f} " + words(rng, a.question_tokens - 1)
        g = rng.randrange(a.groups)
        if not a.turns:
            return self.systems[g] + self.questions[g][rng.randrange(a.questions)]
        if self.turn[g] == a.turns:  # conversation over: a new one in this slot
            self.session[g] += a.groups
            self.systems[g] = self.system(self.session[g])
            self.turn[g] = 0
        self.turn[g] += 1
        turn_rng = random.Random(self.session[g])  # the same questions on every resend
        asked = [f"t{k} " + words(turn_rng, a.question_tokens - 1) for k in range(self.turn[g])]
        return self.systems[g] + " ".join(asked)


def workload(args: argparse.Namespace) -> list[Req]:
    if args.trace:  # a replayed trace (bench/routing_trace.py)
        return trace_module().workload(args, Req, words)
    rng = random.Random(args.seed)
    agents = agent_module().AgentPrompts(args, rng, words) if args.agent else None
    prompts = Prompts(args, rng)
    reqs, t = [], 0.0
    stages = [(-1, args.rates[0], args.warmup_s)] + [
        (k, rate, args.stage_s) for k, rate in enumerate(args.rates)
    ]
    for k, rate, length in stages:
        end = t + length
        real_rate = rate * args.time_scale
        while True:
            t += rng.expovariate(real_rate)
            if t >= end:
                t = end
                break
            if agents is not None:
                prompt, path, body, headers, previous = agents.next()
                reqs.append(Req(t, k, prompt, None, path, body, headers, previous))
            else:
                reqs.append(Req(t, k, prompts.next()))
    return reqs


def stage_bounds(args: argparse.Namespace) -> list[tuple[float, float]]:
    """Real [start, end) of each measured stage (after the warm-up)."""
    t = args.warmup_s
    bounds = []
    for _ in args.rates:
        bounds.append((t, t + args.stage_s))
        t += args.stage_s
    return bounds


# ---------------------------------------------------------------- client


@dataclass
class Result:
    stage: int
    ok: bool
    ttft: float | None = None
    tokens: int = 0
    at: float = 0.0  # real arrival, s after the start (which half of its stage)


@dataclass
class Run:
    setup: str
    results: list[Result] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)  # real arrival of every token
    metric_samples: list[tuple[float, dict[str, list[float]]]] = field(default_factory=list)


async def one(
    http: aiohttp.ClientSession, url: str, model: str, req: Req, out: int, t0: float, run: Run
) -> Result:
    out = req.max_tokens or out
    body = {"model": model, "prompt": req.prompt, "max_tokens": out, "stream": True}
    if req.body is not None:
        body = {"model": model, **req.body, "max_tokens": out, "stream": True}
    res = Result(req.stage, ok=False, at=req.at)
    start = time.perf_counter()
    try:
        async with http.post(url + req.path, json=body, headers=req.headers) as r:
            if r.status != 200:
                await r.read()
                return res
            async for line in r.content:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                now = time.perf_counter()
                if res.ttft is None:
                    res.ttft = now - start
                res.tokens += 1
                run.token_times.append(now - t0)
        res.ok = res.ttft is not None
    except (TimeoutError, aiohttp.ClientError):
        pass
    return res


async def scrape(http: aiohttp.ClientSession, urls: list[str]) -> dict[str, list[float]]:
    async def get(u: str) -> dict[str, float]:
        try:
            async with http.get(u + "/metrics") as r:
                text = await r.text()
        except (TimeoutError, aiohttp.ClientError):
            return {}
        values: dict[str, float] = {}
        for name, value in METRIC_RE.findall(text):
            values[name] = values.get(name, 0.0) + float(value)
        return values

    per = await asyncio.gather(*(get(u) for u in urls))
    names = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total")
    names += ("vllm:num_requests_waiting",)
    return {n: [p.get(n, float("nan")) for p in per] for n in names}


async def drive(
    setup: str, url: str, sim_urls: list[str], reqs: list[Req], args: argparse.Namespace
) -> Run:
    run = Run(setup)
    timeout = aiohttp.ClientTimeout(total=args.timeout_s)
    async with (
        aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as http,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as mhttp,
    ):
        t0 = time.perf_counter()
        end = reqs[-1].at if reqs else 0.0
        done = asyncio.Event()

        async def sampler() -> None:
            while not done.is_set():
                run.metric_samples.append((time.perf_counter() - t0, await scrape(mhttp, sim_urls)))
                await asyncio.sleep(args.sample_s)

        async def fire(req: Req) -> Result:
            await asyncio.sleep(max(0.0, t0 + req.at - time.perf_counter()))
            return await one(http, url, args.model, req, args.output_tokens, t0, run)

        sampling = asyncio.ensure_future(sampler())
        tasks = [asyncio.ensure_future(fire(r)) for r in reqs]
        await asyncio.sleep(max(0.0, t0 + end + args.sample_s - time.perf_counter()))
        run.metric_samples.append((time.perf_counter() - t0, await scrape(mhttp, sim_urls)))
        run.results = list(await asyncio.gather(*tasks))
        done.set()
        await sampling
    return run


# ---------------------------------------------------------------- statistics


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process (all its threads) so far, from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def counter_at(run: Run, t: float, name: str) -> float | None:
    """The summed counter at the last sample taken at or before real time t."""
    best = None
    for ts, values in run.metric_samples:
        if ts <= t + 1e-6:
            best = sum(values[name])
    return best


def summarize(run: Run, args: argparse.Namespace) -> list[dict]:
    s = args.time_scale
    rows = []
    for k, (a, b) in enumerate(stage_bounds(args)):
        res = [r for r in run.results if r.stage == k]
        ok = [r for r in res if r.ok]
        ttft = [r.ttft * s for r in ok if r.ttft is not None]
        tokens = sum(a <= t < b for t in run.token_times)
        h0, h1 = (counter_at(run, x, "vllm:prefix_cache_hits_total") for x in (a, b))
        q0, q1 = (counter_at(run, x, "vllm:prefix_cache_queries_total") for x in (a, b))
        hit = None
        if None not in (h0, h1, q0, q1) and q1 - q0 > 0:  # type: ignore[operator]
            hit = (h1 - h0) / (q1 - q0)  # type: ignore[operator]
        waits = [
            w
            for ts, values in run.metric_samples
            if a <= ts < b
            for w in values["vllm:num_requests_waiting"]
            if w == w
        ]
        rows.append(
            {
                "setup": run.setup,
                "rate": args.rates[k],
                "offered": len(res) / (args.stage_s * s),
                "requests": len(res),
                "tok_s": tokens / ((b - a) * s),
                "ttft_p50": pct(ttft, 0.5),
                "ttft_p90": pct(ttft, 0.9),
                "ttft_p99": pct(ttft, 0.99),
                "hit_rate": hit,
                "waiting": sum(waits) / len(waits) if waits else None,
                "errors": len(res) - len(ok),
                "output_tokens": args.output_tokens,
                **matrix_module().halves(
                    [(r.at, r.ttft * s) for r in ok if r.ttft is not None], (a + b) / 2
                ),
            }
        )
    return rows


def fmt_s(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v * 1000:.0f} ms" if v < 1 else f"{v:.2f} s"


def tables(rows: list[dict], rates: list[float]) -> str:
    out = []
    for rate in rates:
        out += [
            f"\n**{rate:g} req/s** (model time)\n",
            "| setup | offered req/s | output tok/s | TTFT p50 | TTFT p90 | TTFT p99 "
            "| prefix hit rate | mean waiting | errors |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in rows:
            if r["rate"] != rate:
                continue
            hit = "-" if r["hit_rate"] is None else f"{100 * r['hit_rate']:.1f} %"
            wait = "-" if r["waiting"] is None else f"{r['waiting']:.2f}"
            out.append(
                f"| {label(r['setup'])} | {r['offered']:.1f} | "
                f"{r['tok_s']:.0f} | {fmt_s(r['ttft_p50'])} | {fmt_s(r['ttft_p90'])} | "
                f"{fmt_s(r['ttft_p99'])} | {hit} | {wait} | {r['errors']} |"
            )
    return "\n".join(out)


def plot(rows: list[dict], path: str, args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for setup in dict.fromkeys(r["setup"] for r in rows):
        pts = [(r["rate"], r["ttft_p90"]) for r in rows if r["setup"] == setup and r["ttft_p90"]]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", label=label(setup))
    ax.set_yscale("log")
    ax.set_xlabel("request rate (req/s, model time)")
    ax.set_ylabel("TTFT p90 (s, model time)")
    title = (
        f"{args.trace} trace, {args.block_tokens} tokens per hash id"
        if args.trace
        else f"Shared prefix: {args.groups} groups x {args.system_tokens}-token system prompt"
    )
    ax.set_title(f"{title}, {args.servers} x sim {args.preset}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ---------------------------------------------------------------- setups


def start_sims(
    pg: ProcessGroup,
    args: argparse.Namespace,
    kv_port: int | None,
    kv_bind: bool = False,
    kv_extra: dict[str, object] | None = None,
) -> list[str]:
    """`kv_bind`: each replica binds KV-events port kv_port + i (connect mode);
    `kv_extra`: more keys of the KV-events config (vllm-router's empty topic)."""
    base = free_port_range(args.servers)
    argv = [*EPP_CMD, "sim", "--replicas", str(args.servers), "--port", str(base)]
    argv += ["--preset", args.preset, "--time-scale", str(args.time_scale)]
    argv += ["--kv-capacity-tokens", str(args.kv_tokens), "--max-model-len", str(args.kv_tokens)]
    argv += ["--name-prefix", "sim"]
    if kv_port is not None:
        cfg = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": f"tcp://{'*' if kv_bind else '127.0.0.1'}:{kv_port}",
            **(kv_extra or {}),
        }
        argv += ["--kv-events-config", json.dumps(cfg)]
    urls = [f"http://127.0.0.1:{base + i}" for i in range(args.servers)]
    pg.start("sims", argv, ready=HttpReady(urls[-1] + "/health"), timeout=90)
    return urls


def start_epp(
    pg: ProcessGroup,
    urls: list[str],
    config: Path,
    args: argparse.Namespace,
    n_epps: int = 1,
    kv_base: int | None = None,
    per_epp_configs: list[Path] | None = None,
) -> str:
    """`n_epps` replicas behind one Envoy; `kv_base`: label each endpoint with its own
    KV-events port (kv_base + i) for a connect-mode producer; `per_epp_configs`: replica
    i reads the i-th (instead of `config`)."""
    endpoints = [f"--endpoint=sim-{i}={u.removeprefix('http://')}" for i, u in enumerate(urls)]
    if kv_base is not None:
        endpoints = [f"{e};epp.kv-events-port={kv_base + i}" for i, e in enumerate(endpoints)]
    scrape = []  # None: the EPP's own defaults
    if args.scrape_interval is not None:
        scrape += ["--refresh-metrics-interval", str(args.scrape_interval)]
    if args.scrape_max_interval is not None:
        scrape += ["--refresh-metrics-max-interval", str(args.scrape_max_interval)]
    scrape += ["--metrics-staleness-threshold", str(args.staleness)]
    scrape += ["--scrape-timeout", str(args.scrape_timeout)]
    common = [] if per_epp_configs else ["--config", str(config)]
    envoy, _ = start_epp_behind_envoy(
        pg,
        [*endpoints, *common, *scrape],
        response_path=args.response_path,
        observer=args.response_path == "observer",
        n_epps=n_epps,
        per_epp_args=[["--config", str(c)] for c in per_epp_configs or ()],
    )
    return envoy.url


def precise_config(path: Path, kv_port: int, block_size: int) -> None:
    text = (ROOT / "config" / "precise-prefix.yaml").read_text()
    text = text.replace("endpoint: tcp://*:5557", f"endpoint: tcp://127.0.0.1:{kv_port}")
    text = re.sub(r"blockSizeTokens: \d+", f"blockSizeTokens: {block_size}", text)
    assert f"tcp://127.0.0.1:{kv_port}" in text
    path.write_text(text)


def connect_config(path: Path, block_size: int) -> None:
    """config/precise-prefix.yaml's producer in connect mode (several EPP replicas)."""
    text = (ROOT / "config" / "precise-prefix.yaml").read_text()
    text = text.replace("mode: bind\n    endpoint: tcp://*:5557\n", "mode: connect\n")
    text = re.sub(r"blockSizeTokens: \d+", f"blockSizeTokens: {block_size}", text)
    assert "mode: connect" in text
    path.write_text(text)


def sync_configs(tmp: Path, n: int, block_size: int) -> list[Path]:
    """`connect_config` for each of `n` replicas, sharing speculative entries: replica i
    publishes on its own loopback port and dials all of them (itself included)."""
    ports = [free_port() for _ in range(n)]
    peers = ", ".join(f'"tcp://127.0.0.1:{p}"' for p in ports)
    paths = []
    for i, port in enumerate(ports):
        base = tmp / "precise-connect.yaml"
        connect_config(base, block_size)
        text = base.read_text().replace(
            "    speculativeTTL: 2s\n",
            "    speculativeTTL: 2s\n"
            f"    speculativeSyncBind: tcp://127.0.0.1:{port}\n"
            f"    speculativeSyncPeers: [{peers}]\n",
        )
        assert "speculativeSyncBind" in text
        paths.append(tmp / f"precise-connect-sync-{i}.yaml")
        paths[-1].write_text(text)
    return paths


def start_setup(pg: ProcessGroup, setup: str, args: argparse.Namespace, tmp: Path):
    setup, n_epps = split_setup(setup)
    if setup.startswith("epp-") and setup.endswith(OBSERVER_SUFFIX):
        setup = setup.removesuffix(OBSERVER_SUFFIX)
        args = copy.copy(args)
        args.response_path = "observer"
    if n_epps is not None:  # NAME@K: K replicas (connect-mode KV events for precise)
        precise = setup in ("epp-precise", "epp-precise-nosync")
        kv_base = free_port_range(args.servers) if precise else None
        urls = start_sims(pg, args, kv_base, kv_bind=True)
        if setup == "epp-precise" and n_epps > 1:
            configs = sync_configs(tmp, n_epps, 16)  # the 8B preset's block size
            return start_epp(pg, urls, configs[0], args, n_epps, kv_base, configs), urls
        if setup == "epp-load":
            config = ROOT / "config" / "load-only.yaml"
        elif setup == "epp-random":
            config = tmp / "random.yaml"
            config.write_text(RANDOM_CONFIG)
        elif setup in CONFIGS:
            config = ROOT / "config" / CONFIGS[setup]
        else:
            config = tmp / "precise-connect.yaml"
            connect_config(config, 16)  # the 8B preset's block size
        return start_epp(pg, urls, config, args, n_epps, kv_base), urls
    if setup.startswith("vr-"):  # vllm-router: bench/routing_vr.py
        return vr_module().start(pg, setup, args, start_sims)
    kv_port = free_port() if setup == "epp-precise" else None
    urls = start_sims(pg, args, kv_port)
    if setup in ("rr", "lr"):
        options = EnvoyOptions(
            listener_port=free_port(), admin_port=free_port(), listen_address="127.0.0.1"
        )
        policy = "ROUND_ROBIN" if setup == "rr" else "LEAST_REQUEST"
        hosts = [("127.0.0.1", int(u.rsplit(":", 1)[1])) for u in urls]
        config = render_direct(options, hosts, policy)
        return start_envoy(pg, options, config=config, timeout=60).url, urls
    if setup.startswith("epp-"):
        if setup == "epp-load":
            config = tmp / "load.yaml"
            config.write_text(LOAD_CONFIG)
        elif setup == "epp-random":
            config = tmp / "random.yaml"
            config.write_text(RANDOM_CONFIG)
        elif setup in CONFIGS:
            config = ROOT / "config" / CONFIGS[setup]
        else:
            assert kv_port is not None
            config = tmp / "precise.yaml"
            precise_config(config, kv_port, 16)  # the 8B preset's block size
        return start_epp(pg, urls, config, args), urls
    raise AssertionError(f"no start for setup {setup}")


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="epp bench routing", description=__doc__.splitlines()[0])
    add_arguments(p)
    return finish_args(p, p.parse_args(argv))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.set_defaults(agent=None)  # set by the `agent` scenario only
    p.add_argument(
        "--setups", default=None, help=f"comma list of {SETUPS} (all; matrix: {MATRIX_SETUPS})"
    )
    p.add_argument(
        "--scenario",
        default="many-groups",
        choices=sorted(SCENARIOS),
        help="named workload whose defaults the flags below override (many-groups)",
    )
    p.add_argument(
        "--matrix",
        help="comma list of scenarios (or 'all') to run one after the "
        "other, each with its own defaults; prints ratios to round-robin",
    )
    p.add_argument("--repeat", type=int, default=1, help="runs per setup; medians reported (1)")
    p.add_argument("--rates", default=None, help="stage rates, model req/s (scenario's)")
    p.add_argument("--stage-s", type=float, default=15.0, help="REAL seconds per stage (15)")
    p.add_argument("--warmup-s", type=float, default=8.0, help="REAL seconds of warm-up (8)")
    p.add_argument("--time-scale", type=float, default=None, help="simulator --time-scale")
    p.add_argument("--groups", type=int, default=None, help="prefix groups; 0 = unique prompts")
    p.add_argument("--questions", type=int, default=None, help="questions per group")
    p.add_argument("--turns", type=int, default=None, help="> 0: multi-turn sessions")
    p.add_argument("--system-tokens", type=int, default=None)
    p.add_argument("--question-tokens", type=int, default=None)
    p.add_argument(
        "--trace-file",
        help="replay this Mooncake-format JSONL instead of ../shared/traces' "
        "(trace scenarios: mooncake)",
    )
    p.add_argument(
        "--block-tokens", type=int, default=None, help="trace scenarios: tokens per hash id"
    )
    p.add_argument("--output-tokens", type=int, default=None)
    p.add_argument("--servers", type=int, default=8)
    p.add_argument("--preset", default="llama-3.1-8b-h100")
    p.add_argument("--kv-tokens", type=int, default=None, help="KV cache per server, tokens")
    p.add_argument("--model", default="tiny")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--timeout-s", type=float, default=60.0, help="REAL client timeout")
    p.add_argument("--sample-s", type=float, default=0.25, help="REAL metrics sampling period")
    p.add_argument(
        "--scrape-interval",
        type=float,
        default=None,
        help="the EPP's --refresh-metrics-interval, REAL seconds (default: the EPP's)",
    )
    p.add_argument(
        "--staleness",
        type=float,
        default=2.0,
        help="the EPP's --metrics-staleness-threshold, REAL seconds (2.0); raise it and "
        "--scrape-timeout on a starved machine, where a simulator answering scrapes late "
        "makes the EPP see no healthy endpoint and answer 503",
    )
    p.add_argument(
        "--scrape-timeout", type=float, default=1.0, help="the EPP's --scrape-timeout (1.0)"
    )
    p.add_argument(
        "--scrape-max-interval",
        type=float,
        default=None,
        help="the EPP's --refresh-metrics-max-interval (0 = fixed; default: the EPP's)",
    )
    p.add_argument(
        "--response-path",
        choices=("log", "on", "off", "observer"),
        default="log",
        help="the EPP's response path (--response-path of epp serve, and Envoy's config to "
        "match): log, the default, Envoy's Lua filter and access log; on: every response "
        "chunk through the EPP; off: no TTFT/ITL observations and in-flight counts end at "
        "routing; observer: on Envoy's observability-mode filter (envoy-observer.yaml); a "
        "setup named NAME-obs uses it for that setup alone (log)",
    )
    p.add_argument("--router", default="/tmp/vr-venv/bin/vllm-router")
    p.set_defaults(trace=None)  # set by a trace scenario (SCENARIOS), not a flag
    p.add_argument("--json", help="write the summaries here")
    p.add_argument("--plot", help="write the TTFT p90 plot (PNG; matrix: the ratio grid) here")


def with_scenario(args: argparse.Namespace, name: str) -> argparse.Namespace:
    """`args` with the scenario's defaults filled in where no flag was given."""
    out = copy.copy(args)
    out.scenario = name
    values = {**WORKLOAD_DEFAULTS, "rates": SCENARIO_RATES[name], **SCENARIOS[name]}
    for key, value in values.items():
        if getattr(out, key) is None:
            setattr(out, key, value)
    out.rates = [float(r) for r in str(out.rates).split(",")]
    return out


def finish_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    args.setups = [
        s
        for s in str(args.setups or (MATRIX_SETUPS if args.matrix else ",".join(SETUPS))).split(",")
        if s
    ]
    bad = [s for s in args.setups if not _known_setup(s)]
    if bad:
        p.error(f"unknown setups {bad}; known: {SETUPS}")
    if args.matrix:
        names = sorted(SCENARIOS) if args.matrix == "all" else args.matrix.split(",")
        unknown = [n for n in names if n not in SCENARIOS]
        if unknown:
            p.error(f"unknown scenarios {unknown}; known: {sorted(SCENARIOS)}")
        args.matrix = names
    if args.repeat < 1:
        p.error("--repeat must be >= 1")
    return args


def label(setup: str) -> str:
    """The table's name for a setup (NAME-obs: NAME's, marked as observer)."""
    if setup in LABELS:
        return LABELS[setup]
    base = setup.removesuffix(OBSERVER_SUFFIX)
    if base != setup and base in LABELS:
        return LABELS[base] + ", response observed (envoy-observer.yaml)"
    return setup


def split_setup(setup: str) -> tuple[str, int | None]:
    """`epp-approx@2` → ("epp-approx", 2); a plain name → (name, None)."""
    base, at, k = setup.partition("@")
    return base, (int(k) if at else None)


def _known_setup(setup: str) -> bool:
    base, _, k = setup.partition("@")
    if base.startswith("epp-") and base.endswith(OBSERVER_SUFFIX):
        base = base.removesuffix(OBSERVER_SUFFIX)
    if not k:
        return base in SETUPS
    known = base in SETUPS or base in REPLICA_ONLY
    return base.startswith("epp-") and known and k.isdigit() and int(k) >= 1


START_ATTEMPTS = 2  # a free port taken by another process between probe and bind


def run_setup(setup: str, args: argparse.Namespace, reqs: list[Req]) -> list[dict] | str:
    """One fresh pool + setup, the workload through it; its rows, or why it did not start
    (after `START_ATTEMPTS` tries: on a shared machine a port found free can be taken
    before Envoy binds it)."""
    for attempt in range(START_ATTEMPTS):
        got = _run_setup_once(setup, args, reqs)
        if not isinstance(got, str):
            return got
        sys.stderr.write(f"  {setup} did not start (attempt {attempt + 1}): {got[:200]}\n")
    return got


def _run_setup_once(setup: str, args: argparse.Namespace, reqs: list[Req]) -> list[dict] | str:
    with tempfile.TemporaryDirectory() as tmp, ProcessGroup() as pg:
        try:
            url, sim_urls = start_setup(pg, setup, args, Path(tmp))
        except Exception as e:  # report it and go on with the other setups
            return f"{type(e).__name__}: {str(e)[:300]}"
        pids = {p.name: p.pid for p in pg.processes if p.name == "sims" or p.name.startswith("epp")}
        cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
        t0 = time.perf_counter()
        run = asyncio.run(drive(setup, url, sim_urls, reqs, args))
        wall = time.perf_counter() - t0
        router = vr_module().decisions(url) if setup.startswith("vr-") else {}
        cpu = {name: (cpu_seconds(pid) - cpu0[name]) / wall for name, pid in pids.items()}
        if len([n for n in cpu if n.startswith("epp")]) > 1:  # several replicas: their sum
            cpu["epp"] = sum(v for n, v in cpu.items() if n.startswith("epp"))
    rows = summarize(run, args)
    for r in rows:
        r["sim_cpu"], r["epp_cpu"] = cpu.get("sims"), cpu.get("epp")
        if router:  # vllm-router's prefix decisions over the whole run, by outcome
            r["router_decisions"] = router
    return rows


def median_rows(runs: list[list[dict]]) -> list[dict]:
    """Per stage, the median of every numeric field over the repeated runs."""
    out = []
    for stage in zip(*runs, strict=True):
        row = dict(stage[0])
        for key, value in stage[0].items():
            if isinstance(value, int | float) and key not in ("rate",):
                vals = [r[key] for r in stage if r[key] is not None and r[key] == r[key]]
                row[key] = statistics.median(vals) if vals else None
        row["runs"] = len(stage)
        out.append(row)
    return out


def run_scenario(args: argparse.Namespace) -> tuple[list[dict], dict[str, str]]:
    reqs = workload(args)
    sys.stderr.write(
        f"[{args.scenario}] {len(reqs)} requests per setup "
        f"({sum(r.stage >= 0 for r in reqs)} measured), rates {args.rates}, "
        f"time scale {args.time_scale:g}\n"
    )
    rows: list[dict] = []
    skipped: dict[str, str] = {}
    for setup in args.setups:
        if setup.startswith("vr-") and not shutil.which(args.router):
            skipped[setup] = f"{args.router} not found"
            continue
        runs = []
        for k in range(args.repeat):
            sys.stderr.write(f"{time.strftime('%H:%M:%S')} {setup} run {k + 1} ...\n")
            got = run_setup(setup, args, reqs)
            if isinstance(got, str):
                skipped[setup] = got
                sys.stderr.write(f"  {setup} did not start: {got}\n")
                break
            runs.append(got)
            for r in got:
                sys.stderr.write(
                    f"  {r['rate']:g}: ttft p90 {fmt_s(r['ttft_p90'])} tok/s {r['tok_s']:.0f} "
                    f"hit {r['hit_rate']} wait {r['waiting']} err {r['errors']} "
                    f"cpu sim {r['sim_cpu']} epp {r['epp_cpu']}\n"
                )
            if got and "router_decisions" in got[0]:
                sys.stderr.write(f"  vllm-router decisions: {got[0]['router_decisions']}\n")
        if runs:
            rows += [dict(r, scenario=args.scenario) for r in median_rows(runs)]
    return rows, skipped


def describe(args: argparse.Namespace) -> str:
    if args.trace:
        return trace_module().describe(args)
    shape = "unique prompts" if args.groups <= 0 else f"{args.groups} groups"
    if args.agent:
        return (
            f"{args.scenario}: {args.groups} concurrent agent sessions of 10-40 turns (tool "
            f"results of 200-2,000 tokens, system {args.system_tokens} tokens), half over "
            f"/v1/messages, output {args.output_tokens}; {args.servers} x {args.preset}, KV "
            f"{args.kv_tokens} tokens each, time scale {args.time_scale:g}; stages "
            f"{args.stage_s:g} s real; median of {args.repeat}"
        )
    if args.turns:
        shape = f"{args.groups} sessions x {args.turns} turns"
    elif args.groups > 0:
        shape += f" x {args.questions} questions"
    return (
        f"{args.scenario}: {shape}, system {args.system_tokens} + question "
        f"{args.question_tokens} tokens, output {args.output_tokens}; {args.servers} x "
        f"{args.preset}, KV {args.kv_tokens} tokens each, time scale {args.time_scale:g}; "
        f"stages {args.stage_s:g} s real; median of {args.repeat}"
    )


def main(argv: list[str] | None = None, args: argparse.Namespace | None = None) -> int:
    argv = sys.argv[1:] if argv is None and args is None else argv
    if argv is not None and "--real-vllm" in argv:  # real servers: bench/routing_real.py
        from bench import routing_real

        return routing_real.main([a for a in argv if a != "--real-vllm"])
    if argv is not None and "--virtual" in argv:  # placement only: bench/routing_virtual.py
        from bench import routing_virtual

        return routing_virtual.main([a for a in argv if a != "--virtual"])
    args = args or parse_args(argv)
    scenarios = args.matrix or [args.scenario]
    rows: list[dict] = []
    skipped: dict[str, str] = {}
    for name in scenarios:
        sargs = with_scenario(args, name)
        got, why = run_scenario(sargs)
        rows += got
        skipped.update({f"{name}/{k}": v for k, v in why.items()})
        print(describe(sargs))
        print(tables(got, sargs.rates))
        for r in got:  # vllm-router: did it route on prefixes? (bench/routing_vr.py)
            if "router_decisions" in r and r["rate"] == sargs.rates[0]:
                print(f"\n{r['setup']}: vllm-router prefix decisions {r['router_decisions']}")
        print(flush=True)
        if args.json:  # after every scenario, so a long matrix cut short keeps what ran
            Path(args.json).write_text(json.dumps({"rows": rows, "skipped": skipped}, indent=2))
    if args.matrix:
        print(matrix_module().ratio_table(rows))
        print()
        print(matrix_module().knee_table(rows))
        print()
        print(matrix_module().ttft_ratio_table(rows))
    for setup, why in skipped.items():
        print(f"\nskipped {setup}: {why}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "skipped": skipped}, indent=2))
    if args.plot and rows:
        if args.matrix:
            matrix_module().plot_matrix(rows, args.plot)
        else:
            plot(rows, args.plot, with_scenario(args, args.scenario))
    return 0


def trace_module():
    """bench/routing_trace.py (trace replay scenarios)."""
    from bench import routing_trace

    return routing_trace


def agent_module():
    """bench/routing_agent.py (the agent scenario's sessions)."""
    from bench import routing_agent

    return routing_agent


def vr_module():
    """bench/routing_vr.py (the vllm-router setups), one module for the process: it keeps
    each router's metrics address from its start to the read after the run."""
    from bench import routing_vr

    return routing_vr


def matrix_module():
    """bench/routing_matrix.py (ratios and the matrix plot)."""
    from bench import routing_matrix

    return routing_matrix


if __name__ == "__main__":
    sys.exit(main())
