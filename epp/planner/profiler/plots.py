"""The profiler's two figures, after Dynamo's (Dynamo's `prefill_performance.png` and
`decode_performance.png`, `benchmarks/profiler/utils/plot.py`).

- prefill: TTFT and prefill tokens/s/GPU against ISL (the in-depth sweep of the chosen
  endpoint), the TTFT SLA as a line, every compared endpoint's point at the target ISL;
- decode: ITL against decode tokens/s/GPU, one curve per context length (in-flight
  requests grow along it), the compared endpoints' curves at the target ISL/OSL
  dashed, the ITL SLA as a line.

matplotlib is an optional dependency (the `dev` extra): without it `write_plots`
raises `PlotsUnavailable` naming the fix, and the caller skips the figures.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from epp.planner.profiler.driver import ProfileReport

PREFILL_PNG = "prefill_performance.png"
DECODE_PNG = "decode_performance.png"


class PlotsUnavailable(RuntimeError):
    pass


def _pyplot():  # type: ignore[no-untyped-def]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotsUnavailable(
            "matplotlib is not installed (pip install matplotlib, or the 'dev' extra):"
            " plots skipped"
        ) from None
    return plt


def write_plots(report: ProfileReport, out_dir: Path) -> list[Path]:
    plt = _pyplot()
    rec = report.recommendation
    paths = [out_dir / PREFILL_PNG, out_dir / DECODE_PNG]

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    isl = [p.isl for p in report.prefill]
    chosen = rec.prefill.candidate.endpoint.name
    ax1.plot(isl, [p.ttft_ms for p in report.prefill], "o-", label=f"{chosen} sweep")
    ax2.plot(isl, [p.thpt_per_gpu for p in report.prefill], "o-", label=f"{chosen} sweep")
    for c in report.candidates:
        ax1.plot([c.prefill.isl], [c.prefill.ttft_ms], "s", label=f"{c.endpoint.name} @ ISL")
        ax2.plot([c.prefill.isl], [c.prefill.thpt_per_gpu], "s", label=f"{c.endpoint.name}")
    ax1.axhline(rec.ttft_sla_ms, color="red", ls="--", lw=1, label="TTFT SLA")
    ax1.set(xlabel="ISL (tokens)", ylabel="TTFT (ms)", title="Prefill TTFT, batch size 1")
    ax2.set(xlabel="ISL (tokens)", ylabel="tokens/s/GPU", title="Prefill throughput per GPU")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(paths[0], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    by_ctx: dict[float, list] = defaultdict(list)
    for p in report.decode:
        by_ctx[p.load.context_length].append(p)
    for ctx, points in sorted(by_ctx.items()):
        points.sort(key=lambda p: p.load.num_request)
        ax.plot(
            [p.thpt_per_gpu for p in points],
            [p.itl_ms for p in points],
            "o-",
            ms=4,
            label=f"context {ctx:g}",
        )
    for c in report.candidates:
        ax.plot(
            [p.thpt_per_gpu for p in c.decode],
            [p.itl_ms for p in c.decode],
            "s--",
            ms=5,
            label=f"{c.endpoint.name} @ ISL/OSL",
        )
    ax.axhline(rec.itl_sla_ms, color="red", ls="--", lw=1, label="ITL SLA")
    ax.set(
        xlabel="decode tokens/s/GPU",
        ylabel="ITL (ms)",
        title=f"Decode ITL vs throughput ({rec.decode.candidate.endpoint.name}; in-flight"
        " requests grow along each curve)",
    )
    ax.title.set_fontsize(9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(paths[1], dpi=110)
    plt.close(fig)
    return paths
