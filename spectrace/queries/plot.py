"""Acceptance plots as PNG, drawn with Pillow (``pip install 'spectrace[plot]'``)."""

from __future__ import annotations

from typing import Sequence

_COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2"]


class PlotError(Exception):
    pass


def acceptance_png(
    path: str,
    by_position: Sequence[tuple[int, int, int, float]],
    by_bucket: dict[str, list[tuple[int, float]]],
    *,
    title: str = "",
) -> None:
    """Bars: acceptance rate per draft position; lines: the same per context bucket."""
    try:
        from PIL import Image, ImageDraw, ImageFont
    except ImportError:
        raise PlotError("--plot needs Pillow: pip install 'spectrace[plot]'") from None
    width, height = 760, 420
    left, right, top, bottom = 60, 170, 40, 50
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    font = ImageFont.load_default()
    plot_w, plot_h = width - left - right, height - top - bottom
    draw.text((left, 12), f"Acceptance rate by draft position  {title}", fill="black", font=font)
    for i in range(6):
        y = top + plot_h - i * plot_h / 5
        draw.line([(left, y), (left + plot_w, y)], fill="#dddddd")
        draw.text((left - 40, y - 6), f"{i * 20}%", fill="black", font=font)
    n = max(len(by_position), 1)
    slot = plot_w / n
    for p, _, _, rate in by_position:
        x0 = left + p * slot + slot * 0.15
        x1 = left + (p + 1) * slot - slot * 0.15
        y = top + plot_h - (rate or 0) * plot_h
        draw.rectangle([x0, y, x1, top + plot_h], fill="#9ecae1", outline="#3182bd")
        draw.text(((x0 + x1) / 2 - 10, top + plot_h + 8), str(p), fill="black", font=font)
        draw.text(((x0 + x1) / 2 - 14, y - 14), f"{(rate or 0):.0%}", fill="black", font=font)
    draw.text((left + plot_w / 2 - 40, height - 22), "draft position", fill="black", font=font)
    for i, (bucket, points) in enumerate(sorted(by_bucket.items())):
        colour = _COLOURS[i % len(_COLOURS)]
        xy = [(left + (p + 0.5) * slot, top + plot_h - (r or 0) * plot_h) for p, r in points]
        if len(xy) > 1:
            draw.line(xy, fill=colour, width=2)
        for x, y in xy:
            draw.ellipse([x - 3, y - 3, x + 3, y + 3], fill=colour)
        ly = top + 10 + i * 16
        draw.line([(left + plot_w + 15, ly + 6), (left + plot_w + 35, ly + 6)], fill=colour, width=2)
        draw.text((left + plot_w + 40, ly), f"context {bucket}", fill="black", font=font)
    draw.rectangle([left, top, left + plot_w, top + plot_h], outline="black")
    img.save(path, "PNG")
