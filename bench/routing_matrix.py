"""The workload matrix's verdict (`epp bench routing --matrix`): every setup's ratio to
Envoy round-robin per scenario and rate, whether the new default (`epp-sticky`,
config/prefix-aware.yaml) is within the target's margins of the best cache-blind setup
(round-robin, least-request, EPP load-only: TTFT p90/p99 within 5 %, output tokens/s within
2 %), and the scenario x setup plot. Loaded by path from bench/routing.py."""

from __future__ import annotations

BLIND = ("rr", "lr", "epp-load")
NEW = "epp-sticky"

# "Sustainable" (made a rule): a stage
# is sustained when the setup (1) served what was offered: output tokens/s >= SERVED x
# offered requests/s x output tokens per request, with errors <= ERRORS of its requests,
# and (2) did not build a queue during it: the TTFT p90 of the requests arriving in the
# stage's second half is not above GROWTH x that of its first half, unless the rise is
# under FLOOR_S (model time; a 20 -> 31 ms wobble of ~25 requests is not a queue). A
# setup's knee is its highest rate whose stage and every lower one are sustained.
SERVED, ERRORS, GROWTH, FLOOR_S = 0.95, 0.01, 1.5, 0.05
# The prefix win (the bar): >= WIN_TOKS x round-robin's output tokens/s, each at
# its own knee, or TTFT p90 <= 1 / WIN_TTFT of round-robin's at round-robin's knee.
WIN_TOKS, WIN_TTFT = 2.0, 10.0


def halves(arrivals_ttfts: list[tuple[float, float]], mid: float) -> dict[str, float | None]:
    """TTFT p90 of the requests that arrived before and after `mid` (the stage's middle)."""

    def p90(values: list[float]) -> float | None:
        values = sorted(values)
        return values[min(len(values) - 1, int(0.9 * len(values)))] if values else None

    first = [t for at, t in arrivals_ttfts if at < mid]
    second = [t for at, t in arrivals_ttfts if at >= mid]
    return {"ttft_p90_first": p90(first), "ttft_p90_second": p90(second)}


def sustained(row: dict) -> tuple[bool, str]:
    """Whether one stage was sustained (see SERVED, GROWTH), and why not."""
    want = row["offered"] * row.get("output_tokens", 0)
    if want > 0 and row["tok_s"] < SERVED * want:
        return False, f"served {row['tok_s'] / want:.0%} of the offered tokens"
    if row["requests"] and row["errors"] > ERRORS * row["requests"]:
        return False, f"{row['errors']} errors"
    h1, h2 = row.get("ttft_p90_first"), row.get("ttft_p90_second")
    if h1 and h2 and h2 > GROWTH * h1 and h2 - h1 > FLOOR_S:
        return False, f"TTFT p90 grew {h2 / h1:.1f}x within the stage"
    return True, "ok"


def knee(rows: list[dict], scenario: str, setup: str) -> tuple[float | None, bool]:
    """The setup's highest sustained rate in the scenario (None: not even the lowest), and
    whether that is its highest stage (then the knee is at least that rate)."""
    mine = sorted(
        (r for r in rows if r["scenario"] == scenario and r["setup"] == setup),
        key=lambda r: r["rate"],
    )
    best = None
    for r in mine:
        if not sustained(r)[0]:
            return best, False
        best = r["rate"]
    return best, True


def prefix_win(rows: list[dict], scenario: str) -> str:
    """The new default against round-robin: knees, the throughput ratio at each one's knee
    and the TTFT p90 ratio at round-robin's knee, and whether it is a win."""
    k = by_key(rows)
    present = {r["setup"] for r in rows if r["scenario"] == scenario}
    if not {"rr", NEW} <= present:
        return f"needs rr and {NEW} rows"
    rr_knee, rr_top = knee(rows, scenario, "rr")
    new_knee, new_top = knee(rows, scenario, NEW)
    if rr_knee is None:
        return "round-robin sustains none of the rates: lower them"
    if new_knee is None:
        return f"rr knee {rr_knee:g}; {NEW} sustains none"
    rr_at, new_at = k[(scenario, rr_knee, "rr")], k.get((scenario, new_knee, NEW))
    toks = ratio(new_at["tok_s"] if new_at else None, rr_at["tok_s"])
    same = k.get((scenario, rr_knee, NEW))
    ttft = ratio(same["ttft_p90"] if same else None, rr_at["ttft_p90"])
    win = (toks is not None and toks >= WIN_TOKS) or (ttft is not None and ttft <= 1 / WIN_TTFT)
    ge = "≥ " if new_top else ""
    note = "; rr sustains every rate: raise them to find its knee" if rr_top else ""
    return (
        f"rr knee {rr_knee:g}, {NEW} knee {ge}{new_knee:g} req/s; tok/s at the knees "
        f"{ge}{toks:.2f}x, TTFT p90 at rr's knee {ttft:.2f}x → "
        f"{'WIN' if win else 'no win'}{note}"
    )


def knee_table(rows: list[dict]) -> str:
    """Per scenario: round-robin's highest sustainable rate and the prefix-win verdict."""
    out = [
        f"Knees (sustained: tok/s >= {SERVED:.0%} of offered, errors <= {ERRORS:.0%}, TTFT "
        f"p90 2nd half <= {GROWTH:g}x 1st or +{FLOOR_S * 1000:.0f} ms) and the prefix win "
        f"(>= {WIN_TOKS:g}x tok/s at the knee or <= 1/{WIN_TTFT:g} TTFT p90 at rr's knee)\n",
        "| scenario | verdict |",
        "|---|---|",
    ]
    for scenario in dict.fromkeys(r["scenario"] for r in rows):
        out.append(f"| {scenario} | {prefix_win(rows, scenario)} |")
    return "\n".join(out)


def by_key(rows: list[dict]) -> dict[tuple[str, float, str], dict]:
    return {(r["scenario"], r["rate"], r["setup"]): r for r in rows}


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def verdict(rows: list[dict], scenario: str, rate: float) -> str:
    """How the new default compares with the best cache-blind setup at one rate."""
    k = by_key(rows)
    new = k.get((scenario, rate, NEW))
    blind = [k[(scenario, rate, s)] for s in BLIND if (scenario, rate, s) in k]
    if new is None or not blind:
        return "-"
    misses = []
    for metric, margin in (("ttft_p90", 1.05), ("ttft_p99", 1.05)):
        best = min((b[metric] for b in blind if b[metric] is not None), default=None)
        if new[metric] is not None and best is not None and new[metric] > best * margin:
            misses.append(f"{metric[5:]} +{100 * (new[metric] / best - 1):.0f} %")
    best_tok = max(b["tok_s"] for b in blind)
    if new["tok_s"] < best_tok * 0.98:
        misses.append(f"tok/s {100 * (new['tok_s'] / best_tok - 1):.0f} %")
    return "ok" if not misses else "; ".join(misses)


def ratio_table(rows: list[dict]) -> str:
    """Per scenario and rate: each setup's output tok/s and TTFT p90 as a ratio to rr."""
    setups = list(dict.fromkeys(r["setup"] for r in rows))
    head = "| scenario | req/s | " + " | ".join(setups) + " | new default vs best blind |"
    out = [
        "Ratios to Envoy round-robin: output tok/s x / TTFT p90 x (TTFT: < 1 is better)\n",
        head,
        "|---|---:|" + "---:|" * len(setups) + "---|",
    ]
    k = by_key(rows)
    for scenario in dict.fromkeys(r["scenario"] for r in rows):
        for rate in dict.fromkeys(r["rate"] for r in rows if r["scenario"] == scenario):
            rr = k.get((scenario, rate, "rr"))
            cells = []
            for s in setups:
                r = k.get((scenario, rate, s))
                if r is None or rr is None:
                    cells.append("-")
                    continue
                t, p = ratio(r["tok_s"], rr["tok_s"]), ratio(r["ttft_p90"], rr["ttft_p90"])
                cells.append(f"{t:.2f} / {p:.2f}" if t and p else "-")
            out.append(
                f"| {scenario} | {rate:g} | "
                + " | ".join(cells)
                + f" | {verdict(rows, scenario, rate)} |"
            )
    return "\n".join(out)


def ttft_ratio_table(rows: list[dict]) -> str:
    """Per scenario and rate: each setup's TTFT p50 / p90 / p99 as ratios to rr's (e.g.
    in-path vs observer response path, `NAME-obs` setups, side by side)."""
    setups = [s for s in dict.fromkeys(r["setup"] for r in rows) if s != "rr"]
    out = [
        "TTFT p50 / p90 / p99 as ratios to Envoy round-robin (< 1 is better)\n",
        "| scenario | req/s | " + " | ".join(setups) + " |",
        "|---|---:|" + "---:|" * len(setups),
    ]
    k = by_key(rows)
    for scenario in dict.fromkeys(r["scenario"] for r in rows):
        for rate in dict.fromkeys(r["rate"] for r in rows if r["scenario"] == scenario):
            rr = k.get((scenario, rate, "rr"))
            cells = []
            for s in setups:
                r = k.get((scenario, rate, s))
                got = [
                    ratio(r[q], rr[q]) if r is not None and rr is not None else None
                    for q in ("ttft_p50", "ttft_p90", "ttft_p99")
                ]
                ok = all(x is not None for x in got)
                cells.append(" / ".join(f"{x:.2f}" for x in got) if ok else "-")
            out.append(f"| {scenario} | {rate:g} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def plot_matrix(rows: list[dict], path: str) -> None:
    """Two heat maps, scenario x setup, at each scenario's highest rate: TTFT p90 and output
    tokens/s as ratios to round-robin (log colour scale, centred on 1)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    k = by_key(rows)
    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    setups = list(dict.fromkeys(r["setup"] for r in rows))
    top = {s: max(r["rate"] for r in rows if r["scenario"] == s) for s in scenarios}
    fig, axes = plt.subplots(1, 2, figsize=(13, 0.55 * len(scenarios) + 2.2))
    for ax, metric, title, cmap in (
        (axes[0], "ttft_p90", "TTFT p90 / round-robin (lower is better)", "RdYlGn_r"),
        (axes[1], "tok_s", "output tok/s / round-robin (higher is better)", "RdYlGn"),
    ):
        grid = []
        for s in scenarios:
            rr = k.get((s, top[s], "rr"))
            line = []
            for setup in setups:
                r = k.get((s, top[s], setup))
                v = ratio(r[metric], rr[metric]) if r and rr else None
                line.append(v if v else float("nan"))
            grid.append(line)
        im = ax.imshow(grid, cmap=cmap, norm=LogNorm(vmin=0.1, vmax=10), aspect="auto")
        for i, line in enumerate(grid):
            for j, v in enumerate(line):
                if v == v:
                    ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=8)
        ax.set_xticks(range(len(setups)), setups, rotation=30, ha="right", fontsize=8)
        ax.set_yticks(range(len(scenarios)), [f"{s} @{top[s]:g}" for s in scenarios], fontsize=8)
        ax.set_title(title, fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.04)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
