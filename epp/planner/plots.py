"""The replay's plots: the timeline (replicas and latency over time, one line per
policy) and the Pareto view (GPU-hours against request attainment, one point per policy
and start-up delay; issue 15 item 5).

I/O (matplotlib, writes a PNG); the numbers come from `outcome.Summary`.
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


MARKERS = "os^Dv<>Ph*X"


def plot_pareto(
    path: Path, runs: Sequence[tuple[Setup, Sequence[Result]]], *, title: str = ""
) -> None:
    """One point per policy and start-up delay: x = GPU-hours, y = share of requests
    meeting both SLAs. A policy keeps its colour, a start-up delay its marker; the
    policies no other point beats on both axes (the Pareto front) are joined."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 6))
    names: list[str] = []
    startups: list[float] = []
    points: list[tuple[float, float]] = []
    for setup, results in runs:
        startup = setup.shape.startup_s
        if startup not in startups:
            startups.append(startup)
        marker = MARKERS[startups.index(startup) % len(MARKERS)]
        for res in results:
            s = res.summary
            if s.policy not in names:
                names.append(s.policy)
            color = f"C{names.index(s.policy) % 10}"
            ax.scatter(s.gpu_hours, 100 * s.sla_requests, color=color, marker=marker, s=50)
            ax.annotate(
                f"{s.policy} {startup:g}s",
                (s.gpu_hours, 100 * s.sla_requests),
                fontsize=7,
                xytext=(4, 3),
                textcoords="offset points",
            )
            points.append((s.gpu_hours, 100 * s.sla_requests))
    front = sorted(
        p for p in points if not any(q != p and q[0] <= p[0] and q[1] >= p[1] for q in points)
    )
    if len(front) > 1:
        ax.plot(*zip(*front, strict=True), color="0.6", lw=1, ls=":", zorder=0)
    for i, name in enumerate(names):
        ax.scatter([], [], color=f"C{i % 10}", marker="o", label=name)
    for j, startup in enumerate(startups):
        ax.scatter(
            [], [], color="k", marker=MARKERS[j % len(MARKERS)], label=f"start-up {startup:g} s"
        )
    sla = runs[0][0].sla if runs else None
    ax.set_xlabel("GPU-hours (starting and draining replicas included)")
    ax.set_ylabel("requests within both SLAs (%)")
    head = f"{title}: " if title else ""
    if sla is not None:
        head += f"SLA p90 TTFT {sla.ttft_ms:g} ms, ITL {sla.itl_ms:g} ms"
    ax.set_title(head + " (up and left is better)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
