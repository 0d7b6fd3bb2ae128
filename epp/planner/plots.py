"""The replay's timeline plot: replicas and latency over time, one line per policy.

I/O (matplotlib, writes a PNG); the numbers come from `outcome.Summary.rows`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from epp.planner.compare import Result, Setup


def plot_replay(path: Path, results: Sequence[Result], setup: Setup) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(11, 9), sharex=True)
    gpus_ax, ttft_ax, itl_ax = axes
    for i, res in enumerate(results):
        s = res.summary
        xs = [r.start / 60 for r in s.rows]
        color = f"C{i}"
        label = f"{s.policy} ({s.gpu_hours:.2f} GPU-h, {s.sla_intervals:.0%} intervals)"
        gpus_ax.step(xs, [r.gpus for r in s.rows], where="post", color=color, label=label)
        ttft_ax.plot(xs, [r.ttft_ms.p90 for r in s.rows], color=color, lw=1, marker=".", ms=3)
        itl_ax.plot(xs, [r.itl_ms.p90 for r in s.rows], color=color, lw=1, marker=".", ms=3)
    sla = setup.sla
    ttft_ax.axhline(sla.ttft_ms, color="k", ls="--", lw=1, label=f"SLA {sla.ttft_ms:g} ms")
    itl_ax.axhline(sla.itl_ms, color="k", ls="--", lw=1, label=f"SLA {sla.itl_ms:g} ms")
    gpus_ax.set_ylabel("GPUs held (mean per interval)")
    ttft_ax.set_ylabel("p90 TTFT (ms)")
    ttft_ax.set_yscale("log")
    itl_ax.set_ylabel("p90 ITL (ms)")
    itl_ax.set_xlabel("trace time (min)")
    gpus_ax.legend(fontsize=8, loc="upper left")
    ttft_ax.legend(fontsize=8)
    itl_ax.legend(fontsize=8)
    gpus_ax.set_title(
        f"epp plan replay: {setup.shape.sim.preset}, start-up {setup.shape.startup_s:g} s, "
        f"{setup.interval_s:g} s intervals"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
