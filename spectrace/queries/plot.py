"""Acceptance plots as PNG, drawn with matplotlib (``pip install 'spectrace[plot]'``).

One figure per run: acceptance per draft position (bars), and a position × context
heatmap over the run's context ranges (the fixed buckets split at the run's own
boundaries), with each boundary from the run's configs marked.
"""

from __future__ import annotations

from typing import Sequence


class PlotError(Exception):
    pass


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: never a window, never a display
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotError("--plot needs matplotlib: pip install 'spectrace[plot]'") from None
    return plt


def acceptance_png(
    path: str,
    by_position: Sequence[tuple[int, int, int, float | None]],
    heatmap: dict[tuple[str, int], tuple[int, int]],
    ranges: Sequence[tuple[str, int]],
    boundaries: Sequence[tuple[int, str, str]] = (),
    *,
    title: str = "",
) -> None:
    """``by_position``: (position, drafted, accepted, rate); ``heatmap``: (context range,
    position) -> (drafted, accepted); ``ranges``: (label, low) in context order;
    ``boundaries``: (tokens, model role, config field) of the run."""
    import numpy as np

    plt = _pyplot()
    positions = sorted({p for _, p in heatmap} | {row[0] for row in by_position})
    labels = [label for label, _ in ranges]
    rates = np.full((len(positions), len(labels)), np.nan)
    for (label, position), (drafted, accepted) in heatmap.items():
        if drafted and label in labels:
            rates[positions.index(position), labels.index(label)] = accepted / drafted
    fig, (bars, heat) = plt.subplots(
        1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [1, max(1.6, 0.45 * len(labels))]}
    )
    fig.suptitle(f"Acceptance  {title}".strip())
    bars.bar([row[0] for row in by_position], [row[3] or 0.0 for row in by_position], color="#4c72b0")
    for position, _, _, rate in by_position:
        bars.annotate(f"{(rate or 0):.0%}", (position, rate or 0), ha="center", va="bottom", fontsize=8)
    bars.set(xlabel="draft position", ylabel="accepted / drafted", ylim=(0, 1.1), xticks=positions)
    bars.set_title("by position", fontsize=10)
    image = heat.imshow(rates, aspect="auto", origin="lower", vmin=0, vmax=1, cmap="viridis")
    heat.set(xticks=range(len(labels)), yticks=range(len(positions)), yticklabels=positions)
    heat.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    heat.set(xlabel="context length (tokens)", ylabel="draft position")
    heat.set_title("by position and context", fontsize=10)
    for row in range(rates.shape[0]):
        for col in range(rates.shape[1]):
            if not np.isnan(rates[row, col]):
                heat.text(col, row, f"{rates[row, col]:.0%}", ha="center", va="center", fontsize=7,
                          color="white" if rates[row, col] < 0.5 else "black")  # fmt: skip
    lows = [low for _, low in ranges]
    for tokens, role, field in boundaries:
        if tokens in lows:  # a boundary is where a range starts: mark the edge between two columns
            x = lows.index(tokens) - 0.5
            heat.axvline(x, color="#d62728", linewidth=2)
            heat.annotate(f"{role} {field} = {tokens}", (x, len(positions) - 0.5), xytext=(3, -2),
                          textcoords="offset points", color="#d62728", fontsize=8, va="top")  # fmt: skip
    fig.colorbar(image, ax=heat, label="accepted / drafted")
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)
