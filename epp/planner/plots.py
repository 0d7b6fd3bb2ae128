"""The replay's plots: the timeline (replicas and latency over time, one line per
policy) and the Pareto view (GPU-hours against request attainment, one point per policy
and start-up delay).

I/O (matplotlib, writes a PNG); the numbers come from `outcome.Summary`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from epp.planner.offline.compare import Result, Setup
    from epp.planner.offline.outcome import Sla


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


@dataclass(frozen=True, slots=True)
class ParetoPoint:
    """One policy at one start-up delay (`static`: the same at every delay)."""

    policy: str
    startup_s: float
    gpu_hours: float
    sla_requests: float  # 0..1
    static: bool = False


def pareto_points(runs: Sequence[tuple[Setup, Sequence[Result]]]) -> list[ParetoPoint]:
    """The points of a comparison (or a start-up sweep of them)."""
    return [
        ParetoPoint(
            r.summary.policy,
            setup.shape.startup_s,
            r.summary.gpu_hours,
            r.summary.sla_requests,
            static=r.summary.policy.startswith("static"),
        )
        for setup, results in runs
        for r in results
    ]


def plot_pareto(
    path: Path,
    points: Sequence[ParetoPoint],
    *,
    title: str = "",
    sla: Sla | None = None,
    sweeps: Sequence[Any] = (),
) -> None:
    """One point per policy and start-up delay: x = GPU-hours, y = share of requests
    meeting both SLAs. A policy keeps its colour, a start-up delay its marker (a static
    pool, the same at every delay, is drawn once as a circle); the points no other
    beats on both axes (the Pareto front) are joined."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 6))
    names = list(dict.fromkeys(p.policy for p in points))
    startups = sorted({p.startup_s for p in points if not p.static})
    drawn: set[tuple[str, float, float]] = set()
    xy: list[tuple[float, float]] = []
    for p in points:
        key = (p.policy, p.gpu_hours, p.sla_requests)
        if key in drawn:
            continue
        drawn.add(key)
        x, y = p.gpu_hours, 100 * p.sla_requests
        marker = "o" if p.static else MARKERS[startups.index(p.startup_s) % len(MARKERS)]
        ax.scatter(x, y, color=f"C{names.index(p.policy) % 10}", marker=marker, s=50)
        label = p.policy if p.static else f"{p.policy} {p.startup_s:g}s"
        ax.annotate(label, (x, y), fontsize=7, xytext=(4, 3), textcoords="offset points")
        xy.append((x, y))
    front = sorted(q for q in xy if not any(o != q and o[0] <= q[0] and o[1] >= q[1] for o in xy))
    if len(front) > 1:
        ax.plot(*zip(*front, strict=True), color="0.6", lw=1, ls=":", zorder=0)
    _draw_frontiers(ax, sweeps, names)
    for i, name in enumerate(names):
        ax.scatter([], [], color=f"C{i % 10}", marker="o", label=name)
    for j, startup in enumerate(startups):
        ax.scatter(
            [], [], color="k", marker=MARKERS[j % len(MARKERS)], label=f"start-up {startup:g} s"
        )
    ax.set_xlabel("GPU-hours (starting and draining replicas included)")
    ax.set_ylabel("requests within both SLAs (%)")
    ax.set_title(pareto_title(title, sla))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def pareto_title(title: str, sla: Sla | None) -> str:
    """The Pareto view's title: the SLA is judged per request (both TTFT and ITL within
    it, `outcome.Sla.met`), which is what the y axis counts, not a percentile."""
    head = f"{title}: " if title else ""
    if sla is not None:
        head += f"SLA per request TTFT <= {sla.ttft_ms:g} ms, ITL <= {sla.itl_ms:g} ms "
    return head + "(up and left is better)"


def _draw_frontiers(ax: Any, sweeps: Sequence[Any], names: list[str]) -> None:
    """`--sweep`: each policy's swept settings as small dots in its colour, its frontier
    (`offline.sweep.frontier`) as a line through them, the 99 % bar dashed."""
    from epp.planner.offline.sweep import by_policy, frontier

    if not sweeps:
        return
    for name, pts in by_policy(sweeps).items():
        if name not in names:
            names.append(name)
        colour = f"C{names.index(name) % 10}"
        ax.scatter(
            [p.gpu_hours for p in pts], [100 * p.sla_requests for p in pts],
            color=colour, marker=".", s=25,
        )  # fmt: skip
        front = frontier(pts)
        if len(front) > 1:
            ax.plot(
                [p.gpu_hours for p in front], [100 * p.sla_requests for p in front],
                color=colour, lw=1.2,
            )  # fmt: skip
    ax.axhline(99.0, color="0.4", lw=0.8, ls="--")
