"""The static figure's layout: where its title, legend, panels and key go (:func:`report_svg`).

Throughput (with the 95% interval of each speed as an error bar) and peak memory by category, side by side up to
:data:`~memlab.report.views.plan_axis.FULL_LABELS_UP_TO` plans, one above the other across the whole width beyond that
(so that every numbered bar has room for its number); a legend in three groups (memory, speed, status); the budget as a
dashed line labelled at its right end; and a key under the panels that spells every plan out
(:meth:`memlab.Plan.describe`). Sizes are pixels of a figure :data:`WIDTH` wide that shrinks with a narrower cell.
The panels themselves are :mod:`memlab.report.views.svg.panels`; the SVG writing, :mod:`memlab.report.views.svg`.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

from memlab.report.data import Report
from memlab.report.views.colors import HOST_COLOR
from memlab.report.views.figure import (
    BEST_COLOR,
    BUDGET_COLOR,
    CATEGORY_COLORS,
    DOES_NOT_FIT_COLOR,
    INTERVAL_COLOR,
    RATE_COLOR,
    TIE_COLOR,
    figure_data,
)
from memlab.report.views.host_figure import DOES_NOT_FIT_HOST, HOST_BUDGET_NAME, HOST_NAME, host_data
from memlab.report.views.plan_axis import FULL_LABELS_UP_TO, plan_axis, text_width
from memlab.report.views.svg import Svg, bold_width, escape, px, wrap
from memlab.report.views.svg.panels import Box, PlanBars
from memlab.report.views.verdicts import ERROR, OUT_OF_MEMORY, OVER_BUDGET
from memlab.techniques.precision import BF16_ON_CPU_SHORT

__all__ = ["WIDTH", "report_svg"]

WIDTH = 960
"""The width of the SVG's drawing (its viewBox) in pixels: inline it is drawn at most this wide, and as wide as a
narrower cell (:meth:`memlab.report.views.svg.Svg.document`)."""

_MUTED = "#666666"
_LEFT, _RIGHT = 70.0, 24.0  # the panels' margins: the left one holds their values and the axis title
_EDGE = 20.0  # where the title, the legend and the key start
_GAP = 78.0  # between side-by-side panels: the memory panel's tick labels and axis title
_SIDE_HEIGHT = 250.0
_STACKED_HEIGHTS = (170.0, 230.0)
_KEY_LINE = 16.0
_KEY_FONT = 11.0
_KEY_INDENT = 14.0
_HOST_HEIGHT = 170.0


def report_svg(report: Report) -> str:
    """The report's figure as a standalone SVG document (text): what :meth:`Report.plot` shows, without plotly.js.

    Hovering a bar in a browser shows its plan spelled out and its numbers (SVG ``<title>`` tooltips, where the SVG is
    inlined in the page, as nbconvert's HTML does).

    Example:
        >>> from memlab.plan import Plan
        >>> from memlab.report.data import Trial
        >>> fast = Trial(Plan(), "ok", 900 * 2**20, {"params": 900 * 2**20}, 0.5, 16.0, None, "cpu",
        ...              rows_per_step=8, step_times=(0.45, 0.5, 0.55))
        >>> small = Trial(Plan(checkpointing=True), "ok", 500 * 2**20, {"params": 500 * 2**20}, 1.0, 8.0, None, "cpu")
        >>> svg = report_svg(Report([fast, small], budget=2**30))
        >>> svg.startswith("<svg"), "budget 1.00 GiB" in svg, "checkpointing" in svg  # the key spells ckpt out
        (True, True, True)
    """
    return _Layout(report, figure_data(report)).svg()


class _Layout:
    """One figure being laid out on its :class:`~memlab.report.views.svg.Svg`."""

    def __init__(self, report: Report, data: dict[str, Any]) -> None:
        self.report = report
        self.data = data
        self.canvas = Svg()
        digest = hashlib.sha1(repr((data, report.budget)).encode()).hexdigest()[:10]
        self.hatch = f"memlab-hatch-{digest}"  # unique per figure: a page may inline many of them
        self.bars = PlanBars(self.canvas, report, data, self.hatch)
        self.labels: list[str] = data["labels"]
        self.count = len(self.labels)
        self.host = host_data(report.trials, self.labels)

    def svg(self) -> str:
        title = "memlab: memory and speed per plan"
        self.canvas.text(_EDGE, 30, title, size=17, weight="600")
        y = 54.0
        if self.data["caption"]:  # why the best is best: the bars say which
            self.canvas.add(f'<text class="caption" x="{px(_EDGE)}" y="{px(y - 2)}" font-size="12" '
                            f'fill="{BEST_COLOR}" font-weight="600">{escape(self.data["caption"])}</text>')
            y += 22
        y = self._legend(y)
        if self.count == 0:
            self.canvas.text(WIDTH / 2, y + 60, "No plan measured yet.", size=14, anchor="middle", fill=_MUTED)
            return self._document(y + 100, title)
        inner = WIDTH - _LEFT - _RIGHT
        bars = self.bars
        if self.count <= FULL_LABELS_UP_TO:
            top = y + 40
            speed_width = (inner - _GAP) * 0.5
            axis = plan_axis(self.labels, speed_width)  # the panels are as wide: the same names under both
            speed = bars.speed(Box(_LEFT, top, speed_width, _SIDE_HEIGHT), axis)
            memory = bars.memory(Box(_LEFT + speed_width + _GAP, top, inner - _GAP - speed_width, _SIDE_HEIGHT), axis)
            bottom = max(bars.plan_ticks(speed), bars.plan_ticks(memory))
        else:
            axis = plan_axis(self.labels, inner)
            speed = bars.speed(Box(_LEFT, y + 40, inner, _STACKED_HEIGHTS[0]), axis)
            below = bars.plan_ticks(speed)
            memory = bars.memory(Box(_LEFT, below + 44, inner, _STACKED_HEIGHTS[1]), axis)
            bottom = bars.plan_ticks(memory)
        if self.host is not None:  # under the memory panel, as wide, the same plans under it
            box = Box(memory.left, bottom + 44, memory.width, _HOST_HEIGHT)
            bottom = bars.plan_ticks(bars.host(box, axis, self.host))
        height = self._key(bottom + 34)
        return self._document(height, title)

    def _document(self, height: float, title: str) -> str:
        hatch = (
            f'<pattern id="{self.hatch}" patternUnits="userSpaceOnUse" width="6" height="6" '
            'patternTransform="rotate(45)">'
            '<rect width="6" height="6" fill="#D9D9D9"/>'
            f'<line x1="0" y1="0" x2="0" y2="6" stroke="{DOES_NOT_FIT_COLOR}" stroke-width="2.5"/></pattern>'
            # over the budget: the same hatch on a clear ground, over the plan's own colours
            f'<pattern id="{self.hatch}-over" patternUnits="userSpaceOnUse" width="6" height="6" '
            'patternTransform="rotate(45)">'
            '<line x1="0" y1="0" x2="0" y2="6" stroke="#333333" stroke-width="1.6" stroke-opacity="0.7"/></pattern>'
        )
        return self.canvas.document(WIDTH, height, title, hatch)

    # --- legend ---

    def _legend(self, top: float) -> float:
        """The three groups of legend entries, wrapped over as many rows as they need; returns the bottom."""
        # Only what is drawn: a mark no bar carries is not in the legend.
        marks, verdict = self.data["marks"], self.data["verdict"]
        speed = [("samples/s", f"swatch:{RATE_COLOR}")]
        speed += [("best", f"swatch:{BEST_COLOR}")] if "best" in marks else []
        speed += [("tie", f"swatch:{TIE_COLOR}")] if "tie" in marks else []
        speed += [("95% interval", "interval")] if any(low is not None for low in self.data["speed_low"]) else []
        # each verdict's mark as drawn: the grey hatch of a plan out of memory, the hatch over a plan's own colours
        status = [("over budget", "hatch-over")] if OVER_BUDGET in verdict else []
        status += [("out of memory", "hatch")] if OUT_OF_MEMORY in verdict else []
        status += [("error", "cross")] if ERROR in verdict else []
        groups: list[tuple[str, list[tuple[str, str]]]] = [
            ("memory", [(name, f"swatch:{CATEGORY_COLORS[name]}") for name in self.data["categories"]]),
            ("speed", speed),
            ("status", status),
        ]
        if self.data["budget_mib"] is not None:
            groups[-1][1].append(("budget", "budget"))
        if self.host is not None:
            host = [(HOST_NAME, f"swatch:{HOST_COLOR}")]
            host += [(DOES_NOT_FIT_HOST, "hatch-over")] if any(self.host["over"]) else []
            host += [(HOST_BUDGET_NAME, "host-budget")] if self.host["budget"] is not None else []
            groups.append(("host", host))
        x, y = _EDGE, top
        for name, entries in (group for group in groups if group[1]):
            width = bold_width(name, 11) + 8 + sum(text_width(label, 11) + 30 for label, _ in entries)
            if x + width > WIDTH - _RIGHT and x > _EDGE:
                x, y = _EDGE, y + 22
            self.canvas.text(x, y + 4, name, weight="700", fill=_MUTED)
            x += bold_width(name, 11) + 8
            for label, mark in entries:
                self._legend_mark(x, y, mark)
                self.canvas.text(x + 19, y + 4, label)
                x += text_width(label, 11) + 30
            x += 16
        return y + 12

    def _legend_mark(self, x: float, y: float, mark: str) -> None:
        if mark.startswith("swatch:"):
            self.canvas.add(f'<rect x="{px(x)}" y="{px(y - 6)}" width="14" height="12" fill="{mark[7:]}"/>')
        elif mark in ("hatch", "hatch-over"):
            pattern = self.hatch if mark == "hatch" else f"{self.hatch}-over"
            self.canvas.add(
                f'<rect x="{px(x)}" y="{px(y - 6)}" width="14" height="12" fill="url(#{pattern})" '
                f'stroke="{DOES_NOT_FIT_COLOR}"/>'
            )
        elif mark == "cross":
            self.canvas.cross(x + 7, y, 5, BUDGET_COLOR)
        elif mark == "interval":
            self.canvas.interval(x + 7, y - 6, y + 6, 4, INTERVAL_COLOR)
        else:  # budget, host-budget
            dashes = "2,3" if mark == "host-budget" else "5,3"
            self.canvas.line(x, y, x + 16, y, BUDGET_COLOR, f' stroke-width="2" stroke-dasharray="{dashes}"')

    # --- the key ---

    def _key(self, top: float) -> float:
        """Every plan spelled out, in columns (down first), long lines wrapped; returns the figure's bottom. What the
        figure says of bf16's speed on a CPU is said once, beside the key's title, rather than after every such plan."""
        entries = [self._key_entry(index) for index in range(self.count)]
        bf16 = f" ({BF16_ON_CPU_SHORT})"
        slow = any(bf16 in words for _, words, _ in entries)
        entries = [(head, words.replace(bf16, ""), weight) for head, words, weight in entries]
        inner = WIDTH - 2 * _EDGE
        widest = max(bold_width(head, _KEY_FONT) + _prose_width(words) + 30 for head, words, _ in entries)
        columns = 1 if self.count <= 6 else 3 if widest + 16 <= inner / 3 else 2
        column_width = inner / columns
        per_column = math.ceil(self.count / columns)
        self.canvas.text(_EDGE, top, "Plans", size=13, weight="600")
        if slow:
            self.canvas.text(_EDGE + bold_width("Plans", 13) + 10, top, f"bf16 plans: {BF16_ON_CPU_SHORT}",
                             size=_KEY_FONT, fill=_MUTED)
        bottom = top
        numbered = self.count > FULL_LABELS_UP_TO
        number_width = text_width(str(self.count), _KEY_FONT) + 8 if numbered else 0.0
        for column in range(columns):
            x = _EDGE + column * column_width
            y = top + 4
            for index in range(column * per_column, min(self.count, (column + 1) * per_column)):
                head, words, weight = entries[index]
                room = column_width - 16 - number_width
                lines = wrap(words, room - bold_width(head, _KEY_FONT), room - _KEY_INDENT, _prose_width)
                y += _KEY_LINE
                if numbered:
                    self.canvas.text(x + number_width - 8, y, str(index + 1), size=_KEY_FONT, anchor="end",
                                     fill=_MUTED)
                self.canvas.add(
                    f'<text x="{px(x + number_width)}" y="{px(y)}" font-size="{px(_KEY_FONT)}">'
                    f'<tspan font-weight="{weight}">{escape(head)}</tspan>{escape(lines[0])}</text>'
                )
                for line in lines[1:]:
                    y += _KEY_LINE - 3
                    self.canvas.text(x + number_width + _KEY_INDENT, y, line, size=_KEY_FONT)
            bottom = max(bottom, y)
        return bottom + 18

    def _key_entry(self, index: int) -> tuple[str, str, str]:
        """(the bar's name and label, its description and state, the name's font weight) of plan ``index``."""
        label = self.labels[index]
        head = f"{label}: "
        words = self.data["describe"][index]
        if words.startswith(f"{self.report.trials[index].label}: "):  # "plain: every lever off" says its name itself
            words = words.split(": ", 1)[1]
        state = {"oom": " (does not fit: out of memory)", "error": " (failed)"}.get(self.data["status"][index], "")
        if label == self.data["best"]:
            state += " (best)"
        elif self.data["marks"][index] == "tie":
            state += " (as fast as the best within noise)"
        elif self.data["verdict"][index] == OVER_BUDGET:
            host = self.host is not None and self.host["over"][index]
            state += " (does not fit: over the host budget)" if host else " (does not fit: over the budget)"
        return head, words + state, "700" if label == self.data["best"] else "600"


def _prose_width(text: str) -> float:
    """The width of a line of the key: prose, whose spaces and narrow letters make it about 10% narrower than
    :func:`text_width`'s estimate (0.54 font sizes a character in DejaVu Sans, the widest common default)."""
    return 0.9 * text_width(text, _KEY_FONT)
