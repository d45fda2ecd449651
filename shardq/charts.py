"""The admin dashboard's charts as geometry for an inline SVG (drawn by the
server: no JavaScript, nothing loaded from elsewhere).

Pure: no Django, no database. A chart is a plot area with a y axis (ticks at
round values from 0, labelled) and an x axis (labelled categories: minutes
or shards), holding stacked bars or lines. The template
``admin/shardq/chart.html`` draws what ``bar_chart`` and ``line_chart``
return.
"""

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

WIDTH = 480
HEIGHT = 240
# Room for the y labels (left), the x labels and the axis title (bottom).
LEFT, RIGHT, TOP, BOTTOM = 64, 12, 12, 44


@dataclass(frozen=True)
class Series:
    """One series: its name (legend, tooltips), CSS class (colour) and a
    value a category (None: no value there)."""

    name: str
    css: str
    values: Sequence[float | None]


def nice_ticks(top: float, count: int = 4, *, whole: bool = False) -> list[float]:
    """Round tick values from 0 to at least ``top`` (about ``count`` steps of
    1, 2, 2.5 or 5 times a power of ten; ``whole``: whole steps, no 2.5)."""
    if not top > 0 or not math.isfinite(top):
        return [0.0, 1.0]
    raw = max(top / count, 1.0) if whole else top / count
    magnitude = 10 ** math.floor(math.log10(raw))
    multiples = (1, 2, 5, 10) if whole else (1, 2, 2.5, 5, 10)
    step = next(m * magnitude for m in multiples if m * magnitude >= raw)
    steps = math.ceil(top / step - 1e-9)
    return [round(i * step, 12) for i in range(steps + 1)]


def _finite(value: float | None) -> float | None:
    """A value to draw: None for none, NaN or a negative; +Infinity is drawn
    at the top of the scale (an odd row's infinite time)."""
    if value is None or math.isnan(value) or value < 0:
        return None
    return value


def _frame(
    title: str,
    y_title: str,
    x_title: str,
    labels: Sequence[str],
    ticks_at: Sequence[int],
    top: float,
    fmt: Callable[[float], str],
    whole: bool,
) -> dict:
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    ticks = nice_ticks(top, whole=whole)
    scale_top = ticks[-1]
    slot = plot_w / max(len(labels), 1)

    def y(value: float) -> float:
        return round(TOP + plot_h - plot_h * min(value / scale_top, 1.0), 1)

    return {
        "title": title,
        "width": WIDTH,
        "height": HEIGHT,
        "left": LEFT,
        "right": WIDTH - RIGHT,
        "top": TOP,
        "bottom": TOP + plot_h,
        "y_title": y_title,
        "y_title_y": TOP + plot_h / 2,
        "y_label_x": LEFT - 6,
        "x_label_y": TOP + plot_h + 16,
        "tick_end": TOP + plot_h + 4,
        "x_title": x_title,
        "x_title_x": LEFT + plot_w / 2,
        "x_title_y": HEIGHT - 6,
        "y_ticks": [{"y": y(t), "label": fmt(t)} for t in ticks],
        "x_ticks": [{"x": round(LEFT + i * slot, 1), "label": labels[i]} for i in ticks_at if 0 <= i < len(labels)],
        "slot": slot,
        "_y": y,
    }


def bar_chart(
    title: str,
    y_title: str,
    x_title: str,
    labels: Sequence[str],
    series: Sequence[Series],
    *,
    ticks_at: Sequence[int],
    fmt: Callable[[float], str],
    hot: Sequence[bool] = (),
    whole: bool = False,
) -> dict:
    """Bars a category, the series stacked in order (a ``hot`` category's
    bars get the class ``hot``)."""
    totals = [sum(_finite(s.values[i]) or 0 for s in series) for i in range(len(labels))]
    top = max((t for t in totals if math.isfinite(t)), default=0)
    chart = _frame(title, y_title, x_title, labels, ticks_at, top, fmt, whole)
    y, slot = chart.pop("_y"), chart["slot"]
    width = max(round(slot * 0.8, 1), 1.0)
    bars = []
    for i, label in enumerate(labels):
        base = 0.0
        for s in series:
            value = _finite(s.values[i])
            if not value:
                continue
            top = base + value
            bars.append(
                {
                    "x": round(LEFT + i * slot + (slot - width) / 2, 1),
                    "y": y(top),
                    "h": round(y(base) - y(top), 1),
                    "w": width,
                    "css": s.css + (" hot" if i < len(hot) and hot[i] else ""),
                    "label": label,
                    "series": s.name,
                    "value": s.values[i],
                    "tip": f"{label}: {s.name} {fmt(s.values[i] or 0)}",
                }
            )
            base = top
    chart["bars"] = bars
    chart["legend"] = [{"name": s.name, "css": s.css} for s in series] if len(series) > 1 else []
    return chart


def line_chart(
    title: str,
    y_title: str,
    x_title: str,
    labels: Sequence[str],
    series: Sequence[Series],
    *,
    ticks_at: Sequence[int],
    fmt: Callable[[float], str],
    whole: bool = False,
) -> dict:
    """A line a series through the middle of each category; a category with
    no value breaks the line."""
    drawn = [_finite(v) for s in series for v in s.values]
    top = max((v for v in drawn if v is not None and math.isfinite(v)), default=0)
    chart = _frame(title, y_title, x_title, labels, ticks_at, top, fmt, whole)
    y, slot = chart.pop("_y"), chart["slot"]
    lines = []
    for s in series:
        path, points, pen_down = [], [], False
        for i, label in enumerate(labels):
            value = _finite(s.values[i])
            if value is None:
                pen_down = False
                continue
            x = round(LEFT + (i + 0.5) * slot, 1)
            path.append(f"{'L' if pen_down else 'M'}{x} {y(value)}")
            pen_down = True
            points.append(
                {"x": x, "y": y(value), "label": label, "value": s.values[i], "tip": f"{label}: {s.name} {fmt(value)}"}
            )
        lines.append({"name": s.name, "css": s.css, "path": " ".join(path), "points": points})
    chart["lines"] = lines
    chart["legend"] = [{"name": s.name, "css": s.css} for s in series]
    return chart


# -- workflow graphs (issue 16) ----------------------------------------------------

NODE_W, NODE_H, GAP_X, GAP_Y, MARGIN = 170, 40, 56, 14, 12


def graph_layout(nodes: Sequence[dict], edges: Sequence[tuple[int, int]]) -> dict:
    """A workflow drawn left to right: each job in the column of its longest
    path from a root (so every edge points right), in id order within a
    column. ``nodes``: dicts with at least ``id``; ``edges``: (parent, child)
    among them. Returns the SVG size, each node's box (its dict plus x, y,
    w, h) and each edge's line (from the parent's right side to the child's
    left side)."""
    ids = [n["id"] for n in nodes]
    known = set(ids)
    parents: dict[int, list[int]] = {i: [] for i in ids}
    for parent, child in edges:
        if parent in known and child in known:
            parents[child].append(parent)
    column: dict[int, int] = {}

    def depth(job: int) -> int:
        # Iterative: a chain of thousands must not exhaust the stack.
        stack = [job]
        while stack:
            top = stack[-1]
            missing = [p for p in parents[top] if p not in column]
            if missing:
                stack.extend(missing)
                continue
            stack.pop()
            column[top] = 1 + max((column[p] for p in parents[top]), default=-1)
        return column[job]

    for job in sorted(ids):
        depth(job)
    rows: dict[int, int] = {}
    per_column: dict[int, int] = {}
    for job in sorted(ids):
        rows[job] = per_column.get(column[job], 0)
        per_column[column[job]] = rows[job] + 1
    boxes = []
    where = {}
    for node in nodes:
        x = MARGIN + column[node["id"]] * (NODE_W + GAP_X)
        y = MARGIN + rows[node["id"]] * (NODE_H + GAP_Y)
        where[node["id"]] = (x, y)
        boxes.append({**node, "x": x, "y": y, "w": NODE_W, "h": NODE_H, "cx": x + 8, "ty": y + 16, "sy": y + 32})
    lines = []
    for parent, child in edges:
        if parent in where and child in where:
            (px, py), (cx, cy) = where[parent], where[child]
            lines.append(
                {
                    "parent": parent,
                    "child": child,
                    "x1": px + NODE_W,
                    "y1": py + NODE_H / 2,
                    "x2": cx,
                    "y2": cy + NODE_H / 2,
                }
            )
    columns = max(column.values(), default=0) + 1
    tallest = max(per_column.values(), default=1)
    return {
        "width": 2 * MARGIN + columns * NODE_W + (columns - 1) * GAP_X,
        "height": 2 * MARGIN + tallest * NODE_H + (tallest - 1) * GAP_Y,
        "nodes": boxes,
        "edges": lines,
    }
