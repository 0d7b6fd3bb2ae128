"""Routing placement in virtual time: the EPP's real scheduler over simulated servers, no
processes, no proxies, no wall clock (`epp bench routing --virtual`).

`bench/routing.py` measures a setup end to end: Envoy, `epp serve` and `epp sim` processes
on a 2-core machine shared with other jobs, so a few ms of TTFT mix the EPP hop's CPU (two
ext_proc exchanges per request, one per response chunk) with where the requests went.
This runs only the second part. Every scenario's request sequence (the same `Prompts`,
`SCENARIOS` and seeds as routing.py, arrival times in model seconds) is routed by:

- `rr`, `lr`, `random`: what Envoy does alone (ROUND_ROBIN; LEAST_REQUEST = Envoy's
  default power of two choices on active requests; RANDOM);
- `epp-*`: the EPP's own `Director` with the setup's config file (routing.py's `CONFIGS`,
  config/load-only.yaml for `epp-load`), its in-flight accounting fed at the simulated
  first token and end of each request, its datastore fed the servers' load every
  `--scrape-s` model seconds (as `epp serve` scrapes `/metrics`);

over `--servers` `VirtualEngine`s (`epp/sim/virtual.py`: the simulator's own scheduler,
KV cache with prefix caching and step-cost model for the preset, in virtual time), so the
TTFT, tokens/s and hit rate differ only by placement, and the same seed gives the same
figures on any machine. The hop's cost is then the rest: `epp-rr` here equals `rr` by
construction, while routing.py measures their difference.

    .venv/bin/epp bench routing --virtual --matrix one-prefix,decode-bound --stage-s 30
    .venv/bin/python bench/routing_virtual.py --scenario long-context --setups rr,epp-sticky

Prompts are the routing.py words (one token each for the simulator); a request's prefix
identity is one id per full 16-token block, chained, so equal ids mean an equal prefix
(`VirtualEngine.add(hash_ids=...)`); `--stage-s` is in MODEL seconds here (time scale 1).
"""

from __future__ import annotations

import argparse
import copy
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from epp.composition import install_plugins  # noqa: E402
from epp.config.loader import load_config_file  # noqa: E402
from epp.datastore import Datastore, Endpoint, EndpointMetrics  # noqa: E402
from epp.director import Director, RoutingDecision  # noqa: E402
from epp.request import new_request, parse_body  # noqa: E402
from epp.scheduling.registry import Handle  # noqa: E402
from epp.sim.presets import config_for  # noqa: E402
from epp.sim.virtual import VirtualEngine  # noqa: E402

BLOCK = 16  # tokens per prefix id: the preset's KV block size
ENVOY_SETUPS = ("rr", "lr", "random")


def routing_module():
    """bench/routing.py (scenarios, prompts, tables)."""
    from bench import routing

    return routing


@dataclass
class Flight:
    """One routed request until its end: the EPP's decision (None for Envoy setups)."""

    rid: int
    server: int
    decision: RoutingDecision | None
    req: object  # the engine's request (first_token_at, finished_at)
    first_done: bool = False


@dataclass
class Outcome:
    stage: int
    arrival: float
    ttft: float
    finish: float
    isl: int
    cached: int
    token_times: tuple[float, ...] = ()


@dataclass
class Pool:
    """The servers, the setup's picker, and the requests in flight."""

    engines: list[VirtualEngine]
    setup: str
    rng: random.Random
    director: Director | None = None
    datastore: Datastore | None = None
    now: list[float] = field(default_factory=lambda: [0.0])
    flights: dict[int, Flight] = field(default_factory=dict)
    turn: int = 0

    def active(self, i: int) -> int:
        return sum(1 for f in self.flights.values() if f.server == i)

    def pick(self, r, max_tokens: int) -> tuple[int, RoutingDecision | None]:
        """The server `r` (a routing.py `Req`) goes to, and the EPP's decision."""
        n = len(self.engines)
        if self.setup == "rr":
            self.turn += 1
            return (self.turn - 1) % n, None
        if self.setup == "random":
            return self.rng.randrange(n), None
        if self.setup == "lr":  # Envoy LEAST_REQUEST: 2 random hosts, fewer active wins
            a, b = self.rng.sample(range(n), 2)
            return (a if self.active(a) <= self.active(b) else b), None
        assert self.director is not None
        body = {"model": "tiny", "prompt": r.prompt, "max_tokens": max_tokens, "stream": True}
        if r.body is not None:  # the agent scenario: a chat or Messages body
            body = {"model": "tiny", **r.body, "max_tokens": max_tokens, "stream": True}
        request = parse_body(new_request(r.headers or {}, r.path, "POST"), _json(body))
        decision = self.director.route(request, None)
        return int(decision.destinations[0].split(".")[3].split(":")[0]) - 1, decision


def _json(body: dict) -> bytes:
    import json

    return json.dumps(body).encode()


def build_pool(setup: str, args: argparse.Namespace, seed: int) -> Pool:
    sim = config_for(args.preset, kv_capacity_tokens=args.kv_tokens, max_model_len=args.kv_tokens)
    engines = [VirtualEngine(sim, block_tokens=BLOCK) for _ in range(args.servers)]
    pool = Pool(engines, setup, random.Random(seed))
    if setup in ENVOY_SETUPS:
        return pool
    rm = routing_module()
    if setup == "epp-load":
        config = ROOT / "config" / "load-only.yaml"
    elif setup in rm.CONFIGS:
        config = ROOT / "config" / rm.CONFIGS[setup]
    elif setup == "epp-random":
        config = Path(args.tmp) / "random.yaml"
        config.write_text(rm.RANDOM_CONFIG)
    else:
        config = Path(setup)  # a config file of one's own
    cfg = load_config_file(config, Handle(rng=random.Random(seed)))
    ds = Datastore(staleness=1e18, clock=lambda: pool.now[0], require_metrics=False)
    ds.set_endpoints([Endpoint(f"s{i}", f"10.0.0.{i + 1}", 8000) for i in range(args.servers)])
    pool.datastore = ds
    pool.director = Director(ds, cfg.scheduler, cfg.pre_request, rng=random.Random(seed))
    scrape(pool, sim.num_gpu_blocks)
    return pool


def scrape(pool: Pool, num_blocks: int) -> None:
    """What `epp serve` reads from each server's /metrics, now."""
    assert pool.datastore is not None
    for i, e in enumerate(pool.engines):
        load = e.load()
        metrics = EndpointMetrics(
            waiting_queue_size=load.waiting,
            running_requests=load.running,
            kv_cache_usage=load.kv_usage,
            cache_block_size=BLOCK,
            cache_num_blocks=num_blocks,
            update_time=pool.now[0],
        )
        pool.datastore.update_metrics(f"s{i}", metrics)


class Prefixes:
    """Chained ids of full 16-word blocks: equal ids = equal prefix up to that block."""

    def __init__(self) -> None:
        self.ids: dict[tuple[int, tuple[str, ...]], int] = {}

    def of(self, words: list[str]) -> list[int]:
        out, prev = [], -1
        for i in range(0, len(words) - BLOCK + 1, BLOCK):
            key = (prev, tuple(words[i : i + BLOCK]))
            prev = self.ids.setdefault(key, len(self.ids))
            out.append(prev)
        return out


def settle(pool: Pool, t: float, done: list[Outcome], stages: dict[int, int]) -> None:
    """Advance every server to `t`; tell the EPP of first tokens and ends before it."""
    for e in pool.engines:
        e.advance_to(t)
    for rid, f in list(pool.flights.items()):
        req = f.req
        if not f.first_done and req.first_token_at is not None and req.first_token_at <= t:
            f.first_done = True
            if f.decision is not None:
                pool.director.first_token(f.decision)
        if req.finished_at is not None and req.finished_at <= t:
            if f.decision is not None:
                pool.director.release(f.decision)
            del pool.flights[rid]
    for e in pool.engines:
        for fin in e.drain_finished():
            done.append(
                Outcome(
                    stages[fin.rid],
                    fin.arrival,
                    fin.ttft_s,
                    fin.finish,
                    fin.isl,
                    fin.cached_tokens,
                    fin.token_times,
                )
            )


def run(setup: str, args: argparse.Namespace, reqs: list, seed: int) -> list[Outcome]:
    return simulate(build_pool(setup, args, seed), args, reqs)


def simulate(pool: Pool, args: argparse.Namespace, reqs: list) -> list[Outcome]:
    """Every request of `reqs` through `pool` until the last one ends."""
    num_blocks = pool.engines[0].config.num_gpu_blocks
    prefixes = Prefixes()
    done: list[Outcome] = []
    stages: dict[int, int] = {}
    next_scrape = args.scrape_s
    for rid, r in enumerate(reqs):
        while pool.datastore is not None and next_scrape <= r.at:
            settle(pool, next_scrape, done, stages)
            pool.now[0] = next_scrape
            scrape(pool, num_blocks)
            next_scrape += args.scrape_s
        settle(pool, r.at, done, stages)
        pool.now[0] = r.at
        server, decision = pool.pick(r, args.output_tokens)
        words = r.prompt.split()
        engine = pool.engines[server]
        engine.add(rid, len(words), args.output_tokens, r.at, prefixes.of(words))
        stages[rid] = r.stage
        pool.flights[rid] = Flight(rid, server, decision, engine.scheduler.waiting[-1])
    end = reqs[-1].at if reqs else 0.0
    while pool.flights:
        end += 1.0
        settle(pool, end, done, stages)
    for e in pool.engines:  # record_token_times is off: tokens/s from finish - first
        e.drain_finished()
    return done


def summarize(setup: str, out: list[Outcome], args: argparse.Namespace) -> list[dict]:
    rm = routing_module()
    rows = []
    for k, (a, b) in enumerate(rm.stage_bounds(args)):
        res = [o for o in out if o.stage == k]
        ttft = [o.ttft for o in res]
        # Output tokens made inside the stage: each request's tokens spread evenly from its
        # first token to its end (the engine's token times are not recorded).
        tokens = 0.0
        for o in out:
            span = o.finish - (o.arrival + o.ttft)
            first = o.arrival + o.ttft
            if span <= 0:
                tokens += 1.0 if a <= first < b else 0.0
                continue
            overlap = max(0.0, min(b, o.finish) - max(a, first))
            tokens += 1.0 * (a <= first < b) + (args.output_tokens - 1) * overlap / span
        isl = sum(o.isl for o in res)
        rows.append(
            {
                "setup": setup,
                "rate": args.rates[k],
                "offered": len(res) / args.stage_s,
                "requests": len(res),
                "tok_s": tokens / (b - a),
                "ttft_p50": rm.pct(ttft, 0.5),
                "ttft_p90": rm.pct(ttft, 0.9),
                "ttft_p99": rm.pct(ttft, 0.99),
                "hit_rate": sum(o.cached for o in res) / isl if isl else None,
                "waiting": None,
                "errors": 0,
                "output_tokens": args.output_tokens,
                **rm.matrix_module().halves([(o.arrival, o.ttft) for o in res], (a + b) / 2),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    import tempfile

    rm = routing_module()
    p = argparse.ArgumentParser(prog="epp bench routing --virtual", description=__doc__)
    rm.add_arguments(p)
    p.add_argument("--scrape-s", type=float, default=0.0625, help="MODEL s between scrapes")
    p.add_argument("--virtual", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    install_plugins()
    setups = (args.setups or "rr,lr,epp-rr,epp-load,epp-sticky").split(",")
    scenarios = args.matrix.split(",") if args.matrix else [args.scenario]
    if args.matrix == "all":
        scenarios = sorted(rm.SCENARIOS)
    unknown = [s for s in scenarios if s not in rm.SCENARIOS]
    if unknown:
        p.error(f"unknown scenarios {unknown}; known: {sorted(rm.SCENARIOS)}")
    args.time_scale = 1.0  # stage_s and rates are model time here
    all_rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        args.tmp = tmp
        for name in scenarios:
            sargs = rm.with_scenario(args, name)
            rows: list[dict] = []
            for setup in setups:
                runs = []
                for k in range(args.repeat):
                    a = copy.copy(sargs)
                    a.seed = args.seed + k
                    reqs = rm.workload(a)
                    runs.append(summarize(setup, run(setup, a, reqs, a.seed), a))
                rows += [dict(r, scenario=name) for r in rm.median_rows(runs)]
            all_rows += rows
            print(rm.describe(sargs) + " [virtual time: placement only]")
            print(rm.tables(rows, sargs.rates))
            print(flush=True)
    if len(scenarios) > 1 or args.matrix:
        print(rm.matrix_module().ratio_table(all_rows))
        print()
        print(rm.matrix_module().knee_table(all_rows))
    if args.json:
        import json

        Path(args.json).write_text(json.dumps({"rows": all_rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
