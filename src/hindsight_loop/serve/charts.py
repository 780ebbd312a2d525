"""Charts for the trends page, drawn as inline SVG on the server: no chart library, no script.

Labels (task types, dates) are recorded text: every one goes through ``escape``, and the SVG is
marked safe only as a whole, once built here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from markupsafe import Markup, escape

#: Colours told apart by people with the common colour-vision deficiencies (Okabe-Ito).
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
_W, _H = 640, 240
_L, _R, _T, _B = 44, 12, 12, 40


def _frame(y_max: float, y_fmt: str, parts: list[str]) -> None:
    for i in range(5):
        y = _T + (_H - _T - _B) * (1 - i / 4)
        value = y_max * i / 4
        parts.append(
            f'<line x1="{_L}" y1="{y:.1f}" x2="{_W - _R}" y2="{y:.1f}" class="grid"/>'
            f'<text x="{_L - 6}" y="{y + 4:.1f}" text-anchor="end">{escape(y_fmt.format(value))}</text>'
        )


def _svg(title: str, parts: list[str], legend: Sequence[tuple[str, str]]) -> Markup:
    keys = "".join(
        f'<span class="key"><i style="background:{colour}"></i>{escape(name)}</span>'
        for name, colour in legend
    )
    body = "".join(parts)
    return Markup(
        f'<figure class="chart"><figcaption>{escape(title)}</figcaption>'
        f'<svg viewBox="0 0 {_W} {_H}" role="img" aria-label="{escape(title)}">{body}</svg>'
        f'<div class="legend">{keys}</div></figure>'
    )


def _x_labels(days: Sequence[str], parts: list[str]) -> None:
    n = len(days)
    step = max(1, n // 6)
    for i, day in enumerate(days):
        if i % step == 0 or i == n - 1:
            x = _x(i, n)
            parts.append(
                f'<text x="{x:.1f}" y="{_H - _B + 16}" text-anchor="middle">{escape(day[5:])}</text>'
            )


def _x(i: int, n: int) -> float:
    inner = _W - _L - _R
    return _L + (inner * (i + 0.5) / n if n else 0)


def _y(value: float, y_max: float) -> float:
    return _T + (_H - _T - _B) * (1 - (value / y_max if y_max else 0))


def line_chart(
    title: str,
    series: dict[str, list[tuple[str, float]]],
    *,
    y_max: float = 1.0,
    percent: bool = True,
) -> Markup:
    """One line per series over the days any series has (y from 0 to ``y_max``)."""
    days = sorted({d for points in series.values() for d, _ in points})
    parts: list[str] = []
    _frame(y_max, "{:.0%}" if percent else "{:.0f}", parts)
    legend = []
    for k, (name, points) in enumerate(series.items()):
        colour = PALETTE[k % len(PALETTE)]
        legend.append((name, colour))
        at = {d: v for d, v in points}
        xy = [(_x(i, len(days)), _y(at[d], y_max)) for i, d in enumerate(days) if d in at]
        if len(xy) > 1:
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
            parts.append(
                f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>'
            )
        for x, y in xy:
            parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{colour}"/>')
    _x_labels(days, parts)
    return _svg(title, parts, legend)


def bar_chart(title: str, labels: Sequence[str], series: dict[str, Sequence[float]]) -> Markup:
    """Grouped bars: one group per label, one bar per series."""
    # Up to a multiple of 4: the four grid lines then fall on whole counts.
    y_max = 4.0 * math.ceil(max([1.0, *(v for values in series.values() for v in values)]) / 4)
    parts: list[str] = []
    _frame(y_max, "{:.0f}", parts)
    n, k = len(labels), max(1, len(series))
    inner = _W - _L - _R
    group = inner / n if n else inner
    width = group * 0.8 / k
    legend = []
    for j, (name, values) in enumerate(series.items()):
        colour = PALETTE[j % len(PALETTE)]
        legend.append((name, colour))
        for i, value in enumerate(values):
            x = _L + group * i + group * 0.1 + width * j
            y = _y(value, y_max)
            parts.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{width:.1f}" '
                f'height="{_H - _B - y:.1f}" fill="{colour}"><title>{escape(name)}: '
                f"{value:g}</title></rect>"
            )
    step = max(1, n // 8)
    for i, label in enumerate(labels):
        if i % step == 0:
            x = _L + group * (i + 0.5)
            shown = label if len(label) <= 16 else label[:15] + "…"
            parts.append(
                f'<text x="{x:.1f}" y="{_H - _B + 16}" text-anchor="middle">{escape(shown)}</text>'
            )
    return _svg(title, parts, legend)
