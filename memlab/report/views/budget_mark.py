"""The budget on a figure's memory panel: its dashed line and its label, the label placed where it covers no bar (the
rule :func:`label_place`, which the plotly figure and the SVG figure share: only their units differ).

The label sits just above the line, as far right as it covers no bar that reaches its height (a bar just past the
budget would hide its top under the label), else just below the line, else at the right end above it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from memlab.plan import format_bytes
from memlab.report.views.colors import BUDGET_COLOR
from memlab.report.views.plan_axis import PLOTLY_PANEL_PX, text_width

__all__ = ["LabelBox", "budget_line", "budget_note", "label_place", "memory_tops"]

_MIB = 1024**2
_NOTE_FONT_PX = 12  # plotly's default annotation font
_NOTE_BAND = 0.08  # the note's height, as a share of the memory panel's height (about 20 px of its 250)


class LabelBox(NamedTuple):
    """The label's size and the room around its line, in the panel's units (x along the plans, y up the memory)."""

    width: float
    height: float
    above: float
    """How far above the line its bottom sits, placed above it."""
    below: float
    """How far below the line its top sits, placed below it."""
    step: float
    """How far left each try moves it."""


def label_place(tops: Sequence[float | None], centers: Sequence[float], half: float, line: float, box: LabelBox, *,
                left: float, right: float, ceiling: float) -> tuple[float, bool]:
    """Where the budget's label goes: ``(its right end, above the line)``. ``tops[i]`` is bar ``i``'s top (None: no
    bar), ``centers[i]`` its middle and ``half`` its half width; ``line`` is the budget's height, ``left`` and
    ``right`` the panel's ends and ``ceiling`` its top, all in the caller's units, y growing upwards. Above the line
    (where the panel has room for it there), from the right end leftwards, the first place that covers no bar
    reaching into it; then below the line the same way; else the right end, above the line where there is room.

    Example (bars of height 10 and 4 at x 1 and 3; the budget at 8; a label 1.5 wide):
        >>> box = LabelBox(width=1.5, height=1, above=0.2, below=0.2, step=0.5)
        >>> label_place([10, 4], [1, 3], 0.4, 8, box, left=0, right=4, ceiling=12)
        (4.0, True)
        >>> label_place([4, 10], [1, 3], 0.4, 8, box, left=0, right=4, ceiling=12)
        (2.5, True)
    """
    room = line + box.above + box.height <= ceiling
    bands = [(line + box.above, True)] if room else []  # each band by its bottom
    bands.append((line - box.below - box.height, False))
    rights = [right - index * box.step for index in range(int((right - left - box.width) / box.step) + 1)]
    for bottom, above in bands:
        for end in rights:
            if not any(top is not None and top > bottom and center + half > end - box.width and center - half < end
                       for top, center in zip(tops, centers, strict=True)):
                return end, above
    return right, room


def memory_tops(columns: Sequence[dict[str, Any]], data: dict[str, Any]) -> list[float | None]:
    """Each plan's tallest memory bar in MiB (None: no bar): its peak, or its "does not fit" bar (the column after
    the categories' of :func:`memlab.report.views.figure.figure_columns`)."""
    heights = columns[len(data["categories"])]["y"]
    return [height if height is not None else peak for height, peak in zip(heights, data["peak_mib"], strict=True)]


def budget_line(budget_mib: float) -> dict[str, Any]:
    """The dashed budget line across the peak memory panel, as a plotly shape (drawn above the bars).

    Example:
        >>> budget_line(8.0)["yref"], budget_line(8.0)["line"]["dash"], budget_line(8.0)["layer"]
        ('y2', 'dash', 'above')
    """
    return {
        "type": "line",
        "xref": "x2 domain",
        "x0": 0,
        "x1": 1,
        "yref": "y2",
        "y0": budget_mib,
        "y1": budget_mib,
        "layer": "above",
        "line": {"color": BUDGET_COLOR, "dash": "dash", "width": 2},
        "name": "budget",
    }


def budget_note(budget: int, tops: Sequence[float | None] = (), bargap: float = 0.25) -> dict[str, Any]:
    """The label of :func:`budget_line` (``"budget 8.0 GiB"``), as a plotly annotation on a white ground: just above
    the line at its right end, or, given the memory bars' ``tops`` (MiB, one per plan; their gap ``bargap``), where
    :func:`label_place` finds it covers none (the panel's width taken as the figure's plan axis is laid out for,
    :data:`~memlab.report.views.plan_axis.PLOTLY_PANEL_PX` of the throughput panel's share).

    Example:
        >>> note = budget_note(2**20)
        >>> note["text"], note["x"], note["xanchor"], note["yanchor"], note["bgcolor"]
        ('budget 1.0 MiB', 1.0, 'right', 'bottom', 'rgba(255,255,255,0.85)')
        >>> budget_note(2**20, [0.5, 1.02])["x"] < 1  # the last bar just past the line: the label moves left
        True
    """
    text = f"budget {format_bytes(budget)}"
    line = budget / _MIB
    x, above = 1.0, True
    if tops:
        count = len(tops)
        panel_px = PLOTLY_PANEL_PX / 0.4 * 0.6  # the memory panel: 0.6 of the width where the throughput one has 0.4
        reach = max([line, *(top for top in tops if top is not None)]) * 1.05  # plotly's range, about
        box = LabelBox(width=(text_width(text, _NOTE_FONT_PX) + 8) / panel_px, height=_NOTE_BAND * reach,
                       above=0.0, below=0.01 * reach, step=8 / panel_px)
        # No ceiling: a plotly annotation may reach above the panel's range, into its margin, as it always could.
        x, above = label_place(tops, [(index + 0.5) / count for index in range(count)], (1 - bargap) / count / 2,
                               line, box, left=0.0, right=1.0, ceiling=float("inf"))
    return {
        "text": text,
        "xref": "x2 domain",
        "yref": "y2",
        "x": x,
        "y": line,
        "xanchor": "right",
        "yanchor": "bottom" if above else "top",
        "showarrow": False,
        "bgcolor": "rgba(255,255,255,0.85)",
        "borderpad": 2,
        "font": {"color": BUDGET_COLOR},
    }
