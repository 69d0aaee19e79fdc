"""The two panels of the static figure: throughput per plan (with each speed's 95% interval) and peak memory by
category per plan (a hatched bar where a plan does not fit, a cross where it failed, the budget as a dashed line),
each with its frame, values and plan names. Where the panels go is :mod:`memlab.report.views.svg.layout`'s business.

Every bar has a ``<title>``: hovering it in a browser shows its plan and its numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from memlab.plan import format_bytes
from memlab.report.data import Report
from memlab.report.format import format_rate
from memlab.report.views.budget_mark import LabelBox, label_place, memory_tops
from memlab.report.views.colors import HOST_COLOR
from memlab.report.views.figure import (
    BEST_COLOR,
    BUDGET_COLOR,
    CATEGORY_COLORS,
    DOES_NOT_FIT_COLOR,
    INTERVAL_COLOR,
    figure_columns,
)
from memlab.report.views.host_figure import DOES_NOT_FIT_HOST, HOST_BUDGET_NAME, HOST_TITLE
from memlab.report.views.plan_axis import FULL_LABELS_UP_TO, PlanAxis, text_width
from memlab.report.views.svg import Svg, axis_number, escape, nice_ticks, px
from memlab.report.views.verdicts import ERROR, NARROW_MARKS, OUT_OF_MEMORY, OVER_BUDGET, VERDICT_WORDS

__all__ = ["Area", "Box", "PlanBars"]

_MUTED = "#666666"
_GRID = "#E6E6E6"
_AXIS = "#9A9A9A"
_BAR_FILL = 0.75  # of a bar's slot
_MAX_BAR = 64.0
_BUDGET_ABOVE = 4.0  # a budget more than this many times the tallest bar is written, not drawn to scale
_GIB_FROM_MIB = 4096.0

_SPEED_COLUMN = -2  # figure_columns' samples/s bars (the marks above them last)
_CHAR_WIDTH = 6.0  # about one character of 10 px bold text


class Box(NamedTuple):
    """A rectangle in pixels."""

    left: float
    top: float
    width: float
    height: float


@dataclass(frozen=True)
class Area:
    """A plotting area: its box in pixels, the value at its top edge, and its bars' axis.

    Example:
        >>> from memlab.report.views.plan_axis import plan_axis
        >>> area = Area(0, 0, 100, 50, 10.0, plan_axis(["a", "b"]))
        >>> area.y(5.0), area.center(1), area.bar_width
        (25.0, 75.0, 37.5)
    """

    left: float
    top: float
    width: float
    height: float
    top_value: float
    axis: PlanAxis

    @property
    def bottom(self) -> float:
        return self.top + self.height

    def y(self, value: float) -> float:
        """Where ``value`` is, in pixels from the top (clipped to the area)."""
        return self.bottom - max(0.0, min(value, self.top_value)) / self.top_value * self.height

    def center(self, index: int) -> float:
        """The middle of bar ``index``, in pixels from the left."""
        return self.left + (index + 0.5) * self.width / max(1, len(self.axis.text))

    @property
    def bar_width(self) -> float:
        return min(_MAX_BAR, _BAR_FILL * self.width / max(1, len(self.axis.text)))


class PlanBars:
    """Draws a report's panels on ``svg``, from its plain data (:func:`memlab.report.views.figure.figure_data`);
    ``hatch`` is the id of the "does not fit" pattern the document defines.

    Example:
        >>> from memlab.plan import Plan
        >>> from memlab.report.data import Trial
        >>> from memlab.report.views.figure import figure_data
        >>> from memlab.report.views.plan_axis import plan_axis
        >>> report = Report([Trial(Plan(), "ok", 2**20, {"params": 2**20}, 0.5, 8.0, None, "cpu")])
        >>> bars = PlanBars(Svg(), report, figure_data(report), "hatch")
        >>> area = bars.memory(Box(0, 0, 200, 100), plan_axis(["plain"]))
        >>> bars.unit, area.top_value, sum('class="bar"' in element for element in bars.svg.elements)
        ('MiB', 1.0, 1)
    """

    def __init__(self, svg: Svg, report: Report, data: dict[str, Any], hatch: str) -> None:
        self.svg = svg
        self.report = report
        self.data = data
        self.hatch = hatch
        self.columns = figure_columns(report, data)
        self.labels: list[str] = data["labels"]
        self.count = len(self.labels)
        mib = [value for value in memory_tops(self.columns, self.data) if value is not None]
        self.unit, self.scale = _memory_unit(max(mib, default=0.0))

    def speed(self, box: Box, axis: PlanAxis) -> Area:
        """The throughput panel in ``box``: samples/s per plan, the best one marked, 95% intervals as error bars."""
        speeds: list[float | None] = self.data["samples_per_s"]
        highs: list[float | None] = self.data["speed_high"]
        tallest = max([value for value in (*speeds, *highs) if value is not None], default=0.0)
        ticks = nice_ticks(tallest * 1.08)  # room above the tallest for the word "best"
        area = Area(*box, ticks[-1], axis)
        self._frame(area, ticks, "Throughput", "samples/s")
        for index, speed in enumerate(speeds):
            if speed is None:
                continue
            colour = self.columns[_SPEED_COLUMN]["marker.color"][index]
            low, high = self.data["speed_low"][index], self.data["speed_high"][index]
            tip = f"{self.who(index)}\n{format_rate(speed)} samples/s"
            if low is not None and high is not None:
                tip += f" (95% interval {format_rate(low)} to {format_rate(high)})"
            verdict, mark = self.data["verdict"][index], self.data["marks"][index]
            tip += f"\n{self._words(index)}"
            if mark == "best" and self.data["caption"]:
                tip += f"\n{self.data['caption']}"
            elif mark == "tie":
                tip += "\ntie: as fast as the best within noise"
            bar = self._bar(area, index, 0.0, speed, colour)
            if verdict == OVER_BUDGET:  # hatched as every bar of a plan that does not fit
                bar += self._bar(area, index, 0.0, speed, f"url(#{self.hatch})", stroke=DOES_NOT_FIT_COLOR)
            self.svg.add(f'<g class="plan" data-verdict="{verdict}" data-mark="{mark}"><title>{escape(tip)}</title>'
                         f"{bar}")
            if low is not None and high is not None:
                cap = min(5.0, area.bar_width / 3)
                self.svg.interval(area.center(index), area.y(high), area.y(low), cap, INTERVAL_COLOR)
            word = mark or (OVER_BUDGET if verdict == OVER_BUDGET and not area.axis.numbered else "")
            if word and len(word) * _CHAR_WIDTH > area.bar_width * 1.4:  # narrow bars: a sign, the words in the tip
                word = NARROW_MARKS.get(mark or OVER_BUDGET, "")
            if word:  # best, tie, over budget: on the bar, where the eye looks
                y = area.y(max(speed, high or speed)) - 4
                fill = BEST_COLOR if mark else DOES_NOT_FIT_COLOR
                self.svg.text(area.center(index), y, word, size=10, anchor="middle", fill=fill, weight="700")
            self.svg.add("</g>")
        return area

    def memory(self, box: Box, axis: PlanAxis) -> Area:
        """The peak memory panel in ``box``: categories stacked per plan, "does not fit", errors, the budget."""
        scale = self.scale
        tops = memory_tops(self.columns, self.data)
        tallest = max([value for value in tops if value is not None], default=0.0) * scale
        if "oom" in self.data["status"] and not axis.numbered:
            tallest *= 1.12  # room above the tallest for the bound written over a bar that does not fit
        budget = None if self.data["budget_mib"] is None else self.data["budget_mib"] * scale
        drawn_budget = budget is not None and (tallest == 0 or budget <= _BUDGET_ABOVE * tallest)
        ticks = nice_ticks(max(tallest, budget if drawn_budget and budget is not None else 0.0))
        area = Area(*box, ticks[-1], axis)
        self._frame(area, ticks, "Peak memory by category", f"peak memory ({self.unit})")
        does_not_fit = self.columns[len(self.data["categories"])]["y"]
        for index in range(self.count):
            status = self.data["status"][index]
            if status == "ok":
                self._stack(area, index, scale, over=self.data["verdict"][index] == OVER_BUDGET)
            elif status == "oom" and does_not_fit[index] is not None:
                self._does_not_fit(area, index, does_not_fit[index] * scale, scale)
            elif status == "error":
                tip = f"{self.who(index)}\nerror: {self.data['error_text'][index]}"
                self.svg.add(f'<g class="plan" data-verdict="{ERROR}"><title>{escape(tip)}</title>')
                self.svg.cross(area.center(index), area.bottom - 7, min(5.0, area.bar_width / 2), BUDGET_COLOR)
                self.svg.add("</g>")
        if budget is not None:
            self._budget(area, budget, drawn_budget)
        return area

    def host(self, box: Box, axis: PlanAxis, host: dict[str, Any]) -> Area:
        """The host panel in ``box`` (:func:`memlab.report.views.host_figure.host_data`): each plan's host memory,
        hatched and written "does not fit (host)" where the host decided, and the host budget as a dotted line."""
        values: list[float | None] = host["host_mib"]
        unit, scale = _memory_unit(max([value for value in values if value is not None], default=0.0))
        tallest = max([value for value in values if value is not None], default=0.0) * scale
        budget = None if host["budget_mib"] is None else host["budget_mib"] * scale
        drawn = budget is not None and (tallest == 0 or budget <= _BUDGET_ABOVE * tallest)
        ticks = nice_ticks(max(tallest, budget if drawn and budget is not None else 0.0) * 1.08)
        area = Area(*box, ticks[-1], axis)
        self._frame(area, ticks, HOST_TITLE, f"host memory ({unit})")
        for index, value in enumerate(values):
            if value is None or value <= 0:
                continue
            over = host["over"][index]
            tip = f"{self.who(index)}\nhost memory {axis_number(value * scale)} {unit}"
            bar = self._bar(area, index, 0.0, value * scale, HOST_COLOR)
            if over:
                tip += f"\n{DOES_NOT_FIT_HOST}"
                bar += self._bar(area, index, 0.0, value * scale, f"url(#{self.hatch}-over)", stroke=DOES_NOT_FIT_COLOR)
                word = DOES_NOT_FIT_HOST if len(DOES_NOT_FIT_HOST) * _CHAR_WIDTH <= area.bar_width * 2.2 else "host"
                bar += (f'<text x="{px(area.center(index))}" y="{px(area.y(value * scale) - 4)}" font-size="10" '
                        f'text-anchor="middle" font-weight="700" fill="{BUDGET_COLOR}">{escape(word)}</text>')
            verdict = "host" if over else "fits"
            self.svg.add(f'<g class="plan host" data-verdict="{verdict}"><title>{escape(tip)}</title>{bar}</g>')
        if budget is not None:
            self._budget(area, budget, drawn, f"{HOST_BUDGET_NAME} {format_bytes(host['budget'])}", "2,3")
        return area

    def plan_ticks(self, area: Area) -> float:
        """The plan names (or numbers) under an area and the axis title; returns the bottom of the title."""
        axis = area.axis
        best = self.data["best"]
        for index in axis.shown:
            x, y = area.center(index), area.bottom + 6 + axis.font_size
            emphasis = ' font-weight="700"' if self.labels[index] == best else ""
            text = escape(axis.text[index])
            if axis.angle == 0:
                self.svg.add(
                    f'<text x="{px(x)}" y="{px(y)}" text-anchor="middle" font-size="{px(axis.font_size)}"'
                    f"{emphasis}>{text}</text>"
                )
            else:
                y = area.bottom + 8
                self.svg.add(
                    f'<text x="{px(x)}" y="{px(y)}" transform="rotate({axis.angle} {px(x)} {px(y)})" '
                    f'text-anchor="end" dominant-baseline="middle" font-size="{px(axis.font_size)}"{emphasis}>'
                    f"{text}</text>"
                )
        title_y = area.bottom + 8 + axis.extent_px() + 14
        title = "plan number (see the key below)" if axis.numbered else "plan"
        self.svg.text(area.left + area.width / 2, title_y, title, anchor="middle", fill=_MUTED)
        return title_y

    def who(self, index: int) -> str:
        """The first line of a bar's tooltip: its number (where the bars are numbered) and label; the key under the
        panels spells the plan out, so the tooltip does not repeat it (a figure of dozens stays small)."""
        number = f"#{index + 1} " if self.count > FULL_LABELS_UP_TO else ""
        return f"{number}{self.labels[index]}"

    def _words(self, index: int) -> str:
        """A bar's verdict as its tooltip says it (a record saved before the verdicts' words: its verdict's)."""
        words = self.data.get("verdict_words")
        return str(words[index]) if words else VERDICT_WORDS[self.data["verdict"][index]]

    # --- pieces ---

    def _stack(self, area: Area, index: int, scale: float, *, over: bool = False) -> None:
        parts = [(name, (values[index] or 0.0) * scale) for name, values in self.data["categories"].items()]
        total = sum(value for _, value in parts)
        spelled = ", ".join(f"{name} {axis_number(value)}" for name, value in parts if value > 0)
        verdict = self.data["verdict"][index]
        tip = f"{self.who(index)}\npeak {axis_number(total)} {self.unit}: {spelled}\n{self._words(index)}"
        bars = []
        base = 0.0
        for name, value in parts:
            if value > 0:
                bars.append(self._bar(area, index, base, base + value, CATEGORY_COLORS[name]))
                base += value
        if over:  # its colours say where the memory goes; the hatch over them, that it does not fit
            bars.append(self._bar(area, index, 0.0, base, f"url(#{self.hatch}-over)", stroke=DOES_NOT_FIT_COLOR))
        self.svg.add(f'<g class="plan" data-verdict="{verdict}"><title>{escape(tip)}</title>{"".join(bars)}</g>')

    def _does_not_fit(self, area: Area, index: int, height: float, scale: float) -> None:
        """A plan out of memory: its bar as high as what is known of its peak, a lower bound, and the bound written
        above it with an arrow up (how much more it needs is not known); on numbered bars, in its tip only."""
        reached = (self.data["does_not_fit"][index] or 0.0) * scale
        tip = f"{self.who(index)}\nneeds at least {axis_number(height)} {self.unit} (reached {axis_number(reached)})"
        bar = self._bar(area, index, 0.0, height, f"url(#{self.hatch})", stroke=DOES_NOT_FIT_COLOR)
        x, top = area.center(index), area.y(height)
        if not area.axis.numbered:
            bar += (f'<path class="bound" d="M{px(x)} {px(top - 2)}v-9m-4 4l4-4 4 4" stroke="{DOES_NOT_FIT_COLOR}" '
                    f'stroke-width="1.5" fill="none"/><text class="bound" x="{px(x)}" y="{px(top - 15)}" '
                    f'font-size="10" text-anchor="middle" fill="#444444">\u2265 {axis_number(height)}</text>')
        tip += f"\n{VERDICT_WORDS[OUT_OF_MEMORY]}"
        words = ""
        tall = area.bottom - area.y(height)
        if not area.axis.numbered and area.bar_width >= 14 and tall >= text_width("does not fit", 10) + 10:
            x, y = area.center(index), area.bottom - tall / 2
            words = (
                f'<text x="{px(x)}" y="{px(y)}" transform="rotate(-90 {px(x)} {px(y)})" text-anchor="middle" '
                'dominant-baseline="middle" font-size="10" font-weight="600" fill="#222">does not fit</text>'
            )
        self.svg.add(f'<g class="plan" data-verdict="{OUT_OF_MEMORY}"><title>{escape(tip)}</title>{bar}{words}</g>')

    def _budget(self, area: Area, budget: float, drawn: bool, text: str = "", dashes: str = "7,4") -> None:
        text = text or f"budget {format_bytes(self.report.budget or 0)}"
        if not drawn:
            self.svg.text(area.left + area.width - 4, area.top + 12, f"{text}: far above these bars", size=11,
                          anchor="end", fill=BUDGET_COLOR, weight="600")
            return
        y = area.y(budget)
        self.svg.line(area.left, y, area.left + area.width, y, BUDGET_COLOR,
                      f' stroke-width="2" stroke-dasharray="{dashes}"')
        width = text_width(text, 11) + 8
        right, label_y = self._label_place(area, y, width)
        self.svg.add(
            f'<rect x="{px(right - width)}" y="{px(label_y - 11)}" width="{px(width)}" height="15" '
            'fill="#FFFFFF" fill-opacity="0.9" rx="2"/>'
        )
        self.svg.text(right - 4, label_y, text, anchor="end", fill=BUDGET_COLOR, weight="600")

    def _label_place(self, area: Area, y: float, width: float) -> tuple[float, float]:
        """Where the budget's label goes (its right end, its baseline):
        :func:`~memlab.report.views.budget_mark.label_place`
        in pixels measured up from the area's bottom, the bound written above a bar that does not fit counted."""
        tops = [None if top is None else area.bottom - area.y(top * self.scale) + (26 if status == "oom" else 0)
                for top, status in zip(memory_tops(self.columns, self.data), self.data["status"], strict=True)]
        right, above = label_place(tops, [area.center(index) for index in range(len(tops))], area.bar_width / 2,
                                   area.bottom - y, LabelBox(width, height=15, above=1, below=3, step=8),
                                   left=area.left, right=area.left + area.width - 2, ceiling=area.height - 2)
        return right, y - 5 if above else y + 14

    def _frame(self, area: Area, ticks: Sequence[float], title: str, unit: str) -> None:
        """The area's title, horizontal grid with its values, its y-axis title and its base line."""
        self.svg.text(area.left, area.top - 12, title, size=13, weight="600")
        for value in ticks:
            y = area.y(value)
            self.svg.line(area.left, y, area.left + area.width, y, _GRID)
            self.svg.text(area.left - 6, y + 4, axis_number(value), anchor="end", fill=_MUTED, size=10)
        widest = max(text_width(axis_number(value), 10) for value in ticks)
        x, y = area.left - widest - 18, area.top + area.height / 2
        self.svg.add(
            f'<text x="{px(x)}" y="{px(y)}" transform="rotate(-90 {px(x)} {px(y)})" text-anchor="middle" '
            f'fill="{_MUTED}">{escape(unit)}</text>'
        )
        self.svg.line(area.left, area.bottom, area.left + area.width, area.bottom, _AXIS)

    def _bar(self, area: Area, index: int, low: float, high: float, fill: str, stroke: str | None = None) -> str:
        top, bottom = area.y(high), area.y(low)
        width = area.bar_width
        edge = f' stroke="{stroke}"' if stroke else ""
        return (
            f'<rect class="bar" x="{px(area.center(index) - width / 2)}" y="{px(top)}" width="{px(width)}" '
            f'height="{px(max(0.0, bottom - top))}" fill="{fill}"{edge}/>'
        )


def _memory_unit(tallest_mib: float) -> tuple[str, float]:
    """The unit the memory axis counts in, and what turns MiB into it: KiB under a MiB, GiB from 4 GiB."""
    if tallest_mib >= _GIB_FROM_MIB:
        return "GiB", 1 / 1024
    if 0 < tallest_mib < 1:
        return "KiB", 1024.0
    return "MiB", 1.0
