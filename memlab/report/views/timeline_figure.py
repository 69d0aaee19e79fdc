"""Drawing step timelines: plotly (``Timeline.plot``, ``Report.plot(kind="timeline")``) and the static SVG a notebook
keeps, from the same points.

Every timeline drawn together shares one time axis (events since its step began) and one memory scale, one row per
plan, so that a lever's effect is seen: checkpointing's saw-tooth beside the plain step's single climb, accumulation's
repeated climbs. Each row stacks the categories (the colours of the other figures), shades the phases (forward,
backward, optimizer; prefill, decode) and marks its peak with a line that names it (``"backward of
model.layers.17.mlp: activations of 17 layers held"``).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from memlab.errors import MemlabError
from memlab.plan import format_bytes
from memlab.report.timeline import Timeline
from memlab.report.views import register_views
from memlab.report.views.colors import CATEGORY_COLORS
from memlab.report.views.svg import Svg, axis_number, nice_ticks, px

if TYPE_CHECKING:
    from memlab.report.data import Report

__all__ = ["CATEGORY_COLORS", "PHASE_COLORS", "drawn_phases", "legend_rows", "phase_words", "report_timelines",
           "timeline_figure", "timeline_title", "timelines_svg"]


PHASE_COLORS = {
    "generation": "rgba(178,121,162,0.10)",
    "reference": "rgba(157,117,93,0.12)",
    "old-policy": "rgba(186,176,172,0.16)",
    "forward": "rgba(76,120,168,0.10)",
    "backward": "rgba(228,87,86,0.10)",
    "optimizer": "rgba(84,162,75,0.14)",
    "prefill": "rgba(76,120,168,0.10)",
    "decode": "rgba(178,121,162,0.10)",
}
"""The shade of each phase behind the series."""
_PEAK = "#2A2A2A"
_WIDTH = 900
_ROW = 170
_LEFT, _RIGHT, _TOP, _GAP = 70, 20, 62, 44
_LEGEND_FONT = 11.0  # the SVG's legend: its text's size (the document's default) and its line
_LEGEND_LINE = 16
# The plotly legend, as plotly.js lays it out at its default 12 px font (a little generously: a legend one pixel taller
# than the plot gets a scroll bar): an entry's line, the gap between two groups (tracegroupgap), and its padding; the
# figure's top and bottom margins.
_PLOTLY_ENTRY_PX, _PLOTLY_GROUP_GAP, _PLOTLY_LEGEND_PAD = 20, 12, 24
_PLOTLY_MARGINS = 70 + 80


def timeline_title(timeline: Timeline) -> str:
    """The line that names a timeline's peak: ``"peak 1.2 GiB: backward of model.layers.3: ..."``.

    Example:
        >>> from memlab.report.timeline import TimelinePeak
        >>> timeline_title(Timeline(("other",), [0], {"other": [0]}, [], TimelinePeak(2048, "forward", "fc", {}, {})))
        'peak 2.0 KiB: forward of fc'
    """
    prefix = f"{timeline.label}: " if timeline.label else ""
    return f"{prefix}peak {format_bytes(timeline.peak.bytes)}: {timeline.peak.description}"


def phase_words(phase: str) -> str:
    """A phase as a legend names it: ``"optimizer step"`` (the phase, not the optimizer state's colour).

    Example:
        >>> phase_words("optimizer"), phase_words("backward")
        ('optimizer step', 'backward')
    """
    return "optimizer step" if phase == "optimizer" else phase


def report_timelines(report: Report) -> Any:
    """Every plan's timeline of ``report`` on one time axis and one memory scale (a plotly figure).

    Example:
        >>> import memlab, torch
        >>> model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        >>> report = memlab.compare(model, torch.randn(4, 8), [memlab.Plan(), memlab.Plan(accumulation=2)],
        ...                         loss_fn=lambda m, b: m(b).mean(), steps=1, noise=0)
        >>> len(report.plot(kind="timeline").layout.annotations)
        2
    """
    return timeline_figure(named_timelines(report))


def named_timelines(report: Report) -> list[Timeline]:
    """The report's timelines, each labelled with its plan (a clear error where none has one).

    Example:
        >>> from memlab.report.data import Report
        >>> named_timelines(Report([]))
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: no trial of this report has a timeline (a failed warm-up, a sharded estimate or a \
report loaded from a dict has none); measure or estimate the plans again and plot that report
    """
    timelines = []
    for trial in report.trials:
        if trial.timeline is not None:
            timeline = trial.timeline
            timeline.label = trial.label
            timelines.append(timeline)
    if not timelines:
        raise MemlabError(
            "no trial of this report has a timeline (a failed warm-up, a sharded estimate or a report loaded from a "
            "dict has none); measure or estimate the plans again and plot that report"
        )
    return timelines


def drawn_phases(phases: Sequence[tuple[str, int, int]], last: int, columns: int = _WIDTH - _LEFT - _RIGHT
                 ) -> list[tuple[str, int, int]]:
    """The shades drawn for ``phases`` on an axis to ``last`` that is ``columns`` pixels wide: touching phases of one
    name as one shade, and where there are more phases than pixels (thousands of decode steps, hundreds of
    micro-batches), each pixel shaded by the phase at its middle, so that a figure stays small however many there are.

    Example:
        >>> drawn_phases([("decode", 0, 1), ("decode", 1, 2), ("optimizer", 2, 4)], last=4)
        [('decode', 0, 2), ('optimizer', 2, 4)]
        >>> phases = [("forward" if i % 2 == 0 else "backward", i, i + 1) for i in range(10_000)]
        >>> len(drawn_phases(phases, last=10_000, columns=100)) <= 100
        True
    """
    if len(phases) > columns and last > 0:
        starts = [start for _, start, _ in phases]
        sampled = []
        for column in range(columns):
            at = (column + 0.5) * last / columns
            index = bisect.bisect_right(starts, at) - 1
            if index >= 0 and phases[index][1] <= at < max(phases[index][2], phases[index][1] + 1):
                sampled.append((phases[index][0], round(column * last / columns), round((column + 1) * last / columns)))
        phases = sampled
    merged: list[tuple[str, int, int]] = []
    for name, start, end in phases:
        if merged and merged[-1][0] == name and merged[-1][2] >= start:
            merged[-1] = (name, merged[-1][1], max(end, merged[-1][2]))
        else:
            merged.append((name, start, end))
    return merged


def _points(rows: int) -> int:
    """How many points each of ``rows`` timelines drawn together keeps: fewer as there are more of them."""
    return max(120, min(400, 800 // max(rows, 1)))


def _svg_points(rows: int) -> int:
    """The same for the static SVG a notebook keeps: a point every 3 to 8 pixels of its 810 (each stretch's highest
    and lowest, the peak exactly), so that a run's record weighs about 10 kB."""
    return max(100, min(260, 520 // max(rows, 1)))


def _outline(points: list[tuple[str, str]]) -> str:
    """An area's upper edge as SVG points, without the inner points of its level stretches (what a flat category,
    the weights, mostly is): the same drawing in fewer bytes.

    Example:
        >>> _outline([("0", "5"), ("1", "5"), ("2", "5"), ("3", "4")])
        '0,5 2,5 3,4'
    """
    kept = [point for index, point in enumerate(points)
            if index in (0, len(points) - 1) or not points[index - 1][1] == point[1] == points[index + 1][1]]
    return " ".join(f"{x},{y}" for x, y in kept)


def _scale(timelines: Sequence[Timeline]) -> tuple[str, float, float, int]:
    top = max((max(t.totals, default=0) for t in timelines), default=0)
    top = max(top, *(t.peak.bytes for t in timelines))
    unit, divisor = ("GiB", 1024.0**3) if top >= 4 * 1024**3 else ("MiB", 1024.0**2)
    last = max((t.x[-1] if t.x else 0 for t in timelines), default=0)
    return unit, divisor, top / divisor, max(last, 1)


def timeline_figure(timelines: Sequence[Timeline]) -> Any:
    """A plotly figure of ``timelines``: one row each, one shared time axis, one memory scale.

    Example:
        >>> from memlab.report.timeline import TimelinePeak
        >>> t = Timeline(("other",), [0, 4], {"other": [0, 2]}, [("forward", 0, 4)], TimelinePeak(2, "forward", "",
        ...              {"other": 2}, {}, at=4))
        >>> [trace.name for trace in timeline_figure([t, t]).data]
        ['other', 'peak', 'other', 'peak', 'forward']
    """
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    unit, divisor, top, last = _scale(timelines)
    rows = len(timelines)
    timelines = [timeline.thinned(_points(rows)) for timeline in timelines]
    # One plan: its peak is the figure's title. Several: each row's title names its plan's peak. The legend stands
    # on the right, away from every title (above the plot it struck the first row's title through).
    figure = make_subplots(rows=rows, cols=1, shared_xaxes=True, vertical_spacing=min(0.3 / max(rows, 1), 0.08),
                           subplot_titles=[timeline_title(t) for t in timelines] if rows > 1 else None)
    for row, timeline in enumerate(timelines, start=1):
        for name in timeline.categories:
            values = timeline.series[name]
            if not any(values):
                continue
            figure.add_trace(go.Scatter(
                x=timeline.x, y=[round(v / divisor, 4) for v in values], name=name, stackgroup=f"row{row}",
                mode="lines",
                line={"width": 0.5, "color": CATEGORY_COLORS.get(name, "#B0B0B0")}, legendgroup=name,
                showlegend=row == 1, hovertemplate=f"{name}: %{{y:.3s}} {unit}<extra>event %{{x}}</extra>",
            ), row=row, col=1)
        for name, start, end in drawn_phases(timeline.phases, last):
            figure.add_vrect(x0=start, x1=max(end, start + 0.5), fillcolor=PHASE_COLORS.get(name, "rgba(0,0,0,0.05)"),
                             line_width=0, layer="below", row=row, col=1)
        peak = timeline.peak
        figure.add_trace(go.Scatter(
            x=[peak.at], y=[peak.bytes / divisor], name="peak", mode="markers", legendgroup="peak",
            showlegend=row == 1, marker={"symbol": "triangle-down", "size": 11, "color": _PEAK},
            hovertext=[f"{format_bytes(peak.bytes)}: {peak.description}"], hoverinfo="text",
        ), row=row, col=1)
        figure.update_yaxes(range=[0, top * 1.12], title_text=unit, row=row, col=1)
    # The phases' shades named in the legend, as the static figure's legend names them.
    shaded = {name for timeline in timelines for name, _, _ in timeline.phases}
    for number, name in enumerate(phase for phase in PHASE_COLORS if phase in shaded):
        figure.add_trace(go.Scatter(
            x=[None], y=[None], name=phase_words(name), mode="markers", legendgroup="phases",
            legendgrouptitle_text="phase" if number == 0 else None, hoverinfo="skip",
            marker={"symbol": "square", "size": 14, "color": PHASE_COLORS[name],
                    "line": {"width": 1, "color": "rgba(0,0,0,0.2)"}},
        ), row=1, col=1)
    figure.update_xaxes(range=[0, last], title_text="allocation events in the step", row=rows, col=1)
    # Tall enough for the whole legend beside the plot: a taller legend gets a scroll bar and hides its last entries
    # (a GRPO step's six phases under the five categories lost "optimizer step" at 460 px).
    categories = {trace.name for trace in figure.data if trace.showlegend is not False and trace.legendgroup != "phases"
                  and trace.legendgroup != "peak"}
    phases = sum(1 for trace in figure.data if trace.legendgroup == "phases")
    entries = len(categories) + 1 + (phases + 1 if phases else 0)  # the peak; the phases and their title
    groups = len(categories) + 1 + (1 if phases else 0)  # a group a category, so that a click hides it in every row
    legend_px = _PLOTLY_ENTRY_PX * entries + _PLOTLY_GROUP_GAP * (groups - 1) + _PLOTLY_LEGEND_PAD
    figure.update_layout(
        title={"text": timeline_title(timelines[0]) if rows == 1 else "memory over one step, per plan"},
        title_font_size=14, height=max(120 + 200 * rows, _PLOTLY_MARGINS + legend_px), template="plotly_white",
        legend={"tracegroupgap": _PLOTLY_GROUP_GAP, "traceorder": "grouped"},
        margin={"t": 70, "b": 80},
    )
    return figure


def legend_rows(entries: Sequence[str], *, left: float = _LEFT, right: float = _WIDTH - _RIGHT,
                font_size: float = _LEGEND_FONT) -> list[list[tuple[float, str]]]:
    """The static figure's legend laid out in rows within ``left`` to ``right``: each entry (a swatch and its words)
    at its x, a new row where the next would reach past ``right`` (the SVG cuts what runs past its width: a GRPO step's
    six phases after the five categories ran 120 px past it).

    Example:
        >>> [[words for _, words in row] for row in legend_rows(["params", "grads", "a long one"], right=200)]
        [['params', 'grads'], ['a long one']]
    """
    from memlab.report.views.plan_axis import text_width

    rows: list[list[tuple[float, str]]] = [[]]
    x = left
    for words in entries:
        width = 14 + text_width(words, font_size)
        if rows[-1] and x + width > right:
            rows.append([])
            x = left
        rows[-1].append((x, words))
        x += width + 12
    return rows


def timelines_svg(timelines: Sequence[Timeline]) -> str:
    """The static form of :func:`timeline_figure` (SVG, no plotly): what a saved notebook keeps.

    Example:
        >>> from memlab.report.timeline import TimelinePeak
        >>> t = Timeline(("other",), [0, 4], {"other": [0, 2]}, [("forward", 0, 4)], TimelinePeak(2, "forward", "",
        ...              {"other": 2}, {}, at=4))
        >>> svg = timelines_svg([t]); svg.startswith("<svg") and "forward of (outside modules)" in svg
        True
    """
    unit, divisor, top, last = _scale(timelines)
    timelines = [timeline.thinned(_svg_points(len(timelines))) for timeline in timelines]
    ticks = nice_ticks(top * 1.05)
    top = ticks[-1] or 1.0
    inner = _WIDTH - _LEFT - _RIGHT
    svg = Svg()
    svg.text(_LEFT, 22, "memory over one step" + (", per plan" if len(timelines) > 1 else ""), size=14, weight="bold")
    names = [name for name in timelines[0].categories if any(any(t.series.get(name, [])) for t in timelines)]
    shaded = {name for timeline in timelines for name, _, _ in timeline.phases}
    colours = {name: CATEGORY_COLORS.get(name, "#B0B0B0") for name in names}
    colours.update({phase_words(phase): PHASE_COLORS[phase] for phase in PHASE_COLORS if phase in shaded})
    legend = legend_rows(list(colours))
    for line, entries in enumerate(legend):
        for x, words in entries:
            baseline = 41 + _LEGEND_LINE * line
            svg.add(f'<rect x="{px(x)}" y="{px(baseline - 9)}" width="10" height="10" fill="{colours[words]}"/>')
            svg.text(x + 14, baseline, words)
    below = _TOP + _LEGEND_LINE * (len(legend) - 1)  # the rows start under the legend's last line
    for row, timeline in enumerate(timelines):
        bottom = below + row * (_ROW + _GAP) + _ROW + 18

        def at_x(value: float) -> float:
            return _LEFT + inner * value / last

        def at_y(value: float, bottom: float = bottom) -> float:
            return bottom - _ROW * (value / divisor) / top

        svg.text(_LEFT, bottom - _ROW - 6, timeline_title(timeline), size=12, weight="bold")
        for name, start, end in drawn_phases(timeline.phases, last):
            width = max(at_x(end) - at_x(start), 1)
            svg.add(f'<rect x="{px(at_x(start))}" y="{px(bottom - _ROW)}" width="{px(width)}" '
                    f'height="{_ROW}" fill="{PHASE_COLORS.get(name, "rgba(0,0,0,0.05)")}"/>')
        # Each category's area reaches down to the axis, drawn from the top of the stack down, so that each polygon
        # is one line of points and the ones below cover the rest.
        ceilings: list[tuple[str, list[int]]] = []
        floor = [0] * len(timeline.x)
        for name in timeline.categories:
            values = timeline.series[name]
            # A band never half a pixel tall would be drawn over its neighbour's edge: left out, a whole polygon less.
            if max(values, default=0) / divisor / top * _ROW >= 0.5:
                floor = [low + value for low, value in zip(floor, values, strict=True)]
                ceilings.append((name, floor))
        base = f"{px(at_x(timeline.x[-1]))},{px(bottom)} {px(at_x(timeline.x[0]))},{px(bottom)}"
        for name, ceiling in reversed(ceilings):
            upper = _outline([(px(at_x(t)), px(at_y(v))) for t, v in zip(timeline.x, ceiling, strict=True)])
            svg.add(f'<polygon points="{upper} {base}" fill="{CATEGORY_COLORS.get(name, "#B0B0B0")}"/>')
        for tick in ticks:
            y = bottom - _ROW * tick / top
            svg.line(_LEFT - 4, y, _LEFT, y, "#888888")
            svg.text(_LEFT - 7, y + 4, axis_number(tick), anchor="end", size=10)
        svg.line(_LEFT, bottom, _LEFT + inner, bottom, "#888888")
        svg.line(_LEFT, bottom, _LEFT, bottom - _ROW, "#888888")
        svg.text(14, bottom - _ROW / 2, unit, size=10)
        peak = timeline.peak
        px_, py_ = at_x(peak.at), at_y(peak.bytes)
        svg.add(f'<path d="M{px(px_ - 6)} {px(py_ - 10)}h12l-6 9z" fill="{_PEAK}"/>')
        svg.line(px_, py_, px_, bottom, _PEAK, ' stroke-width="1" stroke-dasharray="3 3"')
    height = below + len(timelines) * (_ROW + _GAP) + 20
    svg.text(_LEFT + inner, height - 8, "allocation events in the step", anchor="end", size=10)
    title = "; ".join(timeline_title(t) for t in timelines)
    return svg.document(_WIDTH, height, title, defs="")


register_views(report_timelines=report_timelines, timeline_figure=timeline_figure, timelines_svg=timelines_svg)
