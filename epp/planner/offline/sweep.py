"""`epp plan replay --compare --sweep`: each law over its main knob, judged as a frontier.

One setting of a law is one point (GPU-hours, share of requests within both SLAs). A
law's documented set-up may sit anywhere on its curve, so comparing one point per law
compares set-ups, not laws; its frontier (the settings no other setting of the same law
beats on both axes) is what the law can do on this trace. The headline compares, per
policy, the cheapest point that keeps at least `TARGET` (99 %) of the requests within
both SLAs (none: the law cannot reach it at any swept setting).

Pure: the caller replays the variants (`compare.run_factory`) and prints.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from epp.planner.offline.compare import Result

TARGET = 0.99


@dataclass(frozen=True, slots=True)
class Point:
    policy: str
    setting: str  # the knob's value, e.g. "target 5"
    gpu_hours: float
    sla_requests: float  # 0..1
    worst_window: float  # 0..1
    documented: bool = False  # the set-up the law's documentation prescribes

    @classmethod
    def of(cls, result: Result, setting: str, documented: bool = False) -> Point:
        s = result.summary
        return cls(s.policy, setting, s.gpu_hours, s.sla_requests, s.worst_window, documented)

    def as_json(self) -> dict[str, object]:
        return {
            "policy": self.policy,
            "setting": self.setting,
            "gpu_hours": round(self.gpu_hours, 4),
            "sla_requests": round(self.sla_requests, 4),
            "worst_5min_requests": round(self.worst_window, 4),
            "documented": self.documented,
        }


def frontier(points: Iterable[Point]) -> list[Point]:
    """The points no other point beats on both axes (fewer or equal GPU-hours and a
    higher or equal share, one strictly), cheapest first; of equal points the first."""
    pts = list(points)
    out: list[Point] = []
    for p in pts:
        dominated = any(
            (q.gpu_hours <= p.gpu_hours and q.sla_requests >= p.sla_requests)
            and (q.gpu_hours < p.gpu_hours or q.sla_requests > p.sla_requests)
            for q in pts
        )
        tie = any((q.gpu_hours, q.sla_requests) == (p.gpu_hours, p.sla_requests) for q in out)
        if not dominated and not tie:
            out.append(p)
    return sorted(out, key=lambda p: (p.gpu_hours, p.sla_requests))


def cheapest_at(points: Iterable[Point], target: float = TARGET) -> Point | None:
    """The fewest GPU-hours among the points keeping at least `target` of requests."""
    ok = [p for p in points if p.sla_requests >= target]
    return min(ok, key=lambda p: (p.gpu_hours, -p.sla_requests)) if ok else None


def by_policy(points: Sequence[Point]) -> dict[str, list[Point]]:
    out: dict[str, list[Point]] = {}
    for p in points:
        out.setdefault(p.policy, []).append(p)
    return out


def frontier_lines(points: Sequence[Point], target: float = TARGET) -> list[str]:
    """Per policy: its frontier (GPU-hours, share; `*` marks the documented set-up),
    then the headline line: the cheapest point at `target` of each."""
    lines: list[str] = []
    groups = by_policy(points)
    for name, pts in groups.items():
        front = frontier(pts)
        cells = ", ".join(
            f"{p.setting}{'*' if p.documented else ''}: {p.gpu_hours:.1f} GPU-h "
            f"{p.sla_requests:.2%}"
            for p in front
        )
        lines.append(f"frontier {name:<12} {cells}")
    lines.append(f"cheapest at >= {target:.0%} of requests within both SLAs:")
    for name, pts in groups.items():
        best = cheapest_at(pts, target)
        if best is None:
            top = max(pts, key=lambda p: p.sla_requests)
            lines.append(
                f"  {name:<12} none of {len(pts)} settings (best {top.sla_requests:.2%} "
                f"at {top.setting})"
            )
        else:
            lines.append(
                f"  {name:<12} {best.gpu_hours:.2f} GPU-h at {best.setting} "
                f"({best.sla_requests:.2%}, worst 5 min {best.worst_window:.1%})"
            )
    return lines


def sweep_json(points: Sequence[Point], target: float = TARGET) -> dict[str, object]:
    out: dict[str, object] = {}
    for name, pts in by_policy(points).items():
        best = cheapest_at(pts, target)
        out[name] = {
            "points": [p.as_json() for p in pts],
            "frontier": [p.setting for p in frontier(pts)],
            "cheapest_at_target": None if best is None else best.as_json(),
        }
    return {"target": target, "policies": out}
