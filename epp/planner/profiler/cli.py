"""`epp profile`: measure endpoints, recommend one per role, write the planner's data.

    epp profile --url http://127.0.0.1:8000 --ttft 200 --itl 20 -o profile/
    epp profile --url http://a:8000 --gpus 1 --url http://b:8000 --gpus 4 ... -o profile/
    epp profile --virtual-preset llama-3.1-8b-h100 --ttft 200 --itl 20 -o profile/

Writes, in `-o DIR` (Dynamo's layout, reference dynamo-planner.md §3-4):
`selected_prefill_interpolation/raw_data.npz`, `selected_decode_interpolation/raw_data.npz`,
the JSON fallback `prefill_raw_data.json` and `decode_raw_data.json`,
`prefill_performance.png` and `decode_performance.png` (with matplotlib), and
`summary.json` (the comparison and the recommendation). Prints the comparison table and
Dynamo's recommendation lines on stdout; the progress bar goes to stderr.

Exit status: 0; 2 for bad flags or an endpoint that cannot be measured (one line on
stderr); also 2 when no endpoint meets the SLA: the data are still written (they
describe the endpoints whatever the SLA) and the recommendation is the lowest-latency
one, as Dynamo's profiler falls back, but a script must not deploy it unnoticed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from epp.planner.profiler import plots
from epp.planner.profiler.driver import ProfileReport, Sla, Target, profile
from epp.planner.profiler.plan import PlanError, SweepSettings
from epp.planner.profiler.results import (
    CHUNK_ITL_SHARE,
    Endpoint,
    comparison_table,
    decode_arrays,
    json_ready,
    long_prefill_threshold,
    prefill_arrays,
)
from epp.planner.profiler.sweep import HttpTarget, ProgressBar, SweepError, open_session
from epp.sim import presets

PREFILL_DIR = "selected_prefill_interpolation"
DECODE_DIR = "selected_decode_interpolation"
DEFAULTS = SweepSettings()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--url", action="append", default=[], metavar="URL",
        help="an OpenAI server to measure (repeat to compare several)",
    )  # fmt: skip
    p.add_argument(
        "--gpus", action="append", type=int, default=[], metavar="N",
        help="GPUs behind each --url (once for all, or once per --url in order; default 1)",
    )  # fmt: skip
    p.add_argument(
        "--label", action="append", default=[], metavar="NAME",
        help="name of each --url in the recommendation (default TP:<gpus>)",
    )  # fmt: skip
    p.add_argument(
        "--virtual-preset", metavar="NAME",
        help="profile an `epp sim` preset in virtual time instead of a server",
    )  # fmt: skip
    p.add_argument("--ttft", type=float, default=50.0, help="TTFT SLA in ms (Dynamo's default 50)")
    p.add_argument("--itl", type=float, default=10.0, help="ITL SLA in ms (Dynamo's default 10)")
    p.add_argument("--isl", type=int, default=DEFAULTS.isl, help="target input length (3000)")
    p.add_argument("--osl", type=int, default=DEFAULTS.osl, help="target output length (500)")
    p.add_argument(
        "--max-context-length", type=int, default=DEFAULTS.max_context_length,
        help="longest prompt swept, capped by the server's max_model_len (16384)",
    )  # fmt: skip
    p.add_argument(
        "--prefill-granularity", type=int,
        help=f"prefill ISL points (default {DEFAULTS.prefill_granularity}; --quick 4)",
    )  # fmt: skip
    p.add_argument(
        "--decode-granularity", type=int,
        help=f"decode ISLs and in-flight counts (default {DEFAULTS.decode_granularity}; --quick 3)",
    )  # fmt: skip
    p.add_argument(
        "--decode-osl", type=int,
        help=f"output tokens per decode-sweep stream (default {DEFAULTS.decode_osl}; --quick 100)",
    )  # fmt: skip
    p.add_argument(
        "--repeats", type=int,
        help=f"prompts per prefill point, median taken (default {DEFAULTS.repeats}; --quick 1)",
    )  # fmt: skip
    p.add_argument(
        "--max-concurrency", type=int, default=DEFAULTS.max_concurrency,
        help="most decode streams at once (Dynamo's cap: 2000)",
    )  # fmt: skip
    p.add_argument("--quick", action="store_true", help="few points: a smoke run, not a profile")
    p.add_argument(
        "--time-scale", type=float, default=1.0,
        help="the server's `epp sim --time-scale`: measured times are multiplied by it",
    )  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="seed of the random prompts")
    p.add_argument("-o", "--output-dir", required=True, type=Path, help="where to write")
    p.add_argument("--no-plots", action="store_true", help="do not draw the PNGs")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def settings_from_args(args: argparse.Namespace) -> SweepSettings:
    base = SweepSettings.quick() if args.quick else SweepSettings()
    given = {
        k: getattr(args, k)
        for k in ("prefill_granularity", "decode_granularity", "decode_osl", "repeats")
        if getattr(args, k) is not None
    }
    settings = replace(
        base,
        isl=args.isl,
        osl=args.osl,
        max_context_length=args.max_context_length,
        max_concurrency=args.max_concurrency,
        **given,
    )
    settings.check()
    return settings


def endpoints_from_args(args: argparse.Namespace) -> list[Endpoint]:
    urls = args.url
    gpus = args.gpus or [1]
    if len(gpus) == 1:
        gpus = gpus * len(urls)
    if len(gpus) != len(urls):
        raise ValueError(f"--gpus given {len(args.gpus)} times for {len(urls)} --url: give it"
                         " once (all) or once per --url")  # fmt: skip
    if any(g < 1 for g in gpus):
        raise ValueError("--gpus must be >= 1")
    labels = args.label
    if labels and len(labels) != len(urls):
        raise ValueError(f"--label given {len(labels)} times for {len(urls)} --url")
    for u in urls:
        if not u.startswith(("http://", "https://")):
            raise ValueError(f"--url {u!r} is not an http(s) URL")
    out = [
        Endpoint(u.rstrip("/"), g, labels[i] if labels else "")
        for i, (u, g) in enumerate(zip(urls, gpus, strict=True))
    ]
    names = [e.name for e in out]
    return [
        replace(e, label=f"{e.name}#{i + 1}") if names.count(e.name) > 1 else e
        for i, e in enumerate(out)
    ]


def check_args(args: argparse.Namespace) -> None:
    if bool(args.url) == bool(args.virtual_preset):
        raise ValueError("give --url (one or more) or --virtual-preset, not both or neither")
    if args.virtual_preset:
        presets.get(args.virtual_preset)  # ValueError names the known ones
        if args.label or len(args.gpus) > 1:
            raise ValueError("--virtual-preset takes at most one --gpus and no --label")
        if args.time_scale != 1.0 or args.seed != 0:
            raise ValueError(
                "--time-scale and --seed apply to --url (virtual time has no scale, and its"
                " prompts are distinct by construction)"
            )
    if args.ttft <= 0 or args.itl <= 0:
        raise ValueError("--ttft and --itl must be > 0 (milliseconds)")
    if args.time_scale <= 0:
        raise ValueError("--time-scale must be > 0")


async def run_profile(args: argparse.Namespace, settings: SweepSettings) -> ProfileReport:
    sla = Sla(args.ttft, args.itl)
    bar = ProgressBar(enabled=not args.no_progress)
    if args.virtual_preset:
        from epp.planner.profiler.virtual import VirtualTarget

        gpus = args.gpus[0] if args.gpus else None
        target: Target = VirtualTarget.for_preset(args.virtual_preset, gpus)
        return await profile([target], settings, sla, bar)
    async with open_session() as session:
        targets: list[Target] = [
            HttpTarget(e, session, time_scale=args.time_scale, seed=args.seed + i)
            for i, e in enumerate(endpoints_from_args(args))
        ]
        return await profile(targets, settings, sla, bar)


def engine_flags(report: ProfileReport) -> dict[str, str]:
    """vLLM flags the SLA asks of the engine itself (`results.long_prefill_threshold`)."""
    tokens = long_prefill_threshold(report.prefill, report.recommendation.itl_sla_ms)
    return {} if tokens is None else {"long-prefill-token-threshold": str(tokens)}


def summary(report: ProfileReport) -> dict[str, Any]:
    rec = report.recommendation
    candidates = []
    for c in report.candidates:
        prefill = {
            "isl": c.prefill.isl,
            "ttft_ms": c.prefill.ttft_ms,
            "thpt_per_gpu": c.prefill.thpt_per_gpu,
        }
        decode = [
            {
                "num_request": p.load.num_request,
                "isl": p.load.isl,
                "osl": p.load.osl,
                "itl_ms": p.itl_ms,
                "thpt_per_gpu": p.thpt_per_gpu,
            }
            for p in c.decode
        ]
        candidates.append(
            {
                "endpoint": c.endpoint.url,
                "name": c.endpoint.name,
                "num_gpus": c.endpoint.num_gpus,
                "max_kv_tokens": c.max_kv_tokens,
                "prefill": prefill,
                "decode": decode,
            }
        )
    return {
        "candidates": candidates,
        "sla": {"ttft_ms": rec.ttft_sla_ms, "itl_ms": rec.itl_sla_ms},
        "prefill": {
            "endpoint": rec.prefill.candidate.endpoint.url,
            "meets_sla": rec.prefill.meets_sla,
        },
        "decode": {
            "endpoint": rec.decode.candidate.endpoint.url,
            "meets_sla": rec.decode.meets_sla,
            "num_request": rec.decode.num_request,
        },
        "planner_flags": rec.planner_flags(),
        "engine_flags": engine_flags(report),
        "lines": rec.lines(),
        "sweep": {
            "prefill": [
                {"isl": p.isl, "ttft_ms": p.ttft_ms, "server_ttft_ms": p.server_ttft_ms}
                for p in report.prefill
            ],
            "decode": [
                {
                    "isl": p.load.isl,
                    "osl": p.load.osl,
                    "num_request": p.load.num_request,
                    "itl_ms": p.itl_ms,
                    "server_itl_ms": p.server_itl_ms,
                    "thpt_per_gpu": p.thpt_per_gpu,
                }
                for p in report.decode
            ],
        },
    }


def write_outputs(report: ProfileReport, out: Path) -> list[Path]:
    prefill = prefill_arrays(report.prefill)
    decode = decode_arrays(report.decode, report.decode_max_kv_tokens)
    written = []
    for sub, arrays, name in (
        (PREFILL_DIR, prefill, "prefill_raw_data.json"),
        (DECODE_DIR, decode, "decode_raw_data.json"),
    ):
        (out / sub).mkdir(parents=True, exist_ok=True)
        np.savez(out / sub / "raw_data.npz", **arrays)
        (out / name).write_text(json.dumps(json_ready(arrays), indent=1) + "\n")
        written += [out / sub / "raw_data.npz", out / name]
    (out / "summary.json").write_text(json.dumps(summary(report), indent=1) + "\n")
    written.append(out / "summary.json")
    return written


def run(args: argparse.Namespace) -> int:
    try:
        check_args(args)
        settings = settings_from_args(args)
        if args.url:
            endpoints_from_args(args)
        args.output_dir.mkdir(parents=True, exist_ok=True)
    except (ValueError, OSError) as e:
        print(f"epp profile: {e}", file=sys.stderr)
        return 2
    try:
        report = asyncio.run(run_profile(args, settings))
    except (SweepError, PlanError, ValueError, RuntimeError) as e:
        print(f"\nepp profile: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nepp profile: interrupted; nothing written", file=sys.stderr)
        return 130
    paths = write_outputs(report, args.output_dir)
    if not args.no_plots:
        try:
            paths += plots.write_plots(report, args.output_dir)
        except plots.PlotsUnavailable as e:
            print(f"epp profile: {e}", file=sys.stderr)
    rec = report.recommendation
    print(comparison_table(report.candidates, ttft_ms=rec.ttft_sla_ms, itl_ms=rec.itl_sla_ms))
    for line in rec.lines():
        print(line)
    engine = engine_flags(report)
    if engine:
        print(
            "Suggested engine flags: "
            + " ".join(f"--{k} {v}" for k, v in engine.items())
            + f" (a long prompt's step within {CHUNK_ITL_SHARE:.0%} of the ITL target)"
        )
    print("wrote " + ", ".join(str(p) for p in paths))
    if not rec.meets_sla:
        print(
            "epp profile: no endpoint meets the SLA (see above); data written, exit 2",
            file=sys.stderr,
        )
        return 2
    return 0
