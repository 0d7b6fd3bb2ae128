"""`epp plan replay`: a trace through the planner and a simulated pool, offline.

    epp plan replay --trace ../shared/traces/azure-llm-conv-2023.csv --compare \\
        --json out.json --plot out.png

I/O lives here (reading the trace, the planner file and the profile, printing, the
JSON and the plot); the replay itself is pure (`replay.py`, `compare.py`). Every bad
input is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from epp.planner import parallel
from epp.planner.core.types import Policy
from epp.planner.offline import compare as cmp
from epp.planner.offline.laws.catalog import LAW_NAMES, law_factories
from epp.planner.offline.laws.oracle import DEFAULT_TARGET, parse_target
from epp.planner.offline.outcome import Sla, Summary, summarize
from epp.planner.offline.pool import DEFAULT_ROUTING, PoolShape, Routing, Spares
from epp.planner.offline.replay import Arrival, Progress
from epp.planner.offline.sla_pick import PRODUCT_SLA_SOURCE
from epp.planner.offline.static import (
    ITL_HEADROOM,
    STATIC_NAMES,
    TTFT_HEADROOM,
    NoPoolMeetsSla,
    Sizer,
    StaticPolicy,
)

DEFAULT_PRESET = "llama-3.1-8b-h100"
DEFAULT_INTERVAL_S = 60.0  # Dynamo's examples and tests use 60 s (reference §1.7, §8.1)
DEFAULT_STARTUP_S = 120.0
PLANNER_POLICIES = ("load", "dynamo", "epp")
MODE_OF = {"load": "load", "dynamo": "dynamo", "epp": "sla"}
# results a start-up sweep replays once: static pools never scale, the oracle starts at once
STARTUP_FREE = (*STATIC_NAMES, "oracle")
SLA_RULES = ("product", "requests", "intervals")
DYNAMO_AGG_REFUSAL = (
    "upstream Dynamo's aggregated planner refuses throughput (SLA) scaling ('Aggregated "
    "planner only supports load-based scaling', ai-dynamo/dynamo "
    "components/src/dynamo/planner/core/agg.py); its load-based loop sizes on engine "
    "forward-pass metrics this replay does not produce"
)
# load's operating point for --sweep: the KV use the profiler's formula centres its
# band on (decode_kv_bounds: up = util + 0.2, down = util - 0.2, floored at 0.1)
LOAD_KV_UTILS = (0.1, 0.3, 0.5, 0.7)


class UsageError(Exception):
    """A bad flag or input: printed as one line, exit 2."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="plan_command", metavar="SUBCOMMAND", required=True)
    r = sub.add_parser(
        "replay",
        help="replay a trace through the planner and a simulated pool (what-if, offline)",
        description="Replay a request trace (Mooncake JSONL or Azure CSV) through a scaling "
        "policy and a pool of simulated model servers in virtual time; print per-interval "
        "replicas, latency and SLA attainment, or compare policies side by side.",
    )
    r.add_argument("--trace", required=True, metavar="FILE", help="Mooncake JSONL or Azure CSV")
    r.add_argument(
        "--compare",
        action="store_true",
        help="run static-peak, static-mean, oracle, keda-queue, llm-d-slo, load, dynamo "
        "and epp side by side (or those --policies names)",
    )
    r.add_argument(
        "--policies",
        metavar="A,B,...",
        help="with --compare: only these policies (comma-separated names)",
    )
    r.add_argument(
        "--policy",
        metavar="NAME",
        help="the one policy to replay without --compare: epp, dynamo, load, "
        "keda-queue, llm-d-slo, oracle, static-peak or static-mean (default: epp)",
    )
    r.add_argument("--json", metavar="FILE", help="write the comparison as JSON")
    r.add_argument("--plot", metavar="FILE", help="write replicas and latency over time (PNG)")
    r.add_argument(
        "--preset",
        default=DEFAULT_PRESET,
        metavar="NAME",
        help=f"simulated server of every replica (default {DEFAULT_PRESET})",
    )
    r.add_argument(
        "--long-prefill-token-threshold",
        type=int,
        default=0,
        metavar="TOKENS",
        help="vLLM's --long-prefill-token-threshold on every replica: no request prefills "
        "more than this many tokens in one step, so a long prompt does not stall the "
        "requests decoding beside it (default 0: off, vLLM's default)",
    )
    r.add_argument(
        "--ttft",
        type=float,
        metavar="MS",
        help="TTFT SLA, ms (default 500, Dynamo's planner default): each request is "
        "judged on it, each interval on its p90",
    )
    r.add_argument(
        "--itl",
        type=float,
        metavar="MS",
        help="ITL SLA, ms (default 50, Dynamo's planner default): each request is "
        "judged on it, each interval on its p90",
    )
    r.add_argument(
        "--sla-rule",
        choices=SLA_RULES,
        default="product",
        help="how the SLA every policy is judged on is set: product (default: a product "
        "target, TTFT 500 ms and ITL 50 ms per request as Dynamo's SLA planner defaults, "
        "or the planner file's ttft/itl; --ttft/--itl override either), requests (the "
        "tightest at which static-peak keeps >= 99 %% of requests within both and >= 95 %% "
        "in every 5-minute window) or intervals (p90s within it in every interval of "
        "static-peak)",
    )
    r.add_argument(
        "--oracle-target",
        default=str(DEFAULT_TARGET),
        metavar="SHARE|run:SHARE|p90",
        help=f"the oracle's bar: the share of each interval's requests within both SLAs "
        f"(default {DEFAULT_TARGET}, the request target), run:SHARE (of the run's "
        "requests and 95 %% of every 5-minute window's: the misses spread where they save "
        "the most), or p90 (each interval's p90 TTFT and ITL within, the first runs' oracle)",
    )
    r.add_argument(
        "--interval",
        type=float,
        metavar="S",
        help=f"adjustment and report interval, s (default {DEFAULT_INTERVAL_S:g}; "
        "load keeps Dynamo's 30 s unless given)",
    )
    r.add_argument(
        "--startup-s",
        type=float,
        default=DEFAULT_STARTUP_S,
        metavar="S",
        help=f"a new replica's start-up delay (default {DEFAULT_STARTUP_S:g})",
    )
    r.add_argument(
        "--sweep-startup",
        metavar="S1,S2,...",
        help="run the comparison once per start-up delay (seconds, e.g. 10,100,300); "
        "replaces --startup-s",
    )
    r.add_argument(
        "--pareto",
        metavar="FILE",
        help="write GPU-hours against request attainment, one point per policy and "
        "start-up delay (PNG)",
    )
    r.add_argument(
        "--sweep",
        action="store_true",
        help="with --compare: also run each field law over its main knob (llm-d-slo's band, "
        "keda-queue's per-replica target, load's operating point) and print each "
        "policy's frontier (GPU-hours against the share of requests within both SLAs) and "
        "its cheapest setting keeping >= 99 %% of requests within them",
    )
    r.add_argument(
        "--time-limit",
        metavar="DURATION",
        help="replay only the trace's first DURATION (600, 90s, 10m, 1h)",
    )
    r.add_argument(
        "--static-peak",
        type=int,
        metavar="N",
        help="static-peak's replicas, when an earlier comparison of the same trace and SLA "
        "found them: replayed once instead of searched (a search replays the whole trace "
        "at each size it tries)",
    )
    r.add_argument("--planner", metavar="FILE", help="planner file (YAML, kebab-case keys)")
    r.add_argument(
        "--profile",
        metavar="DIR",
        help="profile results for the SLA policies (epp profile's output; default: "
        "the planner file's profile-results-dir, else the preset profiled in "
        "virtual time)",
    )
    r.add_argument(
        "--rate-scale",
        type=float,
        metavar="K",
        help="K times the trace's arrival rate (copies with seeded jitter and their "
        "own prefix ids; tracegen.scale_rate)",
    )
    r.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the routing tie-break and --rate-scale (default 0)",
    )
    r.add_argument("--quiet", action="store_true", help="no progress on stderr")
    r.add_argument(
        "--config",
        metavar="FILE",
        help="the EPP config the replay routes with, as epp serve --config (default: "
        "config/default.yaml, epp serve's built-in default)",
    )
    r.add_argument(
        "--jobs",
        type=int,
        metavar="N",
        help="with --compare: replay up to N policies at once, one process each "
        "(default: the CPUs this process may use)",
    )

    b = sub.add_parser(
        "bursty",
        help="write a generated bursty trace (Mooncake JSONL) for replays",
        description="Write a seeded bursty trace: quiet gaps with no request, then bursts at "
        "several times the mean rate (tracegen.bursty; Azure-like lengths, no prefix ids).",
    )
    b.add_argument("-o", "--out", required=True, metavar="FILE", help="JSONL file to write")
    b.add_argument("--seed", type=int, default=1, help="generator seed (default 1)")
    b.add_argument("--duration", default="1h", metavar="DURATION", help="trace length (default 1h)")
    b.add_argument(
        "--rate",
        type=float,
        default=5.0,
        metavar="RPS",
        help="long-run mean request rate (default 5 req/s)",
    )

    g = sub.add_parser(
        "servegen",
        help="write a trace (Mooncake JSONL) from ServeGen production client data",
        description="Generate a request trace from a ServeGen client folder (alibaba/"
        "ServeGen, arXiv 2505.09999) as ServeGen's generate_workload does: each client's "
        "inter-arrival times drawn from its 10-minute window's fitted Gamma or Weibull, "
        "rescaled to fill the window at --scale times its recorded rate; lengths from its "
        "latest length distribution. Clients without a length file are left out, as "
        "ServeGen's loader does.",
    )
    g.add_argument(
        "folder",
        metavar="DIR",
        help="folder of chunk-<i>-trace.csv and "
        "chunk-<i>-dataset.json files (e.g. ServeGen's data/language/m-small)",
    )
    g.add_argument(
        "--start-hour",
        type=float,
        default=0.0,
        metavar="H",
        help="where the trace starts in the data, in hours (default 0)",
    )
    g.add_argument(
        "--hours", type=float, default=24.0, metavar="N", help="trace length in hours (default 24)"
    )
    g.add_argument(
        "--scale",
        type=float,
        default=1.0,
        metavar="K",
        help="multiply every client's recorded rate by K (ServeGen's "
        "get_scaled_rate_fn; default 1)",
    )
    g.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    g.add_argument("-o", "--out", required=True, metavar="FILE", help="JSONL file to write")


def run(args: argparse.Namespace) -> int:
    try:
        if args.plan_command == "bursty":
            return _bursty(args)
        if args.plan_command == "servegen":
            return _servegen(args)
        return _replay(args)
    except UsageError as e:
        print(f"epp plan {args.plan_command}: error: {e}", file=sys.stderr)
        return 2
    except (ValueError, OSError) as e:  # TraceError, ConfigError, ProfileError, presets
        print(f"epp plan {args.plan_command}: error: {_one_line(e)}", file=sys.stderr)
        return 2


# -- the command ----------------------------------------------------------------------


def _replay(args: argparse.Namespace) -> int:
    from epp.planner.tracefile import load_trace
    from epp.sim import presets

    names = _policy_names(args)  # before any work: a bad name fails at once
    oracle_target = parse_target(args.oracle_target)
    if args.rate_scale is not None and not (args.rate_scale > 0 and math.isfinite(args.rate_scale)):
        raise UsageError("--rate-scale must be a positive number")
    if args.static_peak is not None and args.static_peak < 1:
        raise UsageError(f"--static-peak must be an integer >= 1, got {args.static_peak}")
    arrivals = load_trace(args.trace)
    if args.rate_scale is not None:
        from epp.planner.offline.tracegen import scale_rate

        arrivals = scale_rate(arrivals, args.rate_scale, seed=args.seed)
    if args.time_limit is not None:
        limit = parse_duration(args.time_limit)
        arrivals = [a for a in arrivals if a.t_s < limit]
        if not arrivals:
            raise UsageError(f"--time-limit {args.time_limit}: no request arrives that early")
    interval = DEFAULT_INTERVAL_S if args.interval is None else args.interval
    if not (interval > 0 and math.isfinite(interval)):
        raise UsageError("--interval must be a positive number of seconds")
    if not (args.startup_s >= 0 and math.isfinite(args.startup_s)):
        raise UsageError("--startup-s must be a non-negative number of seconds")
    startups = _startups(args)
    for flag, v in (("--ttft", args.ttft), ("--itl", args.itl)):
        if v is not None and not (v > 0 and math.isfinite(v)):
            raise UsageError(f"{flag} must be a positive number of milliseconds")
    preset = presets.get(args.preset)  # ValueError names the known ones
    caching = any(a.hash_ids for a in arrivals)
    if args.long_prefill_token_threshold < 0:
        raise UsageError("--long-prefill-token-threshold must be >= 0 tokens (0: off)")
    sim = presets.config_for(
        preset.name,
        enable_prefix_caching=caching,
        long_prefill_token_threshold=args.long_prefill_token_threshold,
    )
    shape = PoolShape(
        sim,
        gpus_per_replica=_preset_gpus(preset.name),
        startup_s=args.startup_s,
        routing=_routing(args.config),
    )
    if args.jobs is not None and args.jobs < 1:
        raise UsageError("--jobs must be 1 or more")
    say = _Say(args.quiet)
    say(
        f"trace {args.trace}: {len(arrivals)} requests over {arrivals[-1].t_s / 60:.1f} min"
        f"{'' if caching else ' (no prefix ids: prefix caching off, equivalent and faster)'}"
    )

    spares = Spares()
    sizer = Sizer(arrivals, shape, spares)
    sla = _given_sla(args)
    rule = "given" if sla is not None else args.sla_rule
    if sla is None and args.sla_rule == "product":
        sla = _product_sla(args)
    elif sla is None and (args.ttft is not None or args.itl is not None):
        picked = sizer.default_sla(interval)
        sla = Sla(args.ttft or picked.ttft_ms, args.itl or picked.itl_ms)
        rule = "given"
    try:
        setup = cmp.prepare(arrivals, shape, interval, sla, sizer=sizer)
    except NoPoolMeetsSla as e:
        raise UsageError(str(e)) from None
    setup = dataclasses.replace(
        setup, budget_gpus=_budget(args, setup, args.static_peak), peak_known=args.static_peak
    )
    if rule == "product":
        setup = dataclasses.replace(setup, sla_rule="product")
    fixed: dict[str, cmp.Result] = {}
    if setup.sla_picked and args.sla_rule == "requests":
        setup, fixed["static-peak"] = cmp.pick_request_sla(
            arrivals, setup, seed=args.seed, spares=spares, progress=say.progress("static-peak")
        )
    scaling = [n for n in names if n not in STATIC_NAMES]
    if args.compare and "static-peak" in names and scaling and setup.peak_known is None:
        # The budget is twice static-peak's pool, so static-peak is found first: the
        # busiest intervals' size alone can sit far below it (5 where 9 keep 99 % of a
        # ServeGen fall's requests), leaving the planners no room above static-peak.
        if "static-peak" not in fixed:
            say("static-peak first: the other policies' GPU budget is twice its pool")
            fixed["static-peak"] = cmp.static_peak(
                arrivals, setup, seed=args.seed, spares=spares,
                progress=say.progress("static-peak"),
            )  # fmt: skip
        peak = fixed["static-peak"]
        setup = dataclasses.replace(setup, budget_gpus=_budget(args, setup, peak.initial))
        fixed["static-peak"] = dataclasses.replace(  # judged against the budget it sets
            peak,
            summary=summarize(peak.run, setup.sla, setup.interval_s, budget_gpus=setup.budget_gpus),
        )
    _describe(setup, preset.name, args, say)

    if args.sweep and not args.compare:
        raise UsageError("--sweep sweeps the laws of a comparison: give --compare")
    refused = {}
    if args.compare and "dynamo" in names:  # every pool the replay builds is aggregated
        names = [n for n in names if n != "dynamo"]
        refused["dynamo"] = DYNAMO_AGG_REFUSAL
        say(f"dynamo: not run: {DYNAMO_AGG_REFUSAL}")
    planners = [n for n in names if n in PLANNER_POLICIES]
    profile = _shared_profile(planners, args, setup, say)
    laws = law_factories(
        [n for n in names if n in LAW_NAMES],
        arrivals,
        sla=setup.sla,
        interval_s=setup.interval_s,
        shape=setup.shape,
        budget_gpus=setup.budget_gpus,
        sizer=sizer,
        oracle_target=oracle_target,
        progress=say.progress,
    )
    runs: list[tuple[cmp.Setup, list[cmp.Result]]] = []
    sweeps: list[list[Any]] = []
    for startup in startups:
        # Static pools start ready and never scale, the oracle starts instantly: the
        # start-up delay cannot change them, so a sweep replays them once.
        at = dataclasses.replace(setup, shape=dataclasses.replace(shape, startup_s=startup))
        factories = _factories(planners, args, at, say, profile) | laws
        started = time.monotonic()
        if args.compare:
            results = cmp.compare(
                arrivals,
                at,
                factories,
                seed=args.seed,
                spares=spares,
                progress=say.progress,
                statics=[n for n in names if n in STATIC_NAMES],
                reuse=fixed,
                # what follows reads each policy's summary; a day's per-request records,
                # held for every policy at once, take gigabytes
                runner=parallel.runner(
                    args.jobs or parallel.default_workers(), say.done, keep=cmp.summary_only
                ),
            )
            fixed = {r.summary.policy: r for r in results if r.summary.policy in STARTUP_FREE}
        elif names[0] in fixed:
            results = [fixed[names[0]]]  # static-peak, replayed for the SLA pick
            print_intervals(results[0].summary, at)
        else:
            results = [_single(names[0], arrivals, at, factories, args, spares, say)]
            print_intervals(results[0].summary, at)
        if len(startups) > 1:
            print(f"\n== start-up {startup:g} s ==")
        print_comparison(results, at)
        for name, why in refused.items():
            print(f"{name:<12} not run: {why}")
        if args.sweep:
            from epp.planner.offline.sweep import frontier_lines

            points = _sweep(arrivals, at, names, args, results, spares, say, profile)
            sweeps.append(points)
            print()
            print("\n".join(frontier_lines(points)))
        say(f"replayed in {time.monotonic() - started:.1f} s wall")
        runs.append((at, results))
    if args.json:
        meta = {
            "trace": args.trace,
            "rate_scale": args.rate_scale or 1.0,
            "requests": len(arrivals),
            "last_arrival_s": round(arrivals[-1].t_s, 3),
        }
        if "oracle" in names:
            meta["oracle_target"] = str(oracle_target)
        if refused:
            meta["refused"] = refused
        if sweeps:
            from epp.planner.offline.sweep import sweep_json

            meta["sweep"] = [
                {"startup_s": at.shape.startup_s, **sweep_json(points)}
                for (at, _), points in zip(runs, sweeps, strict=True)
            ]
        if len(runs) == 1:
            write_json(Path(args.json), runs[0][1], runs[0][0], preset.name, meta)
        else:
            write_sweep_json(Path(args.json), runs, preset.name, meta)
    if args.plot:
        from epp.planner.plots import plot_replay

        for at, results in runs:
            path = _per_startup(Path(args.plot), at.shape.startup_s, len(runs))
            plot_replay(path, results, at)
            say(f"wrote {path}")
    if args.pareto:
        from epp.planner.plots import pareto_points, plot_pareto

        title = Path(args.trace).name
        if args.rate_scale is not None and args.rate_scale != 1:
            title += f" x{args.rate_scale:g}"
        plot_pareto(
            Path(args.pareto),
            pareto_points(runs),
            title=title,
            sla=setup.sla,
            sweeps=[p for points in sweeps for p in points],
        )
        say(f"wrote {args.pareto}")
    return 0


def _startups(args: argparse.Namespace) -> list[float]:
    """`--sweep-startup 10,100,300`, else the one `--startup-s`."""
    if args.sweep_startup is None:
        return [args.startup_s]
    out: list[float] = []
    for part in args.sweep_startup.split(","):
        try:
            v = float(part)
        except ValueError:
            v = math.nan
        if not (v >= 0 and math.isfinite(v)):
            raise UsageError(
                f"--sweep-startup {args.sweep_startup!r}: expected non-negative seconds "
                "separated by commas, like 10,100,300"
            )
        out.append(v)
    if len(set(out)) != len(out):
        raise UsageError(f"--sweep-startup {args.sweep_startup!r}: a delay is repeated")
    return out


def _per_startup(path: Path, startup: float, runs: int) -> Path:
    """One timeline plot per start-up delay of a sweep: out.png -> out-startup100.png."""
    if runs == 1:
        return path
    return path.with_name(f"{path.stem}-startup{startup:g}{path.suffix}")


def _bursty(args: argparse.Namespace) -> int:
    from epp.planner.offline.tracegen import bursty

    duration = parse_duration(args.duration, "--duration")
    if not (args.rate > 0 and math.isfinite(args.rate)):
        raise UsageError("--rate must be a positive number of requests per second")
    arrivals = bursty(args.seed, duration, args.rate)
    lines = [
        json.dumps(
            {
                "timestamp": round(a.t_s * 1000, 3),
                "input_length": a.isl,
                "output_length": a.osl,
                "hash_ids": list(a.hash_ids),
            }
        )
        for a in arrivals
    ]
    try:
        Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    except OSError as e:
        raise UsageError(f"{args.out}: cannot write the trace: {e.strerror}") from None
    print(
        f"wrote {args.out}: {len(arrivals)} requests over {duration / 60:g} min, mean "
        f"{len(arrivals) / duration:.2f} req/s (seed {args.seed})"
    )
    return 0


def _routing(path: str | None) -> Routing:
    """The config the replay routes with, checked now (a bad file fails before any
    replay, naming the field, as epp serve would)."""
    if path is None:
        return DEFAULT_ROUTING
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise UsageError(f"--config {path}: cannot read: {e.strerror or e}") from None
    from epp.planner.offline.routing import load

    load(text, path, 0, lambda: 0.0)  # ConfigError (a ValueError) names the field
    return Routing(text, path)


def _servegen(args: argparse.Namespace) -> int:
    from epp.planner.offline.servegen import generate, mooncake_lines
    from epp.planner.tracefile import load_servegen

    for flag, v in (("--scale", args.scale), ("--hours", args.hours)):
        if not (v > 0 and math.isfinite(v)):
            raise UsageError(f"{flag} must be a positive number, got {v:g}")
    if not (args.start_hour >= 0 and math.isfinite(args.start_hour)):
        raise UsageError(f"--start-hour must be 0 or more, got {args.start_hour:g}")
    pool = load_servegen(args.folder)
    w = generate(pool, args.start_hour * 3600.0, args.hours * 3600.0, args.scale, args.seed)
    if len(w) == 0:
        raise UsageError(
            f"no client sent a request in hours {args.start_hour:g}-"
            f"{args.start_hour + args.hours:g} of {args.folder}"
        )
    try:
        with open(args.out, "w", encoding="utf-8") as f:
            for line in mooncake_lines(w):
                f.write(line + "\n")
    except OSError as e:
        raise UsageError(f"{args.out}: cannot write the trace: {e.strerror}") from None
    rates = w.window_rates()
    absent = ", ".join(map(str, w.absent)) or "none"
    print(
        f"wrote {args.out}: {len(w)} requests over {args.hours:g} h from {w.clients} clients "
        f"(seed {args.seed}); mean {len(w) / w.duration_s:.2f} req/s, 10-min windows "
        f"{rates.min():.2f}-{rates.max():.2f} req/s; clients without a length file, left "
        f"out: {absent}"
    )
    return 0


def _single(
    name: str,
    arrivals: Sequence[Arrival],
    setup: cmp.Setup,
    factories: dict[str, cmp.PolicyFactory],
    args: argparse.Namespace,
    spares: Spares,
    say: _Say,
) -> cmp.Result:
    if name == "static-peak":
        return cmp.static_peak(
            arrivals, setup, seed=args.seed, spares=spares, progress=say.progress(name)
        )
    if name == "static-mean":
        n = setup.mean.replicas
        policy: Policy = StaticPolicy(name, n, setup.interval_s)
        return cmp.run_policy(
            arrivals, policy, setup, n, seed=args.seed, spares=spares, progress=say.progress(name)
        )
    return cmp.run_factory(
        arrivals, name, factories[name], setup, seed=args.seed, spares=spares,
        progress=say.progress(name),
    )  # fmt: skip


def _product_sla(args: argparse.Namespace) -> Sla:
    """The product target: --ttft/--itl, else the planner file's ttft/itl, else
    Dynamo's SLA planner defaults (`sla_pick.product_sla`)."""
    from epp.planner.offline.sla_pick import product_sla

    ttft, itl = args.ttft, args.itl
    if args.planner is not None:
        file_sla = _planner_config(args).sla
        ttft = file_sla.ttft if ttft is None else ttft
        itl = file_sla.itl if itl is None else itl
    return product_sla(ttft, itl)


def _sweep(
    arrivals: Sequence[Arrival],
    setup: cmp.Setup,
    names: Sequence[str],
    args: argparse.Namespace,
    results: Sequence[cmp.Result],
    spares: Spares,
    say: _Say,
    profile: Any,
) -> list[Any]:
    """Every result of the comparison as one point (the laws' documented set-ups marked),
    then each law's other settings (`laws.catalog.law_sweeps`; load over its operating
    point, `LOAD_KV_UTILS`), each replayed from the static-mean pool as the comparison
    replays the law."""
    from epp.planner.offline.laws.catalog import law_sweeps
    from epp.planner.offline.sweep import Point

    documented = {"keda-queue": "target 5", "llm-d-slo": "band 0.55/0.4", "load": "profiler"}
    points = [
        Point.of(r, documented.get(r.summary.policy, "default"), r.summary.policy in documented)
        for r in results
    ]
    variants = law_sweeps(names, sla=setup.sla, shape=setup.shape, budget_gpus=setup.budget_gpus)
    if "load" in names:
        base = _planner_config(args)
        variants["load"] = []
        for util in LOAD_KV_UTILS:
            up, down = min(1.0, util + 0.2), max(0.1, util - 0.2)
            config = _config_for("load", base, args, setup)
            load = dataclasses.replace(
                config.load, decode_kv_scale_up_threshold=up, decode_kv_scale_down_threshold=down
            )
            config = dataclasses.replace(config, load=load)
            variants["load"].append((f"kv {up:g}/{down:g}", _make(config, "load", profile)))
    jobs: list[tuple[str, cmp.Job]] = []
    settings_of: list[str] = []
    for name, settings in variants.items():
        for setting, factory in settings:
            if setting == documented.get(name):
                continue  # the comparison's own row

            def job(name: str = name, setting: str = setting, factory=factory) -> cmp.Result:
                return cmp.run_factory(
                    arrivals, name, factory, setup, seed=args.seed, spares=spares,
                    progress=say.progress(f"{name} {setting}"),
                )  # fmt: skip

            jobs.append((f"{name} {setting}", job))
            settings_of.append(setting)
    workers = args.jobs or parallel.default_workers()
    run_all = parallel.runner(workers, say.done, keep=cmp.summary_only)
    for setting, res in zip(settings_of, run_all(jobs), strict=True):
        points.append(Point.of(res, setting))
    return points


def _make(config: Any, name: str, profile: Any) -> cmp.PolicyFactory:
    from epp.planner.core.planner import build_policy

    return lambda: build_policy(name, config, profile)


def _given_sla(args: argparse.Namespace) -> Sla | None:
    if args.ttft is not None and args.itl is not None:
        return Sla(args.ttft, args.itl)
    return None


def _policy_names(args: argparse.Namespace) -> list[str]:
    known = (*STATIC_NAMES, *LAW_NAMES, *PLANNER_POLICIES)
    if args.policies is not None and not args.compare:
        raise UsageError("--policies selects what --compare runs; give --compare, or --policy")
    if args.compare:
        if args.policy:
            raise UsageError("--policy picks the one policy to replay; drop it with --compare")
        if args.policies is None:
            return list(known)
        chosen = [n.strip() for n in args.policies.split(",") if n.strip()]
        bad = [n for n in chosen if n not in known]
        if bad or not chosen:
            what = f"unknown policy {bad[0]!r}" if bad else "--policies names no policy"
            raise UsageError(f"{what}; choose from {', '.join(known)}")
        return list(dict.fromkeys(chosen))
    name = args.policy or "epp"
    if name not in known:
        raise UsageError(f"unknown policy {name!r}; choose one of {', '.join(known)}")
    return [name]


def _preset_gpus(name: str) -> int:
    """GPUs behind one replica: the preset's name says it ("4xh100" is TP=4)."""
    m = re.search(r"(\d+)xh100", name)
    return int(m.group(1)) if m else 1


# -- the planner's policies (epp.planner.core.planner, when present) -----------------------


def _shared_profile(
    names: Sequence[str], args: argparse.Namespace, setup: cmp.Setup, say: _Say
) -> Any:
    """The SLA policies' profile, loaded (or measured) once for every start-up delay."""
    if not any(n in ("epp", "dynamo") for n in names):
        return None
    try:
        import epp.planner.core.planner  # noqa: F401
    except ImportError:
        return None  # _factories says what is missing
    return _profile(args, _planner_config(args), setup, say)


def _factories(
    names: Sequence[str],
    args: argparse.Namespace,
    setup: cmp.Setup,
    say: _Say,
    profile: Any = None,
) -> dict[str, cmp.PolicyFactory]:
    if not names:
        return {}
    try:
        from epp.planner.core.planner import build_policy
    except ImportError:
        missing = ", ".join(names)
        if not args.compare:
            raise UsageError(
                f"policy {missing} is not in this build (epp.planner.core.planner)"
            ) from None
        say(f"note: {missing} not in this build (epp.planner.core.planner): compared without them")
        return {}
    base = _planner_config(args)
    if profile is None and any(n in ("epp", "dynamo") for n in names):
        profile = _profile(args, base, setup, say)
    out: dict[str, cmp.PolicyFactory] = {}
    for name in names:
        config = _config_for(name, base, args, setup)

        def make(name: str = name, config: Any = config) -> Policy:
            return build_policy(name, config, profile)

        make()  # a bad combination fails here, before any replay runs
        out[name] = make
    return out


def _planner_config(args: argparse.Namespace) -> Any:
    try:
        from epp.planner.core.config import PlannerConfig, load_planner_file
    except ImportError:
        raise UsageError("--planner needs epp.planner.core.config, not in this build") from None

    if args.planner is None:
        return PlannerConfig()
    try:
        text = Path(args.planner).read_text(encoding="utf-8")
    except OSError as e:
        raise UsageError(f"{args.planner}: cannot read the planner file: {e.strerror}") from None
    return load_planner_file(text, args.planner)


def _file_keys(args: argparse.Namespace) -> frozenset[str]:
    """The keys the planner file sets (none without --planner; the file already parsed
    in `_planner_config`, so it is readable YAML)."""
    if args.planner is None:
        return frozenset()
    raw = yaml.safe_load(Path(args.planner).read_text(encoding="utf-8"))
    return frozenset(raw) if isinstance(raw, dict) else frozenset()


def _budget(args: argparse.Namespace, setup: cmp.Setup, peak: int | None) -> int | None:
    """The planners' GPU budget: the planner file's `max-gpu-budget` when it sets one,
    else twice static-peak's GPUs (`peak` replicas: given, or found by the comparison;
    the busiest intervals' size when the comparison has no static-peak), at least the
    library default of 8, which alone would cap a larger pool. A file that tunes other
    keys gets the budget a replay without one gets, not the library's 8 GPUs."""
    if "max-gpu-budget" in _file_keys(args):
        return _planner_config(args).budget.max_gpu_budget
    replicas = peak if peak is not None else setup.peak.replicas
    return max(8, 2 * replicas * setup.shape.gpus_per_replica)


def _config_for(name: str, base: Any, args: argparse.Namespace, setup: cmp.Setup) -> Any:
    """The planner file's settings with what the replay fixes for every policy: the
    mode, the SLA, the pool shape (aggregated), the start-up time the SLA mode plans
    for, the interval when given, and, unless the file sets them, a GPU budget of twice
    static-peak's and the preset's GPUs per replica."""
    planner = base.planner
    interval = args.interval
    if interval is None and planner.adjustment_interval is None and name != "load":
        interval = DEFAULT_INTERVAL_S
    planner = dataclasses.replace(
        planner,
        mode=MODE_OF[name],
        pool="aggregated",
        adjustment_interval=interval if interval is not None else planner.adjustment_interval,
    )
    # A file that tunes one option must not also cap the pool at the library's 8 GPUs
    # of one GPU a replica (8 replicas of a 4-GPU preset, whatever the trace needs).
    gpus = setup.shape.gpus_per_replica
    given = _file_keys(args)
    fixed = {
        "max_gpu_budget": ("max-gpu-budget", setup.budget_gpus),
        "decode_engine_num_gpu": ("decode-engine-num-gpu", gpus),
        "prefill_engine_num_gpu": ("prefill-engine-num-gpu", gpus),
    }
    budget = dataclasses.replace(
        base.budget, **{field: v for field, (key, v) in fixed.items() if key not in given}
    )
    load = base.load
    if name == "load" and args.planner is None:
        load = _profiled_load_thresholds(base.load, setup)
    return dataclasses.replace(
        base,
        planner=planner,
        budget=budget,
        load=load,
        sla=dataclasses.replace(base.sla, ttft=setup.sla.ttft_ms, itl=setup.sla.itl_ms),
        beyond=dataclasses.replace(base.beyond, startup_time=setup.shape.startup_s),
    )


def _profile(args: argparse.Namespace, base: Any, setup: cmp.Setup, say: _Say) -> Any:
    from epp.planner.core.perf import load_profile

    if args.profile:
        return load_profile(args.profile)
    if args.planner and Path(base.planner.profile_results_dir).is_dir():
        return load_profile(base.planner.profile_results_dir)
    say(f"profiling {setup.shape.sim.preset} in virtual time for the SLA policies ...")
    return _virtual_profile(setup, say.quiet)


def _profiled_load_thresholds(load: Any, setup: cmp.Setup) -> Any:
    """LOAD-v0 set up as its procedure says: the thresholds `epp profile` recommends for
    the preset at the comparison's SLA (Dynamo's May-2025 profiler formulas,
    `profiler.results.decode_kv_bounds` / `prefill_queue_bounds`)."""
    _, rec = _virtual_report(setup, quiet=True)
    return dataclasses.replace(
        load,
        decode_kv_scale_up_threshold=round(rec.decode_kv.upper, 2),
        decode_kv_scale_down_threshold=round(rec.decode_kv.lower, 2),
        prefill_queue_scale_up_threshold=round(rec.prefill_queue.upper, 2),
        prefill_queue_scale_down_threshold=round(rec.prefill_queue.lower, 2),
    )


_REPORTS: dict[tuple[str, float, float, int, int], tuple[Any, Any]] = {}


def _virtual_profile(setup: cmp.Setup, quiet: bool) -> Any:
    return _virtual_report(setup, quiet)[0]


def _virtual_report(setup: cmp.Setup, quiet: bool) -> tuple[Any, Any]:
    """(profile, recommendation), measured once per preset, SLA and target lengths."""
    key = (
        setup.shape.sim.preset, setup.sla.ttft_ms, setup.sla.itl_ms,
        setup.median_isl, setup.median_osl,
    )  # fmt: skip
    if key not in _REPORTS:
        _REPORTS[key] = _measure_profile(setup, quiet)
    return _REPORTS[key]


def _measure_profile(setup: cmp.Setup, quiet: bool) -> tuple[Any, Any]:
    """`epp profile --virtual-preset PRESET` in-process: the preset's own scheduler in
    virtual time, no sockets (the profiler's sweep, the planner's interpolators). The
    sweep's target lengths are the trace's median ISL and OSL, within the model's
    length; a toy preset (under 4k tokens) gets the profiler's quick sweep."""
    try:
        import asyncio

        from epp.planner.core.perf import Profile
        from epp.planner.profiler.driver import Sla as ProfilerSla
        from epp.planner.profiler.driver import profile
        from epp.planner.profiler.plan import SweepSettings
        from epp.planner.profiler.results import decode_arrays, prefill_arrays
        from epp.planner.profiler.sweep import ProgressBar
        from epp.planner.profiler.virtual import VirtualTarget
    except ImportError:
        raise UsageError(
            "the SLA policies (epp, dynamo) need a profile and the profiler is not in this "
            f"build: give --profile DIR (epp profile --virtual-preset {setup.shape.sim.preset}"
            " -o DIR)"
        ) from None
    sim = setup.shape.sim
    preset, sla, model_len = sim.preset, setup.sla, sim.model_len
    isl = max(1, min(setup.median_isl, model_len // 2))
    osl = max(2, min(setup.median_osl, model_len // 4))
    context = min(model_len, SweepSettings().max_context_length)
    quick = model_len < 4096
    settings = (
        SweepSettings.quick(isl=isl, osl=osl, max_context_length=context, decode_osl=osl)
        if quick
        else SweepSettings(isl=isl, osl=osl, max_context_length=context)
    )
    report = asyncio.run(
        profile(
            [VirtualTarget.for_preset(preset)],
            settings,
            ProfilerSla(sla.ttft_ms, sla.itl_ms),
            ProgressBar(enabled=not quiet),
        )
    )
    profile_ = Profile.from_arrays(
        prefill_arrays(report.prefill),
        decode_arrays(report.decode, report.decode_max_kv_tokens),
        source=f"virtual:{preset}",
    )
    return profile_, report.recommendation


# -- output ---------------------------------------------------------------------------


def _describe(setup: cmp.Setup, preset: str, args: argparse.Namespace, say: _Say) -> None:
    how = {
        "given": "given",
        "intervals": f"picked from the trace: {TTFT_HEADROOM:g}x p90 TTFT and "
        f"{ITL_HEADROOM:g}x p90 ITL of its busiest interval on a pool where more replicas "
        "stop helping, rounded up",
        "requests": "picked per request: the tightest at which static-peak keeps >= 99 % of "
        "requests within both and >= 95 % in every 5-minute window",
        "product": "the product target: " + PRODUCT_SLA_SOURCE + " unless --ttft/--itl or "
        "the planner file set it",
    }[setup.sla_rule]
    startup = (
        f"start-up sweep {args.sweep_startup} s"
        if args.sweep_startup
        else f"start-up {setup.shape.startup_s:g} s"
    )
    say(
        f"preset {preset}, {setup.shape.gpus_per_replica} GPU(s) per replica, {startup}, "
        f"interval {setup.interval_s:g} s"
    )
    say(f"SLA: {_sla_text(setup)} ({how})")
    say(
        f"static pools: peak from {setup.peak.replicas} replicas (busiest intervals; then "
        "the fewest keeping >= 99 % of requests within the SLA over the trace), "
        f"mean {setup.mean.replicas} (an interval at the mean rate, "
        f"{setup.mean.segment.arrivals} requests)"
    )


def print_intervals(s: Summary, setup: cmp.Setup) -> None:
    print(f"\n{s.policy}: per {setup.interval_s:g} s interval (requests by arrival)")
    print(
        f"{'t min':>6} {'ready':>5} {'start':>5} {'drain':>5} {'GPUs':>5} {'reqs':>5} "
        f"{'TTFT p50/p90/p99 ms':>21} {'ITL p50/p90/p99 ms':>19} {'met':>6}  SLA"
    )
    for r in s.rows:
        ttft = _triple(r.ttft_ms, 0)
        itl = _triple(r.itl_ms, 1)
        met = "" if math.isnan(r.met) else f"{r.met:.1%}"
        ok = "" if r.within is None else ("ok" if r.within else "MISS")
        print(
            f"{r.start / 60:6.1f} {r.ready:5d} {r.starting:5d} {r.draining:5d} "
            f"{r.gpus:5.1f} {r.requests:5d} {ttft:>21} {itl:>19} {met:>6}  {ok}"
        )


def print_comparison(results: Sequence[cmp.Result], setup: cmp.Setup) -> None:
    peak = next((r for r in results if r.summary.policy == "static-peak"), None)
    oracle = next((r for r in results if r.summary.policy == "oracle"), None)
    print(f"\nSLA {_sla_text(setup)}; intervals of {setup.interval_s:g} s")
    print(
        f"{'policy':<12} {'GPU-h':>7} {'vs peak':>7} {'intervals':>9} {'requests':>8} "
        f"{'worst 5m':>8} {'actions':>7} {'revers.':>7} {'lost':>4} {'>budget':>7} "
        f"{'vs oracle':>9} {'to min s':>8}  replicas"
    )
    for r in results:
        s = r.summary
        ratio = _ratio(s.gpu_hours, peak)
        lag = "-" if math.isnan(s.to_min_pool_s) else f"{s.to_min_pool_s:.0f}"
        print(
            f"{s.policy:<12} {s.gpu_hours:7.2f} {ratio:>7} {s.sla_intervals:9.1%} "
            f"{s.sla_requests:8.1%} {s.worst_window:8.1%} {s.actions:7d} {s.reversals:7d} "
            f"{s.lost:4d} {s.over_budget:7d} {_ratio(s.gpu_hours, oracle):>9} {lag:>8}  "
            f"{r.note or r.initial}"
        )
    rejected = max((r.summary.rejected for r in results), default=0)
    if rejected:
        print(
            f"({rejected} requests longer than the model's context were rejected by the "
            "server in every run and are left out of the shares)"
        )


def _sla_text(setup: cmp.Setup) -> str:
    """The SLA as its rule states it: per request, or the p90s of an interval."""
    sla = setup.sla
    if setup.sla_rule in ("requests", "product"):
        return f"per request TTFT <= {sla.ttft_ms:g} ms, ITL <= {sla.itl_ms:g} ms"
    return f"p90 TTFT <= {sla.ttft_ms:g} ms, p90 ITL <= {sla.itl_ms:g} ms"


def _ratio(gpu_hours: float, to: cmp.Result | None) -> str:
    if to is None or not to.summary.gpu_hours > 0:
        return "-"
    return f"{gpu_hours / to.summary.gpu_hours:.2f}"


def _run_doc(results: Sequence[cmp.Result], setup: cmp.Setup) -> dict[str, Any]:
    """One comparison as JSON: every policy's verdict, its GPU-hours as a ratio to
    static-peak's and the oracle's (null when that policy was not run), and the setup."""
    by_name = {r.summary.policy: r.summary.gpu_hours for r in results}

    def ratio(gpu_hours: float, name: str) -> float | None:
        base = by_name.get(name)
        return round(gpu_hours / base, 4) if base else None

    return {
        "policies": [
            r.summary.as_json()
            | {
                "initial_replicas": r.initial,
                "gpu_hours_vs_static_peak": ratio(r.summary.gpu_hours, "static-peak"),
                "gpu_hours_vs_oracle": ratio(r.summary.gpu_hours, "oracle"),
            }
            for r in results
        ],
        "sla": {
            "ttft_ms": setup.sla.ttft_ms,
            "itl_ms": setup.sla.itl_ms,
            "picked": setup.sla_picked,
            "rule": setup.sla_rule,
        },
        "interval_s": setup.interval_s,
        "startup_s": setup.shape.startup_s,
        "static_peak_replicas": next(
            (r.initial for r in results if r.summary.policy == "static-peak"), setup.peak.replicas
        ),
        "static_mean_replicas": setup.mean.replicas,
        "budget_gpus": setup.budget_gpus,
    }


def write_json(
    path: Path,
    results: Sequence[cmp.Result],
    setup: cmp.Setup,
    preset: str,
    meta: dict[str, Any] | None = None,
) -> None:
    _write(path, (meta or {}) | _run_doc(results, setup) | {"preset": preset})


def write_sweep_json(
    path: Path,
    runs: Sequence[tuple[cmp.Setup, Sequence[cmp.Result]]],
    preset: str,
    meta: dict[str, Any] | None = None,
) -> None:
    """`--sweep-startup`: one comparison per start-up delay under `startup_sweep`."""
    doc = (meta or {}) | {
        "preset": preset,
        "startup_sweep": [_run_doc(results, setup) for setup, results in runs],
    }
    _write(path, doc)


def _write(path: Path, doc: dict[str, Any]) -> None:
    try:
        path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    except OSError as e:
        raise UsageError(f"{path}: cannot write the JSON: {e.strerror}") from None


def _triple(stats: Any, digits: int) -> str:
    if stats.empty:
        return "-"
    return f"{stats.p50:.{digits}f}/{stats.p90:.{digits}f}/{stats.p99:.{digits}f}"


# -- small helpers ----------------------------------------------------------------------


def parse_duration(text: str, flag: str = "--time-limit") -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|m|h)?\s*", text)
    if not m:
        raise UsageError(f"{flag} {text!r}: expected a duration like 600, 90s, 10m or 1h")
    value = float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]
    if value <= 0:
        raise UsageError(f"{flag} must be positive")
    return value


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


class _Say:
    """Progress and notes on stderr (results go to stdout)."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet

    def __call__(self, text: str) -> None:
        if not self.quiet:
            print(text, file=sys.stderr, flush=True)

    def progress(self, name: str) -> Progress | None:
        if self.quiet:
            return None
        last = [0.0]

        def report(now: float, end: float) -> None:
            wall = time.monotonic()
            if wall - last[0] >= 2.0 or now >= end:
                last[0] = wall
                pct = 100.0 * now / end if end > 0 else 100.0
                # one write per line: replays in parallel processes share stderr
                sys.stderr.write(
                    f"  {name}: {now / 60:6.1f} of {end / 60:.1f} min ({pct:3.0f} %)\n"
                )
                sys.stderr.flush()

        return report

    def done(self, name: str, result: cmp.Result, cpu_s: float) -> None:
        """A replay's end: its speed in requests per CPU second."""
        if self.quiet:
            return
        n = len(result.run.served) + len(result.run.rejected)
        rate = f"{n / cpu_s:,.0f} requests/s" if cpu_s > 0 else "-"
        sys.stderr.write(f"  {name}: done, {n} requests in {cpu_s:.1f} s CPU ({rate})\n")
        sys.stderr.flush()
