"""Where the live figure's text goes, so that none of it overlaps: the height of its two rows (:func:`row_domains`)
and which points of its memory-vs-throughput scatter are named (:func:`spaced_labels`).

The plan axis of the top row turns its ticks when the names are long, and its title sits below them; the bottom
row's titles sit above that row. :func:`row_domains` leaves the gap between the rows that those need, in pixels.
A scatter of dozens of plans has points too close to name each one: :func:`spaced_labels` names the best first and
then every point whose name touches no name already written (the hover names every point).

Text widths are estimated (:func:`memlab.report.views.plan_axis.text_width`), a little generously.
"""

from __future__ import annotations

from collections.abc import Sequence

from memlab.report.views.plan_axis import PlanAxis, text_width

__all__ = ["MARGIN_PX", "RIGHT_PART", "SCATTER_HEADROOM", "SCATTER_PANEL_PX", "label_positions", "row_domains",
           "spaced_labels"]

MARGIN_PX = 40
"""The live figure's top and bottom margins."""
SCATTER_PANEL_PX = 300.0
"""The width the scatter's labels are spaced for: its panel in a figure about 800 px wide (wider only spaces more)."""

RIGHT_PART = 0.5
"""A point beyond this share of the scatter's peak axis has its name written to its left, ending at it: centred, the
name of the right-most point (the largest peak, at 95% of the axis) ran past the plot's edge, where plotly cuts it
("accum2 ck" in a 1,000-px window)."""

SCATTER_HEADROOM = 1.2
"""The scatter's speed axis runs to this many times the fastest speed, so that the top point's name stays inside."""

_AXIS_TITLE_PX = 40.0  # the plan axis's standoff and its title's line
_ROW_TITLE_PX = 34.0  # a bottom-row title and the space above it
_LABEL_FONT = 12.0
_LABEL_LINE = 15.0


def row_domains(axis: PlanAxis, height_px: int) -> tuple[tuple[float, float], tuple[float, float], float]:
    """The y domains (fractions of the plot area) of the top and the bottom row of a live figure ``height_px`` tall
    whose top row's plan axis is ``axis``, and where the bottom row's titles go (the top of its domain).

    Example:
        >>> from memlab.report.views.plan_axis import plan_axis
        >>> top, bottom, titles = row_domains(plan_axis(["plain", "ckpt"]), 640)
        >>> top[1], bottom[0], titles == bottom[1], round(top[0] - bottom[1], 2)
        (1.0, 0.0, True, 0.16)
    """
    plot_px = height_px - 2 * MARGIN_PX
    gap_px = axis.extent_px() + _AXIS_TITLE_PX + _ROW_TITLE_PX
    row = max(plot_px - gap_px, plot_px / 2) / 2 / plot_px
    return (1.0 - row, 1.0), (0.0, row), row


def label_positions(xs: Sequence[float]) -> list[str]:
    """Where the scatter writes each point's name (plotly's ``textposition``): above it, centred; or, beyond
    :data:`RIGHT_PART` of the axis (which plotly draws from 0 to a little past the largest value), above it and to its
    left, ending at it, so that no name runs past the plot's right edge however narrow the cell.

    Example:
        >>> label_positions([1.0, 6.0, 10.0])
        ['top center', 'top left', 'top left']
    """
    span = 1.05 * max((abs(x) for x in xs), default=0.0) or 1.0
    return ["top left" if abs(x) / span > RIGHT_PART else "top center" for x in xs]


def spaced_labels(
    names: Sequence[str],
    xs: Sequence[float],
    ys: Sequence[float],
    *,
    height_px: float,
    width_px: float = SCATTER_PANEL_PX,
) -> list[tuple[str, str]]:
    """The name to write by each point ``(xs[i], ys[i])`` of a scatter ``width_px`` by ``height_px``, and where
    (plotly's ``textposition``): above it (:func:`label_positions`), else below it where above would touch a name
    already written, else ``""`` (its hover names it). Points come first to last, so the caller puts the best first.
    The x axis is taken to run from 0 to a little past the largest value (as plotly draws it), the y axis from 0 to
    :data:`SCATTER_HEADROOM` times the largest.

    Example:
        >>> spaced_labels(["a", "b", "c"], [10.0, 10.1, 50.0], [5.0, 5.0, 1.0], height_px=200)
        [('a', 'top center'), ('b', 'bottom center'), ('c', 'top left')]
        >>> spaced_labels(["a", "b", "c"], [10.0, 10.1, 10.2], [5.0, 5.0, 5.0], height_px=200)[2]
        ('', 'top left')
    """
    x_span = 1.05 * max((abs(x) for x in xs), default=0.0) or 1.0
    y_span = SCATTER_HEADROOM * max((abs(y) for y in ys), default=0.0) or 1.0
    written: list[tuple[float, float, float, float]] = []
    shown = []
    for name, x, y, above in zip(names, xs, ys, label_positions(xs), strict=True):
        half = text_width(name, _LABEL_FONT) / 2
        centre = x / x_span * width_px - (half if above == "top left" else 0.0)  # "left": ending at the point
        point_y = y / y_span * height_px
        chosen = ("", above)
        for where, bottom in ((above, point_y + 6), (above.replace("top", "bottom"), point_y - 6 - _LABEL_LINE)):
            box = (centre - half, centre + half, bottom, bottom + _LABEL_LINE)
            clear = bottom >= 0 and all(
                box[1] <= b[0] or b[1] <= box[0] or box[3] <= b[2] or b[3] <= box[2] for b in written)
            if clear and name:
                written.append(box)
                chosen = (name, where)
                break
        shown.append(chosen)
    return shown
