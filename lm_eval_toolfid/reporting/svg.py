"""Small inline-SVG plots written by hand: no JavaScript, nothing fetched, prints as vectors.

Every text that reaches the SVG goes through :func:`esc` (labels may come from file names and
tool names, which are untrusted).
"""

from __future__ import annotations

import html
from typing import Sequence

PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f"]


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _svg(width: int, height: int, title: str, body: list[str]) -> str:
    return (f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" role="img" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">'
            f"<title>{esc(title)}</title>" + "".join(body) + "</svg>")


def grouped_bars(title: str, categories: Sequence[str], series: Sequence[tuple[str, Sequence[float | None],
                 Sequence[tuple[float, float] | None]]], lo: float = 0.0, hi: float = 1.0,
                 height: int = 260) -> str:
    """Vertical bars per category, one per series, with 95% interval whiskers where given."""
    n_cat, n_ser = max(1, len(categories)), max(1, len(series))
    left, right, top, bottom = 48, 12, 28, 70
    slot = max(40, 22 * n_ser + 16)
    width = left + right + slot * n_cat
    plot_h = height - top - bottom

    def y(v: float) -> float:
        v = min(max(v, lo), hi)
        return top + plot_h * (1 - (v - lo) / (hi - lo))

    body = [f'<text x="{left}" y="16" font-size="13" font-weight="bold">{esc(title)}</text>']
    for i in range(5):  # gridlines
        v = lo + (hi - lo) * i / 4
        body.append(f'<line x1="{left}" x2="{width - right}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ddd"/>'
                    f'<text x="{left - 4}" y="{y(v) + 4:.1f}" text-anchor="end">{v:g}</text>')
    if lo < 0 < hi:
        body.append(f'<line x1="{left}" x2="{width - right}" y1="{y(0):.1f}" y2="{y(0):.1f}" stroke="#333"/>')
    bar_w = (slot - 16) / n_ser
    for ci, cat in enumerate(categories):
        x0 = left + ci * slot + 8
        for si, (name, values, cis) in enumerate(series):
            value = values[ci] if ci < len(values) else None
            x = x0 + si * bar_w
            colour = PALETTE[si % len(PALETTE)]
            if value is None:
                body.append(f'<text x="{x + bar_w / 2:.1f}" y="{y(lo) - 4:.1f}" text-anchor="middle" '
                            f'fill="#999">—</text>')
                continue
            base_v = 0.0 if lo < 0 < hi else lo
            top_y, bot_y = sorted((y(value), y(base_v)))
            body.append(f'<rect class="bar" x="{x:.1f}" y="{top_y:.1f}" width="{bar_w - 2:.1f}" '
                        f'height="{max(bot_y - top_y, 0.5):.1f}" fill="{colour}">'
                        f"<title>{esc(name)} · {esc(cat)}: {value:.3f}</title></rect>")
            interval = cis[ci] if ci < len(cis) else None
            if interval:
                cx = x + (bar_w - 2) / 2
                y1, y2 = y(interval[0]), y(interval[1])
                body.append(f'<path class="ci" d="M{cx:.1f},{y1:.1f}V{y2:.1f}M{cx - 4:.1f},{y1:.1f}h8'
                            f'M{cx - 4:.1f},{y2:.1f}h8" stroke="#222" fill="none"/>')
        body.append(f'<text x="{x0 + (slot - 16) / 2:.1f}" y="{height - bottom + 14}" text-anchor="end" '
                    f'transform="rotate(-30 {x0 + (slot - 16) / 2:.1f} {height - bottom + 14})">{esc(cat)}</text>')
    lx = left
    for si, (name, _, _) in enumerate(series):  # legend
        body.append(f'<rect x="{lx}" y="{height - 16}" width="10" height="10" fill="{PALETTE[si % len(PALETTE)]}"/>'
                    f'<text x="{lx + 14}" y="{height - 7}">{esc(name)}</text>')
        lx += 18 + 7 * len(name)
    return _svg(max(width, lx + 10, left + 8 * len(title)), height, title, body)


def interval_rows(title: str, labels: Sequence[str], values: Sequence[float], intervals: Sequence[tuple[float, float]
                  | None], lo: float = -1.0, hi: float = 1.0, marks: Sequence[tuple[str, float]] = ()) -> str:
    """One row per label, in the order given: a dot at its value and its interval as a whisker, on one horizontal axis
    (a forest plot: readable at a hundred rows, where bars are not); ``marks``: labelled vertical lines (0, a floor)."""
    left = min(260, 12 + 7 * max([len(label) for label in labels] or [4]))
    right, top, row_h, axis_w = 16, 34, 14, 420
    height = top + row_h * max(1, len(labels)) + 24
    width = left + axis_w + right

    def x(v: float) -> float:
        return left + axis_w * (min(max(v, lo), hi) - lo) / (hi - lo)

    body = [f'<text x="8" y="16" font-size="13" font-weight="bold">{esc(title)}</text>']
    for i in range(5):
        v = lo + (hi - lo) * i / 4
        body.append(f'<line x1="{x(v):.1f}" x2="{x(v):.1f}" y1="{top - 6}" y2="{height - 22}" stroke="#eee"/>'
                    f'<text x="{x(v):.1f}" y="{height - 8}" text-anchor="middle">{v:g}</text>')
    for name, v in marks:
        body.append(f'<line x1="{x(v):.1f}" x2="{x(v):.1f}" y1="{top - 10}" y2="{height - 22}" stroke="#b22" '
                    f'stroke-dasharray="{"" if v == 0 else "4 3"}"/><text x="{x(v) + 3:.1f}" y="{top - 12}" '
                    f'fill="#b22">{esc(name)}</text>')
    for i, (label, value) in enumerate(zip(labels, values)):
        cy = top + row_h * i + row_h / 2
        body.append(f'<text x="{left - 6}" y="{cy + 4:.1f}" text-anchor="end">{esc(label)}</text>')
        interval = intervals[i] if i < len(intervals) else None
        if interval:
            body.append(f'<path class="ci" d="M{x(interval[0]):.1f},{cy:.1f}H{x(interval[1]):.1f}" stroke="#222"/>')
        body.append(f'<circle class="dot" cx="{x(value):.1f}" cy="{cy:.1f}" r="3.5" fill="{PALETTE[1]}">'
                    f"<title>{esc(label)}: {value:.3f}"
                    f"{f' ({interval[0]:.3f} to {interval[1]:.3f})' if interval else ''}</title></circle>")
    return _svg(width, height, title, body)


def null_strip(title: str, values: Sequence[float], marks: Sequence[tuple[str, float]],
               lo: float = 0.0, hi: float = 1.0, width: int = 640) -> str:
    """The null runs as dots on a line (plus mean ± std), each adapter marked by a labelled tick."""
    left, right, height = 30, 30, 150
    axis_y = 90

    def x(v: float) -> float:
        return left + (width - left - right) * (min(max(v, lo), hi) - lo) / (hi - lo)

    body = [f'<text x="{left}" y="16" font-size="13" font-weight="bold">{esc(title)}</text>',
            f'<line x1="{left}" x2="{width - right}" y1="{axis_y}" y2="{axis_y}" stroke="#333"/>']
    for i in range(6):
        v = lo + (hi - lo) * i / 5
        body.append(f'<line x1="{x(v):.1f}" x2="{x(v):.1f}" y1="{axis_y}" y2="{axis_y + 4}" stroke="#333"/>'
                    f'<text x="{x(v):.1f}" y="{axis_y + 16}" text-anchor="middle">{v:.2f}</text>')
    if values:
        mean = sum(values) / len(values)
        var = sum((v - mean) ** 2 for v in values) / max(1, len(values) - 1)
        sd = var ** 0.5
        body.append(f'<rect x="{x(mean - sd):.1f}" y="{axis_y - 22}" width="{max(x(mean + sd) - x(mean - sd), 1):.1f}" '
                    f'height="16" fill="#4e79a7" opacity="0.2"><title>null mean ± std: {mean:.3f} ± {sd:.3f}'
                    f"</title></rect>")
    for i, v in enumerate(values):
        body.append(f'<circle class="null-run" cx="{x(v):.1f}" cy="{axis_y - 14 - 3 * (i % 3)}" r="4" '
                    f'fill="#4e79a7" opacity="0.8"><title>null run {i}: {v:.3f}</title></circle>')
    for i, (name, v) in enumerate(marks):
        colour = PALETTE[(i + 1) % len(PALETTE)]
        ty = 34 + 12 * (i % 3)
        body.append(f'<line class="adapter-mark" x1="{x(v):.1f}" x2="{x(v):.1f}" y1="{ty + 2}" y2="{axis_y}" '
                    f'stroke="{colour}" stroke-width="2"/><text x="{x(v) + 3:.1f}" y="{ty}" fill="{colour}">'
                    f"{esc(name)} {v:.3f}</text>")
    body.append(f'<text x="{left}" y="{height - 8}" fill="#555">dots: null (random) adapters of the same shape; '
                "band: mean ± std; ticks: the adapters</text>")
    return _svg(width, height, title, body)


def _diverging(v: float) -> str:
    """-1 red … 0 white … +1 green."""
    v = max(-1.0, min(1.0, v))
    if v < 0:
        r, g, b = 255, int(255 * (1 + v)), int(255 * (1 + v))
        g = max(g, 80)
        b = max(b, 80)
    else:
        r, g, b = int(255 * (1 - v)), 255, int(255 * (1 - v))
        r = max(r, 80)
        b = max(b, 80)
    return f"rgb({r},{g},{b})"


def heatmap(title: str, rows: Sequence[str], cols: Sequence[str], values: Sequence[Sequence[float | None]]) -> str:
    """Tools × adapters; each cell the change in validity rate (adapter − base) on that tool's cases."""
    cell_w, cell_h = 96, 20
    left = min(220, 16 + 7 * max((len(r) for r in rows), default=4))
    top = 50
    width = max(left + cell_w * max(1, len(cols)) + 20, 520)
    height = top + cell_h * len(rows) + 30
    body = [f'<text x="8" y="16" font-size="13" font-weight="bold">{esc(title)}</text>']
    for ci, col in enumerate(cols):
        body.append(f'<text x="{left + ci * cell_w + cell_w / 2:.1f}" y="{top - 8}" text-anchor="middle">'
                    f"{esc(col[:14])}</text>")
    for ri, row in enumerate(rows):
        y = top + ri * cell_h
        body.append(f'<text x="{left - 6}" y="{y + 14}" text-anchor="end">{esc(row[:30])}</text>')
        for ci in range(len(cols)):
            v = values[ri][ci] if ci < len(values[ri]) else None
            fill = "#eee" if v is None else _diverging(v)
            label = "—" if v is None else f"{v:+.2f}"
            body.append(f'<rect class="cell" x="{left + ci * cell_w}" y="{y}" width="{cell_w - 2}" '
                        f'height="{cell_h - 2}" fill="{fill}"><title>{esc(row)} · {esc(cols[ci])}: {label}</title>'
                        f'</rect><text x="{left + ci * cell_w + cell_w / 2 - 1:.1f}" y="{y + 14}" '
                        f'text-anchor="middle">{label}</text>')
    body.append(f'<text x="8" y="{height - 8}" fill="#555">validity rate change on each tool\'s cases, '
                "adapter − base (red: lost, green: gained)</text>")
    return _svg(width, height, title, body)


def line_chart(title: str, series: Sequence[tuple[str, Sequence[float], Sequence[float]]], x_label: str,
               y_label: str, x_range: tuple[float, float], y_range: tuple[float, float] = (0.0, 1.0),
               hlines: Sequence[tuple[float, str]] = (), vlines: Sequence[tuple[float, str]] = (),
               marks: Sequence[Sequence[tuple[float, float]]] = (), note: str = "",
               width: int = 720, height: int = 380) -> str:
    """Lines through (x, y) points, one per series (legend on the right), dashed reference lines,
    and optional dots (``marks[i]``: the points of series ``i`` to mark)."""
    left, right, top, bottom = 52, 150, 30, 58
    (x0, x1), (y0, y1) = x_range, y_range
    plot_w, plot_h = width - left - right, height - top - bottom

    def x(v: float) -> float:
        return left + plot_w * (min(max(v, x0), x1) - x0) / ((x1 - x0) or 1.0)

    def y(v: float) -> float:
        return top + plot_h * (1 - (min(max(v, y0), y1) - y0) / ((y1 - y0) or 1.0))

    body = [f'<text x="{left}" y="18" font-size="13" font-weight="bold">{esc(title)}</text>']
    for i in range(6):
        vy = y0 + (y1 - y0) * i / 5
        vx = x0 + (x1 - x0) * i / 5
        body.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y(vy):.1f}" y2="{y(vy):.1f}" stroke="#eee"/>'
                    f'<text x="{left - 4}" y="{y(vy) + 4:.1f}" text-anchor="end">{vy:g}</text>'
                    f'<line x1="{x(vx):.1f}" x2="{x(vx):.1f}" y1="{top + plot_h}" y2="{top + plot_h + 4}" stroke="#333"/>'
                    f'<text x="{x(vx):.1f}" y="{top + plot_h + 16}" text-anchor="middle">{vx:g}</text>')
    body.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#333"/>')
    body.append(f'<text x="{left + plot_w / 2:.1f}" y="{height - bottom + 34}" text-anchor="middle">{esc(x_label)}</text>'
                f'<text x="14" y="{top + plot_h / 2:.1f}" text-anchor="middle" '
                f'transform="rotate(-90 14 {top + plot_h / 2:.1f})">{esc(y_label)}</text>')
    for value, label in hlines:
        body.append(f'<line class="ref" x1="{left}" x2="{left + plot_w}" y1="{y(value):.1f}" y2="{y(value):.1f}" '
                    f'stroke="#888" stroke-dasharray="4 3"/><text x="{left + plot_w - 4}" y="{y(value) - 3:.1f}" '
                    f'text-anchor="end" fill="#555">{esc(label)}</text>')
    for value, label in vlines:
        body.append(f'<line class="ref" x1="{x(value):.1f}" x2="{x(value):.1f}" y1="{top}" y2="{top + plot_h}" '
                    f'stroke="#888" stroke-dasharray="4 3"/><text x="{x(value) + 3:.1f}" y="{top + 12}" '
                    f'fill="#555">{esc(label)}</text>')
    for si, (name, xs, ys) in enumerate(series):
        colour = PALETTE[si % len(PALETTE)]
        points = " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b in zip(xs, ys))
        body.append(f'<polyline class="series" points="{points}" fill="none" stroke="{colour}" stroke-width="2">'
                    f"<title>{esc(name)}</title></polyline>")
        for a, b in (marks[si] if si < len(marks) else ()):
            body.append(f'<circle cx="{x(a):.1f}" cy="{y(b):.1f}" r="3" fill="{colour}">'
                        f"<title>{esc(name)}: {b:.3f} at {a:g}</title></circle>")
        ly = top + 8 + 16 * si
        body.append(f'<line x1="{width - right + 12}" x2="{width - right + 30}" y1="{ly}" y2="{ly}" stroke="{colour}" '
                    f'stroke-width="2"/><text x="{width - right + 34}" y="{ly + 4}">{esc(name)}</text>')
    if note:
        body.append(f'<text x="{left}" y="{height - 8}" fill="#555">{esc(note)}</text>')
    return _svg(width, height, title, body)
