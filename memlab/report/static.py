"""A static SVG of a Report's figure, and the record of a run that a notebook keeps (:func:`record_bundle`).

Why by hand: plotly's own static export (``Figure.write_image``) needs kaleido and a Chrome, which users, Binder and
CI mostly lack, and a notebook's output must render with no kernel at all: after a reload, in nbconvert's HTML, on
GitHub. Bars need only rectangles, lines and text, so this module writes them itself, from the same plain data the
plotly figure draws (:func:`memlab.report.figure.figure_data` and :func:`~memlab.report.figure.figure_columns`), in
the same colours, naming the bars the same way (:func:`~memlab.report.figure.plan_axis`).

The layout: throughput (with the 95% interval of each speed as an error bar) and peak memory by category, side by
side up to :data:`~memlab.report.figure.FULL_LABELS_UP_TO` plans, one above the other across the whole width beyond
that (so that every numbered bar has room for its number); a legend in three groups (memory, speed, status); the
budget as a dashed line labelled at its right end; and a key under the panels that spells every plan out
(:meth:`memlab.Plan.describe`). Sizes are pixels of a figure :data:`WIDTH` wide that shrinks with a narrower cell;
text widths are estimated (:func:`~memlab.report.figure.text_width`), not measured.
"""

from __future__ import annotations

import hashlib
import html
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from memlab.plan import format_bytes
from memlab.report.data import Report
from memlab.report.figure import (
    BEST_COLOR,
    BUDGET_COLOR,
    CATEGORY_COLORS,
    DOES_NOT_FIT_COLOR,
    FULL_LABELS_UP_TO,
    INTERVAL_COLOR,
    RATE_COLOR,
    PlanAxis,
    figure_columns,
    figure_data,
    plan_axis,
    report_figure,
    text_width,
)
from memlab.report.format import format_rate

__all__ = ["INTERACTIVE_LIMIT", "PLOTLY_MIME", "WIDTH", "record_bundle", "record_text", "report_svg"]

WIDTH = 960
"""The width of the SVG in pixels; a narrower cell shrinks it (``max-width: 100%``)."""
PLOTLY_MIME = "application/vnd.plotly.v1+json"
"""The mime type of a plotly figure's JSON, which JupyterLab's plotly renderer draws interactive."""
INTERACTIVE_LIMIT = 64_000
"""The most characters of plotly JSON a record holds; a larger figure (a search of a hundred plans) keeps only its SVG,
so that no record weighs more than about 150 kB in the notebook."""

_FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif"
_TEXT = "#2A2A2A"
_MUTED = "#666666"
_GRID = "#E6E6E6"
_AXIS = "#9A9A9A"
_LEFT, _RIGHT = 70.0, 24.0  # the panels' margins: the left one holds their values and the axis title
_EDGE = 20.0  # where the title, the legend and the key start
_GAP = 78.0  # between side-by-side panels: the memory panel's tick labels and axis title
_SIDE_HEIGHT = 250.0
_STACKED_HEIGHTS = (170.0, 230.0)
_BAR_FILL = 0.75  # of a bar's slot
_MAX_BAR = 64.0
_KEY_LINE = 16.0
_KEY_FONT = 11.0
_KEY_INDENT = 14.0
_BUDGET_ABOVE = 4.0  # a budget more than this many times the tallest bar is written, not drawn to scale
_GIB_FROM_MIB = 4096.0


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
    data = figure_data(report)
    return _Drawing(report, data).svg()


def record_bundle(report: Report, *, interactive: bool = True) -> dict[str, Any]:
    """The mime bundle a notebook keeps of a run: the figure as SVG (``image/svg+xml``), a one-line ``text/plain``,
    and, with ``interactive``, the plotly figure's JSON (:data:`PLOTLY_MIME`: data and layout only, no plotly.js;
    left out where it would exceed :data:`INTERACTIVE_LIMIT`).

    Every front end picks what it can show: JupyterLab with plotly's renderer the interactive figure, nbconvert's
    HTML, GitHub and any viewer without plotly the SVG, a terminal the text. Nothing in it needs a kernel or a
    widget, so it survives a save and a reload. The magic replaces its live figure with it when a run ends.

    Example:
        >>> from memlab.plan import Plan
        >>> from memlab.report.data import Trial
        >>> report = Report([Trial(Plan(), "ok", 2**20, {"params": 2**20}, 0.5, 8.0, None, "cpu")])
        >>> bundle = record_bundle(report)
        >>> sorted(bundle)
        ['application/vnd.plotly.v1+json', 'image/svg+xml', 'text/plain']
        >>> bundle["text/plain"]
        'memlab: 1 plan; best plain, 8.00 samples/s, peak 1.0 MiB'
        >>> bundle["image/svg+xml"] == report_svg(report)
        True
    """
    bundle: dict[str, Any] = {"text/plain": record_text(report), "image/svg+xml": report_svg(report)}
    if interactive:
        figure = _plotly_json(report)
        if len(json.dumps(figure, separators=(",", ":"))) <= INTERACTIVE_LIMIT:
            bundle[PLOTLY_MIME] = figure
    return bundle


def record_text(report: Report) -> str:
    """One line that sums the figure up, for front ends that show only text.

    Example:
        >>> record_text(Report([], budget=2**30))
        'memlab: no plan measured; budget 1.00 GiB'
    """
    count = len(report.trials)
    parts = [f"memlab: {count} plan{'s' if count != 1 else ''}" if count else "memlab: no plan measured"]
    best = report.best
    if best is not None:
        speed = "" if best.samples_per_s is None else f", {format_rate(best.samples_per_s)} samples/s"
        parts.append(f"best {best.label}{speed}, peak {format_bytes(best.peak_bytes)}")
    elif count:
        parts.append("no plan fits")
    if report.budget is not None:
        parts.append(f"budget {format_bytes(report.budget)}")
    return "; ".join(parts)


def _plotly_json(report: Report) -> dict[str, Any]:
    """The plotly figure as JSON without its template's per-trace defaults (most of its bytes, unused by bars)."""
    figure = json.loads(report_figure(report).to_json())
    template = figure.get("layout", {}).get("template")
    if isinstance(template, dict):
        template.pop("data", None)
    return {"data": _rounded(figure["data"]), "layout": figure["layout"]}


def _rounded(value: Any) -> Any:
    """``value`` with every float to six significant digits (what a hover shows, in fewer bytes)."""
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, list):
        return [_rounded(item) for item in value]
    if isinstance(value, dict):
        return {key: _rounded(item) for key, item in value.items()}
    return value


# --- drawing -------------------------------------------------------------------------------------------------------


class _Box(NamedTuple):
    """A rectangle in pixels."""

    left: float
    top: float
    width: float
    height: float


@dataclass(frozen=True)
class _Panel:
    """A plotting area: its box in pixels, the value at its top edge, and its bars' axis."""

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
        return self.bottom - max(0.0, min(value, self.top_value)) / self.top_value * self.height

    def center(self, index: int) -> float:
        return self.left + (index + 0.5) * self.width / max(1, len(self.axis.text))

    @property
    def bar_width(self) -> float:
        return min(_MAX_BAR, _BAR_FILL * self.width / max(1, len(self.axis.text)))


class _Drawing:
    """One SVG being written: elements in drawing order, then the root element around them."""

    def __init__(self, report: Report, data: dict[str, Any]) -> None:
        self.report = report
        self.data = data
        self.columns = figure_columns(report, data)
        self.labels: list[str] = data["labels"]
        self.count = len(self.labels)
        self.elements: list[str] = []
        digest = hashlib.sha1(repr((data, report.budget)).encode()).hexdigest()[:10]
        self.hatch = f"memlab-hatch-{digest}"  # unique per figure: a page may inline many of them
        mib = [value for value in self._memory_tops() if value is not None]
        self.unit, self.scale = _memory_unit(max(mib, default=0.0))

    # --- the whole figure ---

    def svg(self) -> str:
        title = "memlab: memory and speed per plan" + (f" (best: {self.data['best']})" if self.data["best"] else "")
        self._text(_EDGE, 30, title, size=17, weight="600")
        y = self._legend(54.0)
        if self.count == 0:
            self._text(WIDTH / 2, y + 60, "No plan measured yet.", size=14, anchor="middle", fill=_MUTED)
            return self._root(y + 100, title)
        inner = WIDTH - _LEFT - _RIGHT
        if self.count <= FULL_LABELS_UP_TO:
            top = y + 40
            speed_width = (inner - _GAP) * 0.5
            axis = plan_axis(self.labels, speed_width)  # the panels are as wide: the same names under both
            speed = self._speed_panel(_Box(_LEFT, top, speed_width, _SIDE_HEIGHT), axis)
            memory_box = _Box(_LEFT + speed_width + _GAP, top, inner - _GAP - speed_width, _SIDE_HEIGHT)
            memory = self._memory_panel(memory_box, axis)
            bottom = max(self._plan_ticks(speed), self._plan_ticks(memory))
        else:
            axis = plan_axis(self.labels, inner)
            speed = self._speed_panel(_Box(_LEFT, y + 40, inner, _STACKED_HEIGHTS[0]), axis)
            below = self._plan_ticks(speed)
            memory = self._memory_panel(_Box(_LEFT, below + 44, inner, _STACKED_HEIGHTS[1]), axis)
            bottom = self._plan_ticks(memory)
        height = self._key(bottom + 34)
        return self._root(height, title)

    def _root(self, height: float, title: str) -> str:
        height = math.ceil(height)
        hatch = (
            f'<pattern id="{self.hatch}" patternUnits="userSpaceOnUse" width="6" height="6" '
            'patternTransform="rotate(45)">'
            '<rect width="6" height="6" fill="#D9D9D9"/>'
            f'<line x1="0" y1="0" x2="0" y2="6" stroke="{DOES_NOT_FIT_COLOR}" stroke-width="2.5"/></pattern>'
        )
        head = (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
            f'viewBox="0 0 {WIDTH} {height}" style="max-width:100%;height:auto" font-family="{html.escape(_FONT)}" '
            f'font-size="11" fill="{_TEXT}" role="img" aria-label="{_escape(title)}">'
            f"<title>{_escape(title)}</title><defs>{hatch}</defs>"
            f'<rect width="{WIDTH}" height="{height}" fill="#FFFFFF"/>'
        )
        return head + "\n".join(self.elements) + "\n</svg>\n"

    # --- legend ---

    def _legend(self, top: float) -> float:
        """The three groups of legend entries, wrapped over as many rows as they need; returns the bottom."""
        speed = [("samples/s", f"swatch:{RATE_COLOR}"), ("best", f"swatch:{BEST_COLOR}"), ("95% interval", "interval")]
        groups: list[tuple[str, list[tuple[str, str]]]] = [
            ("memory", [(name, f"swatch:{CATEGORY_COLORS[name]}") for name in self.data["categories"]]),
            ("speed", speed),
            ("status", [("does not fit", "hatch"), ("error", "cross")]),
        ]
        if self.data["budget_mib"] is not None:
            groups[-1][1].append(("budget", "budget"))
        x, y = _EDGE, top
        for name, entries in groups:
            width = _bold_width(name, 11) + 8 + sum(text_width(label, 11) + 30 for label, _ in entries)
            if x + width > WIDTH - _RIGHT and x > _EDGE:
                x, y = _EDGE, y + 22
            self._text(x, y + 4, name, weight="700", fill=_MUTED)
            x += _bold_width(name, 11) + 8
            for label, mark in entries:
                self._legend_mark(x, y, mark)
                self._text(x + 19, y + 4, label)
                x += text_width(label, 11) + 30
            x += 16
        return y + 12

    def _legend_mark(self, x: float, y: float, mark: str) -> None:
        if mark.startswith("swatch:"):
            self._add(f'<rect x="{_f(x)}" y="{_f(y - 6)}" width="14" height="12" fill="{mark[7:]}"/>')
        elif mark == "hatch":
            self._add(
                f'<rect x="{_f(x)}" y="{_f(y - 6)}" width="14" height="12" fill="url(#{self.hatch})" '
                f'stroke="{DOES_NOT_FIT_COLOR}"/>'
            )
        elif mark == "cross":
            self._cross(x + 7, y, 5)
        elif mark == "interval":
            self._interval_bar(x + 7, y - 6, y + 6, 4)
        else:  # budget
            self._add(
                f'<line x1="{_f(x)}" y1="{_f(y)}" x2="{_f(x + 16)}" y2="{_f(y)}" stroke="{BUDGET_COLOR}" '
                'stroke-width="2" stroke-dasharray="5,3"/>'
            )

    # --- panels ---

    def _speed_panel(self, box: _Box, axis: PlanAxis) -> _Panel:
        speeds: list[float | None] = self.data["samples_per_s"]
        highs: list[float | None] = self.data["speed_high"]
        tallest = max([value for value in (*speeds, *highs) if value is not None], default=0.0)
        ticks = _nice_ticks(tallest * 1.08)  # room above the tallest for the word "best"
        panel = _Panel(*box, ticks[-1], axis)
        self._frame(panel, ticks, "Throughput", "samples/s")
        for index, speed in enumerate(speeds):
            if speed is None:
                continue
            colour = self.columns[-1]["marker.color"][index]
            low, high = self.data["speed_low"][index], self.data["speed_high"][index]
            tip = f"{self._who(index)}\n{format_rate(speed)} samples/s"
            if low is not None and high is not None:
                tip += f" (95% interval {format_rate(low)} to {format_rate(high)})"
            self._add(f"<g><title>{_escape(tip)}</title>{self._bar(panel, index, 0.0, speed, colour)}")
            if low is not None and high is not None:
                self._interval_bar(panel.center(index), panel.y(high), panel.y(low), min(5.0, panel.bar_width / 3))
            if self.labels[index] == self.data["best"]:
                y = panel.y(max(speed, high or speed)) - 4
                self._text(panel.center(index), y, "best", size=10, anchor="middle", fill=BEST_COLOR, weight="700")
            self._add("</g>")
        return panel

    def _memory_panel(self, box: _Box, axis: PlanAxis) -> _Panel:
        scale = self.scale
        tallest = max([value for value in self._memory_tops() if value is not None], default=0.0) * scale
        budget = None if self.data["budget_mib"] is None else self.data["budget_mib"] * scale
        drawn_budget = budget is not None and (tallest == 0 or budget <= _BUDGET_ABOVE * tallest)
        ticks = _nice_ticks(max(tallest, budget if drawn_budget and budget is not None else 0.0))
        panel = _Panel(*box, ticks[-1], axis)
        self._frame(panel, ticks, "Peak memory by category", f"peak memory ({self.unit})")
        does_not_fit = self.columns[len(self.data["categories"])]["y"]
        for index in range(self.count):
            status = self.data["status"][index]
            if status == "ok":
                self._stack(panel, index, scale)
            elif status == "oom" and does_not_fit[index] is not None:
                self._does_not_fit(panel, index, does_not_fit[index] * scale, scale)
            elif status == "error":
                tip = f"{self._who(index)}\nerror: {self.data['error_text'][index]}"
                self._add(f"<g><title>{_escape(tip)}</title>")
                self._cross(panel.center(index), panel.bottom - 7, min(5.0, panel.bar_width / 2))
                self._add("</g>")
        if budget is not None:
            self._budget(panel, budget, drawn_budget)
        return panel

    def _memory_tops(self) -> list[float | None]:
        """Each plan's tallest memory bar in MiB: its peak, or its "does not fit" bar."""
        heights = self.columns[len(self.data["categories"])]["y"]
        return [
            height if height is not None else peak
            for height, peak in zip(heights, self.data["peak_mib"], strict=True)
        ]

    def _stack(self, panel: _Panel, index: int, scale: float) -> None:
        parts = [(name, (values[index] or 0.0) * scale) for name, values in self.data["categories"].items()]
        total = sum(value for _, value in parts)
        spelled = ", ".join(f"{name} {_number(value)}" for name, value in parts if value > 0)
        tip = f"{self._who(index)}\npeak {_number(total)} {self.unit}: {spelled}"
        bars = []
        base = 0.0
        for name, value in parts:
            if value > 0:
                bars.append(self._bar(panel, index, base, base + value, CATEGORY_COLORS[name]))
                base += value
        self._add(f"<g><title>{_escape(tip)}</title>{''.join(bars)}</g>")

    def _does_not_fit(self, panel: _Panel, index: int, height: float, scale: float) -> None:
        reached = (self.data["does_not_fit"][index] or 0.0) * scale
        tip = f"{self._who(index)}\ndoes not fit: out of memory (reached {_number(reached)} {self.unit})"
        bar = self._bar(panel, index, 0.0, height, f"url(#{self.hatch})", stroke=DOES_NOT_FIT_COLOR)
        words = ""
        tall = panel.bottom - panel.y(height)
        if not panel.axis.numbered and panel.bar_width >= 14 and tall >= text_width("does not fit", 10) + 10:
            x, y = panel.center(index), panel.bottom - tall / 2
            words = (
                f'<text x="{_f(x)}" y="{_f(y)}" transform="rotate(-90 {_f(x)} {_f(y)})" text-anchor="middle" '
                'dominant-baseline="middle" font-size="10" font-weight="600" fill="#222">does not fit</text>'
            )
        self._add(f"<g><title>{_escape(tip)}</title>{bar}{words}</g>")

    def _budget(self, panel: _Panel, budget: float, drawn: bool) -> None:
        text = f"budget {format_bytes(self.report.budget or 0)}"
        if not drawn:
            self._text(panel.left + panel.width - 4, panel.top + 12, f"{text}: far above these bars", size=11,
                       anchor="end", fill=BUDGET_COLOR, weight="600")
            return
        y = panel.y(budget)
        self._add(
            f'<line x1="{_f(panel.left)}" y1="{_f(y)}" x2="{_f(panel.left + panel.width)}" y2="{_f(y)}" '
            f'stroke="{BUDGET_COLOR}" stroke-width="2" stroke-dasharray="7,4"/>'
        )
        width = text_width(text, 11) + 8
        label_y = y - 5 if y - 18 >= panel.top else y + 14  # below the line where it is at the very top
        right = panel.left + panel.width - 2
        self._add(
            f'<rect x="{_f(right - width)}" y="{_f(label_y - 11)}" width="{_f(width)}" height="15" '
            'fill="#FFFFFF" fill-opacity="0.9" rx="2"/>'
        )
        self._text(right - 4, label_y, text, anchor="end", fill=BUDGET_COLOR, weight="600")

    def _frame(self, panel: _Panel, ticks: Sequence[float], title: str, unit: str) -> None:
        """The panel's title, horizontal grid with its values, its y-axis title and its base line."""
        self._text(panel.left, panel.top - 12, title, size=13, weight="600")
        for value in ticks:
            y = panel.y(value)
            self._add(
                f'<line x1="{_f(panel.left)}" y1="{_f(y)}" x2="{_f(panel.left + panel.width)}" y2="{_f(y)}" '
                f'stroke="{_GRID}"/>'
            )
            self._text(panel.left - 6, y + 4, _number(value), anchor="end", fill=_MUTED, size=10)
        widest = max(text_width(_number(value), 10) for value in ticks)
        x, y = panel.left - widest - 18, panel.top + panel.height / 2
        self._add(
            f'<text x="{_f(x)}" y="{_f(y)}" transform="rotate(-90 {_f(x)} {_f(y)})" text-anchor="middle" '
            f'fill="{_MUTED}">{_escape(unit)}</text>'
        )
        self._add(
            f'<line x1="{_f(panel.left)}" y1="{_f(panel.bottom)}" x2="{_f(panel.left + panel.width)}" '
            f'y2="{_f(panel.bottom)}" stroke="{_AXIS}"/>'
        )

    def _plan_ticks(self, panel: _Panel) -> float:
        """The plan names (or numbers) under a panel and the axis title; returns the bottom of the title."""
        axis = panel.axis
        best = self.data["best"]
        for index in axis.shown:
            x, y = panel.center(index), panel.bottom + 6 + axis.font_size
            emphasis = ' font-weight="700"' if self.labels[index] == best else ""
            text = _escape(axis.text[index])
            if axis.angle == 0:
                self._add(
                    f'<text x="{_f(x)}" y="{_f(y)}" text-anchor="middle" font-size="{_f(axis.font_size)}"'
                    f"{emphasis}>{text}</text>"
                )
            else:
                y = panel.bottom + 8
                self._add(
                    f'<text x="{_f(x)}" y="{_f(y)}" transform="rotate({axis.angle} {_f(x)} {_f(y)})" '
                    f'text-anchor="end" dominant-baseline="middle" font-size="{_f(axis.font_size)}"{emphasis}>'
                    f"{text}</text>"
                )
        title_y = panel.bottom + 8 + axis.extent_px() + 14
        title = "plan number (see the key below)" if axis.numbered else "plan"
        self._text(panel.left + panel.width / 2, title_y, title, anchor="middle", fill=_MUTED)
        return title_y

    # --- the key ---

    def _key(self, top: float) -> float:
        """Every plan spelled out, in columns (down first), long lines wrapped; returns the figure's bottom."""
        entries = [self._key_entry(index) for index in range(self.count)]
        inner = WIDTH - 2 * _EDGE
        widest = max(_bold_width(head, _KEY_FONT) + _prose_width(words) + 30 for head, words, _ in entries)
        columns = 1 if self.count <= 6 else 3 if widest + 16 <= inner / 3 else 2
        column_width = inner / columns
        per_column = math.ceil(self.count / columns)
        self._text(_EDGE, top, "Plans", size=13, weight="600")
        bottom = top
        numbered = self.count > FULL_LABELS_UP_TO
        number_width = text_width(str(self.count), _KEY_FONT) + 8 if numbered else 0.0
        for column in range(columns):
            x = _EDGE + column * column_width
            y = top + 4
            for index in range(column * per_column, min(self.count, (column + 1) * per_column)):
                head, words, weight = entries[index]
                room = column_width - 16 - number_width
                lines = _wrap(words, room - _bold_width(head, _KEY_FONT), room - _KEY_INDENT)
                y += _KEY_LINE
                if numbered:
                    self._text(x + number_width - 8, y, str(index + 1), size=_KEY_FONT, anchor="end", fill=_MUTED)
                self._add(
                    f'<text x="{_f(x + number_width)}" y="{_f(y)}" font-size="{_f(_KEY_FONT)}">'
                    f'<tspan font-weight="{weight}">{_escape(head)}</tspan>{_escape(lines[0])}</text>'
                )
                for line in lines[1:]:
                    y += _KEY_LINE - 3
                    self._text(x + number_width + _KEY_INDENT, y, line, size=_KEY_FONT)
            bottom = max(bottom, y)
        return bottom + 18

    def _key_entry(self, index: int) -> tuple[str, str, str]:
        """(the bar's name and label, its description and state, the name's font weight) of plan ``index``."""
        label = self.labels[index]
        head = f"{label}: "
        words = self.data["describe"][index]
        if words.startswith(f"{self.report.trials[index].label}: "):  # "plain: every lever off" says its name itself
            words = words.split(": ", 1)[1]
        state = {"oom": " (does not fit)", "error": " (failed)"}.get(self.data["status"][index], "")
        if label == self.data["best"]:
            state += " (best)"
        elif self.data["status"][index] == "ok" and not self.data["fits"][index]:
            state += " (over the budget)"
        return head, words + state, "700" if label == self.data["best"] else "600"

    # --- pieces ---

    def _who(self, index: int) -> str:
        """The first line of a bar's tooltip: its number (where the bars are numbered) and label; the key under the
        panels spells the plan out, so the tooltip does not repeat it (a figure of dozens stays small)."""
        number = f"#{index + 1} " if self.count > FULL_LABELS_UP_TO else ""
        return f"{number}{self.labels[index]}"

    def _bar(self, panel: _Panel, index: int, low: float, high: float, fill: str, stroke: str | None = None) -> str:
        top, bottom = panel.y(high), panel.y(low)
        width = panel.bar_width
        edge = f' stroke="{stroke}"' if stroke else ""
        return (
            f'<rect class="bar" x="{_f(panel.center(index) - width / 2)}" y="{_f(top)}" width="{_f(width)}" '
            f'height="{_f(max(0.0, bottom - top))}" fill="{fill}"{edge}/>'
        )

    def _interval_bar(self, x: float, top: float, bottom: float, cap: float) -> None:
        self._add(
            f'<path d="M{_f(x - cap)} {_f(top)}h{_f(2 * cap)}M{_f(x)} {_f(top)}V{_f(bottom)}'
            f'M{_f(x - cap)} {_f(bottom)}h{_f(2 * cap)}" stroke="{INTERVAL_COLOR}" stroke-width="1.5" fill="none"/>'
        )

    def _cross(self, x: float, y: float, size: float) -> None:
        self._add(
            f'<path d="M{_f(x - size)} {_f(y - size)}L{_f(x + size)} {_f(y + size)}M{_f(x - size)} {_f(y + size)}'
            f'L{_f(x + size)} {_f(y - size)}" stroke="{BUDGET_COLOR}" stroke-width="2.5"/>'
        )

    def _text(
        self,
        x: float,
        y: float,
        text: str,
        *,
        size: float | None = None,
        anchor: str | None = None,
        fill: str | None = None,
        weight: str | None = None,
    ) -> None:
        attributes = "".join(
            f' {name}="{value}"'
            for name, value in (
                ("font-size", None if size is None else _f(size)),
                ("text-anchor", anchor),
                ("fill", fill),
                ("font-weight", weight),
            )
            if value is not None
        )
        self._add(f'<text x="{_f(x)}" y="{_f(y)}"{attributes}>{_escape(text)}</text>')

    def _add(self, element: str) -> None:
        self.elements.append(element)


def _memory_unit(tallest_mib: float) -> tuple[str, float]:
    """The unit the memory axis counts in, and what turns MiB into it: KiB under a MiB, GiB from 4 GiB."""
    if tallest_mib >= _GIB_FROM_MIB:
        return "GiB", 1 / 1024
    if 0 < tallest_mib < 1:
        return "KiB", 1024.0
    return "MiB", 1.0


def _nice_ticks(tallest: float, count: int = 5) -> list[float]:
    """Round values from 0 to at least ``tallest``, about ``count`` steps of 1, 2, 2.5 or 5 times a power of ten."""
    if not tallest > 0:
        tallest = 1.0
    raw = tallest / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(factor * power for factor in (1, 2, 2.5, 5, 10) if factor * power >= raw)
    steps = math.ceil(tallest / step - 1e-9)
    return [round(step * number, 10) for number in range(steps + 1)]


def _number(value: float) -> str:
    """A value for an axis or a tooltip: whole numbers with thousands separated, others to three digits."""
    if value == int(value) and abs(value) < 1e9:
        return f"{int(value):,}"
    return f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"


def _wrap(text: str, first: float, rest: float) -> list[str]:
    """``text`` (in the key's font) in lines broken between words: the first at most ``first`` pixels wide, the
    others ``rest``."""
    lines: list[str] = []
    line = ""
    for word in text.split(" "):
        room = first if not lines else rest
        candidate = f"{line} {word}" if line else word
        if line and _prose_width(candidate) > room:
            lines.append(line)
            line = word
        else:
            line = candidate
    lines.append(line)
    return lines


def _bold_width(text: str, size: float) -> float:
    """:func:`text_width` for bold text, which runs wider."""
    return 1.2 * text_width(text, size)


def _prose_width(text: str) -> float:
    """The width of a line of the key: prose, whose spaces and narrow letters make it about 10% narrower than
    :func:`text_width`'s estimate (0.54 font sizes a character in DejaVu Sans, the widest common default)."""
    return 0.9 * text_width(text, _KEY_FONT)


def _escape(text: str) -> str:
    return html.escape(text, quote=True)


def _f(value: float) -> str:
    """A coordinate to a tenth of a pixel, without trailing zeros (small files)."""
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text
