"""The workload matrix's verdict (`epp bench routing --matrix`): every setup's ratio to
Envoy round-robin per scenario and rate, whether the new default (`epp-sticky`,
config/prefix-aware.yaml) is within the issue's margins of the best cache-blind setup
(round-robin, least-request, EPP load-only: TTFT p90/p99 within 5 %, output tokens/s within
2 %), and the scenario x setup plot. Loaded by path from bench/routing.py."""

from __future__ import annotations

BLIND = ("rr", "lr", "epp-load")
NEW = "epp-sticky"


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
