"""The plan axis: how a figure names its bars, one per plan, so that no two ticks touch (:func:`plan_axis`).

Up to :data:`FULL_LABELS_UP_TO` plans the bars are named by their labels (turned when they would touch); beyond that
by their numbers. The plotly figures (:mod:`memlab.report.views.figure`, the live figure) and the static SVG
(:mod:`memlab.report.views.svg.layout`) name their bars with it; text widths are estimated (:func:`text_width`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["FULL_LABELS_UP_TO", "PLOTLY_PANEL_PX", "PlanAxis", "figure_height", "plan_axis", "plan_axis_layout",
           "run_labels", "text_width"]

FULL_LABELS_UP_TO = 12
"""Up to this many plans the bars are named by their labels; with more (a budget search tries dozens), by their
numbers 1, 2, ..., and the hover (the SVG: its key) says which plan each number is."""

PLOTLY_PANEL_PX = 240.0
"""The width, in pixels, that a plotly figure's plan axis is laid out for. The figure follows the width of the cell,
which Python cannot know, so its ticks are spaced for the narrowest panel of a narrow notebook: the throughput
panel of a figure about 800 px wide. Wider cells only space them more."""

_CHAR_WIDTH = 0.6  # the average width of a character of a sans-serif font, in font sizes (a little generous)
_LINE_HEIGHT = 1.25  # in font sizes
_TICK_FONT = 11.0
_NUMBER_FONT = 10.0
_NUMBER_STEPS = (1, 2, 5, 10, 20, 50, 100, 200, 500)


@dataclass(frozen=True)
class PlanAxis:
    """How the plan axis names its bars (see :func:`plan_axis`).

    Args:
        text: per bar, what its tick says: its label, or its number (``"1"``, ``"2"``, ...).
        shown: the bars (indices) whose tick is written; the others are left out so that no two ticks touch.
        angle: how far the ticks are turned, in plotly's degrees: 0, -45 or -90 (reading upwards).
        font_size: the ticks' font size, in pixels.
        numbered: True when the bars are named by their numbers.

    Example:
        >>> PlanAxis(["plain"], [0], 0, 11.0, False).extent_px()
        13.75
    """

    text: list[str]
    shown: list[int]
    angle: int
    font_size: float
    numbered: bool

    def extent_px(self) -> float:
        """How far, in pixels, the written ticks reach below the axis.

        Example:
            >>> round(plan_axis(["a long label here"] * 8, 240).extent_px(), 1)
            89.1
        """
        line = self.font_size * _LINE_HEIGHT
        widest = max((text_width(self.text[index], self.font_size) for index in self.shown), default=0.0)
        if self.angle == 0:
            return line
        if self.angle == -90:
            return widest
        return (widest + line) * 0.7071


def run_labels(labels: Sequence[str]) -> list[str]:
    """Each plan's name as the table, the figures and the captions say it: its label, and where a label repeats (a
    setting run twice, in the panel), `` (2)``, `` (3)``... on its later runs, so that no two rows or bars read
    the same.

    Example:
        >>> run_labels(["plain", "ckpt", "plain"])
        ['plain', 'ckpt', 'plain (2)']
    """
    seen: dict[str, int] = {}
    names = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        names.append(label if seen[label] == 1 else f"{label} ({seen[label]})")
    return names


def text_width(text: str, font_size: float) -> float:
    """An estimate of the width of ``text`` in pixels, in a sans-serif font of ``font_size`` pixels (no font is read:
    the estimate is the average character width, a little generous).

    Example:
        >>> text_width("plain", 10)
        30.0
    """
    return len(text) * _CHAR_WIDTH * font_size


def plan_axis(labels: Sequence[str], width_px: float = PLOTLY_PANEL_PX) -> PlanAxis:
    """How to name ``labels``' bars along an axis ``width_px`` pixels long, so that no two ticks touch.

    Up to :data:`FULL_LABELS_UP_TO` plans, each bar's tick is its label: level where the widest fits its slot (in
    a font a size smaller if need be), else turned -45 degrees, else -90 (where the slot is narrower still). With
    more plans each bar is numbered (the table's ``#`` column, its hover and the SVG's key say which plan it is), in a
    smaller font, and where even the numbers would touch only every 2nd, 5th, 10th... number is written (1, 5, 10,
    15, ...).

    Example:
        >>> plan_axis(["plain", "ckpt"]).angle, plan_axis(["mb2x4 ckpt bf16 adamw8bit"] * 8).angle
        (0, -45)
        >>> many = plan_axis([f"plan {i}" for i in range(60)])
        >>> many.numbered, many.text[:3], [many.text[i] for i in many.shown][:4]
        (True, ['1', '2', '3'], ['1', '5', '10', '15'])
    """
    count = len(labels)
    if count == 0:
        return PlanAxis([], [], 0, _TICK_FONT, False)
    slot = width_px / count
    if count <= FULL_LABELS_UP_TO:
        every = list(range(count))
        for size in (_TICK_FONT, _TICK_FONT - 1):
            if max(text_width(label, size) for label in labels) <= 0.9 * slot:
                return PlanAxis(list(labels), every, 0, size, False)
        # Turned ticks are parallel lines slot * sin(angle) apart: -45 degrees where that clears a line of text.
        angle = -45 if slot * 0.7071 >= _TICK_FONT * _LINE_HEIGHT else -90
        return PlanAxis(list(labels), every, angle, _TICK_FONT, False)
    numbers = [str(index + 1) for index in range(count)]
    needed = text_width(numbers[-1], _NUMBER_FONT) + 0.4 * _NUMBER_FONT  # the widest number and a gap
    step = next((step for step in _NUMBER_STEPS if slot * step >= needed), count)
    shown = [index for index in range(count) if (index + 1) % step == 0]
    if step > 1 and slot * (step - 1) >= needed:  # the 1 too, where it keeps clear of the first multiple
        shown.insert(0, 0)
    return PlanAxis(numbers, shown, 0, _NUMBER_FONT, True)


def plan_axis_layout(axis: PlanAxis, labels: Sequence[str]) -> dict[str, Any]:
    """A plotly x-axis update that writes ``axis``'s ticks under the bars named ``labels`` (the trace x values).

    Example:
        >>> layout = plan_axis_layout(plan_axis(["plain", "ckpt"]), ["plain", "ckpt"])
        >>> layout["tickvals"], layout["ticktext"], layout["tickangle"], layout["title"]["text"]
        (['plain', 'ckpt'], ['plain', 'ckpt'], 0, 'plan')
    """
    title = "plan number (the table's # column)" if axis.numbered else "plan"
    return {
        "tickmode": "array",
        "tickvals": [labels[index] for index in axis.shown],
        "ticktext": [axis.text[index] for index in axis.shown],
        "tickangle": axis.angle,
        "tickfont": {"size": axis.font_size},
        "title": {"text": title},
    }


def figure_height(axis: PlanAxis, base_px: int) -> int:
    """A figure's height in pixels: ``base_px``, and more where turned ticks need the room (plotly's automargin
    would otherwise take it from the bars).

    Example:
        >>> figure_height(plan_axis(["plain"]), 460), figure_height(plan_axis(["mb2x4 ckpt bf16 adamw8bit"] * 8), 460)
        (460, 560)
    """
    extra = max(0.0, axis.extent_px() - 2 * axis.font_size * _LINE_HEIGHT)
    return base_px + int(round(extra / 20) * 20)
