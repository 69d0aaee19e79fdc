"""The figure of a watched training (``memlab.watch``): samples/s and memory per optimizer step, as plain data
(:func:`step_series`, which the live plotly figure draws too) and as a static SVG (:func:`steps_svg`) that a notebook
keeps after ``trainer.train()`` ends.

The records are anything with ``step``, ``peak_bytes``, ``samples_per_s`` and ``categories`` (bytes by category at
the step's peak; empty where the device only knows the total): :class:`memlab.trainer.watch.StepRecord`. Memory is
drawn stacked by category where every step has its categories, else as the peak alone. Long trainings are thinned
to :data:`MAX_POINTS` steps, evenly, always keeping the highest peak.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from memlab.plan import format_bytes
from memlab.report.views.figure import BUDGET_COLOR, CATEGORY_COLORS, RATE_COLOR
from memlab.report.views.plan_axis import text_width
from memlab.report.views.svg import Svg, axis_number, escape, nice_ticks, px

__all__ = ["MAX_POINTS", "PEAK_COLOR", "StepSeries", "step_series", "steps_svg", "steps_text"]

MAX_POINTS = 400
"""The most steps a figure draws; more are thinned evenly (the highest peak always kept)."""
PEAK_COLOR = "#4C78A8"
"""The colour of the memory area where only the peak is known (CUDA)."""

_MIB = 1024**2
_WIDTH, _HEIGHT = 960, 318
# The title line, the legend's row under it, then the panels' titles: none on another.
_TOP, _BOTTOM, _LEFT, _GAP, _RIGHT = 76.0, 44.0, 64.0, 80.0, 24.0
_LEGEND_Y = 40.0
_MUTED, _GRID = "#666666", "#E6E6E6"

StepSeries = dict[str, Any]
"""``steps`` (x), ``memory`` ({category or "peak": MiB per step}, in stacking order), ``samples_per_s``,
``budget_mib`` (or None), ``peak`` (the highest step's bytes, or None) and ``peak_step``."""


def step_series(records: Sequence[Any], budget: int | None = None, limit: int = MAX_POINTS) -> StepSeries:
    """What the figure draws of ``records`` (see :data:`StepSeries`).

    Example:
        >>> from types import SimpleNamespace as R
        >>> half = 2**19
        >>> steps = [R(step=1, peak_bytes=2**20, samples_per_s=4.0, categories={"params": half, "other": half}),
        ...          R(step=2, peak_bytes=3 * 2**20, samples_per_s=2.0, categories={"params": half, "other": 5 * half})]
        >>> series = step_series(steps, budget=2**21)
        >>> series["steps"], series["memory"], series["budget_mib"], series["peak_step"]
        ([1, 2], {'params': [0.5, 0.5], 'other': [0.5, 2.5]}, 2.0, 2)
    """
    peak_index = max(range(len(records)), key=lambda i: records[i].peak_bytes, default=None)
    kept = _thinned(len(records), peak_index, limit)
    chosen = [records[i] for i in kept]
    if chosen and all(record.categories for record in chosen):
        names = [name for name in CATEGORY_COLORS if any(record.categories.get(name) for record in chosen)]
        memory = {name: [record.categories.get(name, 0) / _MIB for record in chosen] for name in names}
    else:
        memory = {"peak": [record.peak_bytes / _MIB for record in chosen]}
    return {
        "steps": [record.step for record in chosen],
        "memory": memory,
        "samples_per_s": [record.samples_per_s for record in chosen],
        "budget_mib": None if budget is None else budget / _MIB,
        "peak": None if peak_index is None else records[peak_index].peak_bytes,
        "peak_step": None if peak_index is None else records[peak_index].step,
    }


def steps_text(series: StepSeries) -> str:
    """One line that sums the figure up.

    Example:
        >>> steps_text({"steps": [1, 2], "peak": 3 * 2**20, "peak_step": 2, "budget_mib": 2.0})
        'memlab.watch: 2 steps; peak 3.0 MiB at step 2; over the 2.0 MiB budget'
    """
    if not series["steps"]:
        return "memlab.watch: no step yet"
    parts = [f"memlab.watch: {series['steps'][-1]} steps", f"peak {format_bytes(series['peak'])} at step "
             f"{series['peak_step']}"]
    if series["budget_mib"] is not None:
        budget = int(series["budget_mib"] * _MIB)
        word = "over" if series["peak"] > budget else "within"
        parts.append(f"{word} the {format_bytes(budget)} budget")
    return "; ".join(parts)


def steps_svg(series: StepSeries) -> str:
    """The static figure: samples/s per step on the left, memory per step (stacked by category) with the dashed
    budget on the right, a title line that sums it up and a legend.

    Example:
        >>> from types import SimpleNamespace as R
        >>> svg = steps_svg(step_series([R(step=1, peak_bytes=2**20, samples_per_s=4.0, categories={})], 2**21))
        >>> svg.startswith("<svg") and "budget 2.0 MiB" in svg and "samples/s" in svg
        True
    """
    svg = Svg()
    svg.text(20, 24, steps_text(series), size=14, weight="bold")
    panel = (_WIDTH - _LEFT - _GAP - _RIGHT) / 2
    bottom = _HEIGHT - _BOTTOM
    steps = series["steps"]
    last = max(steps, default=1)
    speed = series["samples_per_s"]
    _panel(svg, _LEFT, panel, bottom, "samples/s per step", last, max(speed, default=0.0), "samples/s",
           [(speed, RATE_COLOR, False)], steps)
    totals = [sum(values) for values in zip(*series["memory"].values(), strict=True)] or [0.0]
    budget = series["budget_mib"]
    unit, scale = ("GiB", 1 / 1024) if max(max(totals), budget or 0) >= 4096 else ("MiB", 1.0)
    stacked: list[tuple[list[float], str, bool]] = []
    floor = [0.0] * len(steps)
    for name, values in series["memory"].items():
        floor = [low + value * scale for low, value in zip(floor, values, strict=True)]
        stacked.append((floor, CATEGORY_COLORS.get(name, PEAK_COLOR), True))
    top = max(max(totals) * scale, (budget or 0) * scale)
    left = _LEFT + panel + _GAP
    area = _panel(svg, left, panel, bottom, "memory per step", last, top, unit, stacked[::-1], steps)
    if budget is not None:
        y = area(budget * scale)
        svg.line(left, y, left + panel, y, BUDGET_COLOR, ' stroke-width="2" stroke-dasharray="6 4"')
        text = f"budget {format_bytes(int(budget * _MIB))}"
        label_y = y - 5 if y - 18 >= _TOP else y + 14  # on a white ground, so the areas behind never hide it
        width = text_width(text, 11) + 8
        svg.add(f'<rect x="{px(left + panel - 2 - width)}" y="{px(label_y - 11)}" width="{px(width)}" height="15" '
                'fill="#FFFFFF" fill-opacity="0.9" rx="2"/>')
        svg.text(left + panel - 6, label_y, text, anchor="end", fill=BUDGET_COLOR)
    legend = [(name, CATEGORY_COLORS.get(name, PEAK_COLOR)) for name in series["memory"]]
    x = 20.0  # its own row under the title, from the left edge: never over a panel's title
    for name, colour in legend:
        svg.add(f'<rect x="{px(x)}" y="{px(_LEGEND_Y - 9)}" width="10" height="10" fill="{colour}"/>')
        svg.text(x + 14, _LEGEND_Y, name)
        x += 30 + text_width(name, 11)
    return svg.document(_WIDTH, _HEIGHT, steps_text(series), defs="")


def _panel(svg: Svg, left: float, width: float, bottom: float, title: str, last: int, tallest: float, unit: str,
           lines: list[tuple[list[float], str, bool]], steps: list[int]) -> Any:
    """Axes, grid and ``lines`` (values, colour, filled) over ``steps``; returns the value-to-pixel function."""
    ticks = nice_ticks(tallest)
    height = bottom - _TOP
    top_value = ticks[-1] or 1.0

    def y(value: float) -> float:
        return bottom - max(0.0, min(value, top_value)) / top_value * height

    def x(step: float) -> float:
        return left + (step - 1) / max(1, last - 1) * width if last > 1 else left + width / 2

    svg.text(left + width / 2, _TOP - 8, title, size=12, anchor="middle", weight="bold")
    for tick in ticks:
        svg.line(left, y(tick), left + width, y(tick), _GRID)
        svg.text(left - 6, y(tick) + 4, axis_number(tick), anchor="end", fill=_MUTED)
    # The axis title turned, beside the widest tick value: whole, however long ("samples/s").
    title_x = left - max(text_width(axis_number(tick), 11) for tick in ticks) - 16
    title_y = _TOP + height / 2
    svg.add(f'<text x="{px(title_x)}" y="{px(title_y)}" transform="rotate(-90 {px(title_x)} {px(title_y)})" '
            f'text-anchor="middle" fill="{_MUTED}">{escape(unit)}</text>')
    for tick in nice_ticks(last, 6):
        if 1 <= tick <= last and tick == int(tick):  # whole steps only
            svg.text(x(tick), bottom + 16, axis_number(tick), anchor="middle", fill=_MUTED)
    svg.text(left + width / 2, bottom + 34, "optimizer step", anchor="middle", fill=_MUTED)
    for values, colour, filled in lines:
        if not values:
            continue
        points = " ".join(f"{px(x(step))},{px(y(value))}" for step, value in zip(steps, values, strict=True))
        if len(values) == 1:
            svg.add(f'<circle cx="{px(x(steps[0]))}" cy="{px(y(values[0]))}" r="4" fill="{colour}"/>')
        elif filled:
            base = f"{px(x(steps[-1]))},{px(bottom)} {px(x(steps[0]))},{px(bottom)}"
            svg.add(f'<polygon points="{points} {base}" fill="{colour}" stroke="none"/>')
        else:
            svg.add(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2"/>')
    return y


def _thinned(count: int, keep: int | None, limit: int) -> list[int]:
    """At most about ``limit`` indices of ``count``, evenly spaced, with ``keep`` and the last one."""
    if count <= limit:
        return list(range(count))
    stride = math.ceil(count / limit)
    chosen = set(range(0, count, stride)) | {count - 1}
    if keep is not None:
        chosen.add(keep)
    return sorted(chosen)
