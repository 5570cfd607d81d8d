"""Inline SVG plots for the HTML report, written by hand so that the report needs no plotting
library and no network: a line chart (best-so-far), a horizontal bar chart (failures, bandwidth),
a log-log roofline and a tree. Every function returns one ``<svg>`` element as a string; every
label is escaped. Empty or degenerate data gives a small "no data" figure, never an exception.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape

__all__ = ["Series", "line_chart", "bar_chart", "roofline", "tree", "empty", "STATUS_COLOURS"]

FONT = 'font-family="system-ui, sans-serif" font-size="11"'
STATUS_COLOURS = {
    "correct": "#2e8b57", "incorrect": "#e67e22", "rejected": "#8e44ad", "compile_error": "#c0392b",
    "runtime_error": "#7b241c", "timeout": "#7f8c8d", "crash": "#17202a", "pending": "#cfd8dc",
}
PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b"]


def _f(v: float) -> str:
    return f"{v:.1f}"


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e4 or a < 1e-2:
        return f"{v:.0e}".replace("e+0", "e").replace("e-0", "e-")
    return f"{v:.3g}"


def _finite(*vs: float | None) -> bool:
    return all(v is not None and math.isfinite(v) for v in vs)


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Round tick values covering [lo, hi] (the usual 1-2-5 steps)."""
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(n, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks, t = [], start
    while t <= hi + step * 1e-9:
        if t >= lo - step * 1e-9:
            ticks.append(round(t, 12))
        t += step
    return ticks


def empty(message: str, width: int = 640, height: int = 60) -> str:
    return (f'<svg class="kl-plot kl-empty" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img"><rect width="100%" height="100%" fill="#fafafa" '
            f'stroke="#ddd"/><text x="{width / 2}" y="{height / 2 + 4}" text-anchor="middle" {FONT} '
            f'fill="#777">{escape(message)}</text></svg>')


@dataclass
class Series:
    name: str
    points: list[tuple[float, float, str]] = field(default_factory=list)  # (x, y, tooltip)
    colour: str = PALETTE[0]
    step: bool = True


class _Frame:
    """A plot area with linear or log axes mapping data to pixels."""

    def __init__(self, width: int, height: int, xr: tuple[float, float], yr: tuple[float, float],
                 log: bool = False, margin: tuple[int, int, int, int] = (20, 150, 45, 62)):
        self.w, self.h, self.log = width, height, log
        self.top, self.right, self.bottom, self.left = margin
        self.xr = tuple(math.log10(v) for v in xr) if log else xr
        self.yr = tuple(math.log10(v) for v in yr) if log else yr

    def x(self, v: float) -> float:
        v = math.log10(v) if self.log else v
        lo, hi = self.xr
        return self.left + (v - lo) / (hi - lo) * (self.w - self.left - self.right)

    def y(self, v: float) -> float:
        v = math.log10(v) if self.log else v
        lo, hi = self.yr
        return self.h - self.bottom - (v - lo) / (hi - lo) * (self.h - self.top - self.bottom)

    def axes(self, xticks: list[float], yticks: list[float], x_label: str, y_label: str) -> list[str]:
        out = [f'<rect x="{self.left}" y="{self.top}" width="{self.w - self.left - self.right}" '
               f'height="{self.h - self.top - self.bottom}" fill="#fff" stroke="#999"/>']
        for t in xticks:
            px = self.x(t)
            out.append(f'<line x1="{_f(px)}" y1="{self.top}" x2="{_f(px)}" y2="{self.h - self.bottom}" stroke="#eee"/>')
            out.append(f'<text x="{_f(px)}" y="{self.h - self.bottom + 14}" text-anchor="middle" {FONT}>{_fmt(t)}</text>')
        for t in yticks:
            py = self.y(t)
            out.append(f'<line x1="{self.left}" y1="{_f(py)}" x2="{self.w - self.right}" y2="{_f(py)}" stroke="#eee"/>')
            out.append(f'<text x="{self.left - 5}" y="{_f(py + 4)}" text-anchor="end" {FONT}>{_fmt(t)}</text>')
        mid_x = (self.left + self.w - self.right) / 2
        mid_y = (self.top + self.h - self.bottom) / 2
        out.append(f'<text x="{_f(mid_x)}" y="{self.h - 8}" text-anchor="middle" {FONT}>{escape(x_label)}</text>')
        out.append(f'<text x="14" y="{_f(mid_y)}" text-anchor="middle" transform="rotate(-90 14 {_f(mid_y)})" '
                   f'{FONT}>{escape(y_label)}</text>')
        return out

    def legend(self, items: list[tuple[str, str]]) -> list[str]:
        out, x0 = [], self.w - self.right + 10
        for i, (name, colour) in enumerate(items):
            y0 = self.top + 10 + i * 16
            out.append(f'<rect x="{x0}" y="{y0 - 8}" width="10" height="10" fill="{colour}"/>')
            out.append(f'<text x="{x0 + 14}" y="{y0 + 1}" {FONT}>{escape(name)}</text>')
        return out


def _margin(names: list[str]) -> tuple[int, int, int, int]:
    """Plot margins with room on the right for the legend's longest name (~6.5 px a character)."""
    return (20, max(110, int(30 + 6.5 * max((len(n) for n in names), default=0))), 45, 62)


def _svg(width: int, height: int, body: list[str], label: str) -> str:
    return (f'<svg class="kl-plot" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(label)}">'
            + "".join(body) + "</svg>")


def line_chart(series: list[Series], *, x_label: str, y_label: str, hlines: tuple[tuple[float, str], ...] = (),
               width: int = 660, height: int = 260, label: str = "chart") -> str:
    """Lines (step lines for best-so-far) with a dot per point; ``hlines`` are reference levels."""
    pts = [(x, y) for s in series for x, y, _ in s.points if _finite(x, y)]
    if not pts:
        return empty(f"no data for {label}", width)
    xs, ys = [p[0] for p in pts], [p[1] for p in pts] + [v for v, _ in hlines if _finite(v)]
    x_lo, x_hi = min(xs), max(xs)
    if x_hi - x_lo < 1e-12:
        x_lo, x_hi = x_lo - 1, x_hi + 1
    y_lo, y_hi = min(0.0, min(ys)), max(ys)
    if y_hi - y_lo < 1e-12:
        y_hi = y_lo + 1
    y_hi += (y_hi - y_lo) * 0.08
    xt, yt = nice_ticks(x_lo, x_hi), nice_ticks(y_lo, y_hi)
    names = [s.name for s in series if s.points]
    width += max(0, _margin(names)[1] - 150)  # a long legend widens the figure, not squeezes the plot
    fr = _Frame(width, height, (min(x_lo, xt[0]), max(x_hi, xt[-1])), (min(y_lo, yt[0]), max(y_hi, yt[-1])),
                margin=_margin(names))
    body = fr.axes(xt, yt, x_label, y_label)
    for v, name in hlines:
        if _finite(v):
            py = _f(fr.y(v))
            body.append(f'<line x1="{fr.left}" y1="{py}" x2="{width - fr.right}" y2="{py}" stroke="#555" '
                        f'stroke-dasharray="4 3"><title>{escape(name)}</title></line>')
            body.append(f'<text x="{fr.left + 4}" y="{_f(fr.y(v) - 3)}" {FONT} fill="#555">{escape(name)}</text>')
    for s in series:
        p = sorted((x, y, t) for x, y, t in s.points if _finite(x, y))
        if not p:
            continue
        d = f"M{_f(fr.x(p[0][0]))},{_f(fr.y(p[0][1]))}"
        for x, y, _ in p[1:]:
            d += (f" H{_f(fr.x(x))} V{_f(fr.y(y))}" if s.step else f" L{_f(fr.x(x))},{_f(fr.y(y))}")
        body.append(f'<path d="{d}" fill="none" stroke="{s.colour}" stroke-width="2"/>')
        for x, y, tip in p:
            body.append(f'<circle cx="{_f(fr.x(x))}" cy="{_f(fr.y(y))}" r="3" fill="{s.colour}">'
                        f'<title>{escape(tip)}</title></circle>')
    body += fr.legend([(s.name, s.colour) for s in series if s.points])
    return _svg(width, height, body, label)


def bar_chart(rows: list[tuple[str, float, str]], *, x_label: str, ref: tuple[float, str] | None = None,
              width: int = 640, label: str = "bars") -> str:
    """Horizontal bars ``(label, value, colour)``; ``ref`` draws a labelled reference line (a ceiling)."""
    rows = [r for r in rows if _finite(r[1])]
    if not rows:
        return empty(f"no data for {label}", width)
    left, right, bar, gap = 190, 70, 16, 6
    height = 30 + len(rows) * (bar + gap) + 30
    top_v = max([v for _, v, _ in rows] + ([ref[0]] if ref and _finite(ref[0]) else []))
    top_v = top_v if top_v > 0 else 1.0
    scale = (width - left - right) / top_v
    body = []
    for i, (name, v, colour) in enumerate(rows):
        y = 20 + i * (bar + gap)
        shown = name if len(name) <= 32 else name[:31] + "…"
        body.append(f'<text x="{left - 6}" y="{y + bar - 4}" text-anchor="end" {FONT}>{escape(shown)}'
                    f'<title>{escape(name)}</title></text>')
        body.append(f'<rect x="{left}" y="{y}" width="{_f(max(v, 0) * scale)}" height="{bar}" fill="{colour}">'
                    f'<title>{escape(name)}: {_fmt(v)}</title></rect>')
        body.append(f'<text x="{_f(left + max(v, 0) * scale + 4)}" y="{y + bar - 4}" {FONT}>{_fmt(v)}</text>')
    if ref and _finite(ref[0]):
        rx = _f(left + ref[0] * scale)
        body.append(f'<line x1="{rx}" y1="12" x2="{rx}" y2="{height - 26}" stroke="#333" stroke-dasharray="4 3"/>')
        body.append(f'<text x="{rx}" y="10" text-anchor="middle" {FONT}>{escape(ref[1])}</text>')
    body.append(f'<text x="{(left + width - right) / 2}" y="{height - 8}" text-anchor="middle" {FONT}>'
                f'{escape(x_label)}</text>')
    return _svg(width, height, body, label)


def _decades(lo: float, hi: float) -> tuple[float, float]:
    return 10 ** math.floor(math.log10(lo)), 10 ** math.ceil(math.log10(hi))


def roofline(points: list[tuple[float, float, str, str]], *, bandwidth: float, peaks: list[tuple[float, str]],
             width: int = 640, height: int = 320, label: str = "roofline") -> str:
    """Log-log roofline: ``points`` are (FLOP/byte, FLOP/s, tooltip, colour); roofs are
    ``min(bandwidth * AI, peak)`` for each ``(peak FLOP/s, name)``."""
    points = [p for p in points if _finite(p[0], p[1]) and p[0] > 0 and p[1] > 0]
    if not points or not (bandwidth > 0) or not peaks:
        return empty(f"no data for {label}", width)
    ridges = [pk / bandwidth for pk, _ in peaks]
    x_lo, x_hi = _decades(min([p[0] for p in points] + [min(ridges) / 100]),
                          max([p[0] for p in points] + [max(ridges) * 4]))
    y_lo, y_hi = _decades(min([p[1] for p in points] + [bandwidth * x_lo]),
                          max([p[1] for p in points] + [pk for pk, _ in peaks]))
    fr = _Frame(width, height, (x_lo, x_hi), (y_lo, y_hi), log=True, margin=_margin([n for _, n in peaks]))
    dec = lambda lo, hi: [10.0 ** k for k in range(round(math.log10(lo)), round(math.log10(hi)) + 1)]
    body = fr.axes(dec(x_lo, x_hi), dec(y_lo, y_hi), "arithmetic intensity (FLOP/byte)", "achieved FLOP/s")
    legend = []
    for i, (pk, name) in enumerate(sorted(peaks)):
        colour = PALETTE[(i + 3) % len(PALETTE)]
        ridge = pk / bandwidth
        pts = [(x_lo, bandwidth * x_lo), (ridge, pk), (x_hi, pk)] if ridge < x_hi else \
              [(x_lo, bandwidth * x_lo), (x_hi, bandwidth * x_hi)]
        d = " ".join(f"{'M' if j == 0 else 'L'}{_f(fr.x(x))},{_f(fr.y(min(y, y_hi)))}" for j, (x, y) in enumerate(pts))
        body.append(f'<path d="{d}" fill="none" stroke="{colour}" stroke-width="1.5" stroke-dasharray="6 3">'
                    f'<title>{escape(name)}</title></path>')
        legend.append((name, colour))
    for ai, perf, tip, colour in points:
        body.append(f'<circle cx="{_f(fr.x(ai))}" cy="{_f(fr.y(perf))}" r="4" fill="{colour}" stroke="#000" '
                    f'stroke-width="0.5"><title>{escape(tip)}</title></circle>')
    body += fr.legend(legend)
    return _svg(width, height, body, label)


def tree(nodes: list[dict], *, label: str = "tree", dx: int = 18, dy: int = 42) -> str:
    """A top-down tree (a forest when several roots). ``nodes`` are dicts with ``id``, ``parent``,
    ``colour``, ``title`` and optional ``highlight`` (drawn larger, with its edge to the parent thick);
    parents must come before their children. Leaves are spread left to right; a parent sits over
    the middle of its children."""
    if not nodes:
        return empty(f"no data for {label}")
    ids = {n["id"] for n in nodes}
    kids: dict[str | None, list[dict]] = {}
    for n in nodes:
        parent = n.get("parent") if n.get("parent") in ids else None
        kids.setdefault(parent, []).append(n)
    pos: dict[str, tuple[float, int]] = {}
    next_leaf = [0]

    def place(n: dict, depth: int) -> float:
        # recursion depth is the tree depth: search trees are far shallower than Python's limit
        ch = kids.get(n["id"], [])
        if not ch:
            x = float(next_leaf[0])
            next_leaf[0] += 1
        else:
            xs = [place(c, depth + 1) for c in ch]
            x = (xs[0] + xs[-1]) / 2
        pos[n["id"]] = (x, depth)
        return x

    for root in kids.get(None, []):
        place(root, 0)
    max_depth = max(d for _, d in pos.values())
    width = max(240, int(next_leaf[0] * dx + 40))
    height = int((max_depth + 1) * dy + 30)
    px = lambda i: 20 + pos[i][0] * dx + dx / 2
    py = lambda i: 20 + pos[i][1] * dy
    body = []
    by_id = {n["id"]: n for n in nodes}
    for n in nodes:
        p = n.get("parent")
        if p in pos and n["id"] in pos:
            hl = n.get("highlight") and by_id[p].get("highlight")
            body.append(f'<line x1="{_f(px(p))}" y1="{_f(py(p))}" x2="{_f(px(n["id"]))}" y2="{_f(py(n["id"]))}" '
                        f'stroke="{"#000" if hl else "#b0bec5"}" stroke-width="{3 if hl else 1}"/>')
    for n in nodes:
        if n["id"] not in pos:
            continue
        r = 7 if n.get("highlight") else 5
        body.append(f'<circle class="kl-node" data-id="{escape(n["id"])}" cx="{_f(px(n["id"]))}" '
                    f'cy="{_f(py(n["id"]))}" r="{r}" fill="{n["colour"]}" stroke="#000" '
                    f'stroke-width="{1.5 if n.get("highlight") else 0.5}"><title>{escape(n["title"])}</title></circle>')
    return _svg(width, height, body, label)
