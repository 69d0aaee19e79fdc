"""Figures: throughput and peak memory by category per plan (plotly), shared by Report.plot and the live figure.

The same plain data (:func:`figure_data`, :func:`figure_columns`) and the same plan axis
(:func:`memlab.report.views.plan_axis.plan_axis`) also draw the static SVG of :mod:`memlab.report.views.static`, so the
figure a notebook keeps is the figure it showed.

Readable from one plan to dozens: up to :data:`~memlab.report.views.plan_axis.FULL_LABELS_UP_TO` plans the bars are
named
by their labels (turned when they would touch); beyond that by their numbers, with the label and the plan spelled out
(:meth:`memlab.Plan.describe`) in the hover. plotly is imported inside the functions that draw, never when memlab is
imported.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from memlab.measure.tracker import CATEGORIES
from memlab.report.data import Report, Trial
from memlab.report.format import one_line
from memlab.report.noise import runs_speed_interval
from memlab.report.views import register_views
from memlab.report.views.budget_mark import budget_line as budget_line  # re-exported: the figures import them here
from memlab.report.views.budget_mark import budget_note as budget_note
from memlab.report.views.budget_mark import memory_tops
from memlab.report.views.colors import BUDGET_COLOR as BUDGET_COLOR
from memlab.report.views.colors import CATEGORY_COLORS as CATEGORY_COLORS
from memlab.report.views.colors import HATCH as HATCH
from memlab.report.views.host_figure import HOST_TITLE, add_host_panel, host_data
from memlab.report.views.plan_axis import (
    FULL_LABELS_UP_TO,
    PLOTLY_PANEL_PX,
    figure_height,
    plan_axis,
    plan_axis_layout,
    run_labels,
)
from memlab.report.views.svg import axis_number
from memlab.report.views.verdicts import (
    FITS,
    OVER_BUDGET,
    bar_marks,
    best_caption,
    best_marks,
    staggered_marks,
    verdict_words,
    verdicts,
)
from memlab.techniques.precision import BF16_ON_CPU, BF16_ON_CPU_SHORT

__all__ = ["BEST_COLOR", "BUDGET_COLOR", "CATEGORY_COLORS", "DOES_NOT_FIT_COLOR", "HATCH", "TIE_COLOR",
    "FIGURE_TITLES", "INTERVAL_COLOR", "MARK_FONT_PX", "MARKS_NAME", "MIN_TEXT_PX", "MEMORY_COLUMN",
    "OUT_OF_MEMORY_NAME", "OVER_BUDGET_NAME", "RATE_COLOR", "THROUGHPUT_COLUMN", "budget_line",
    "budget_note", "comparison_figure", "comparison_traces", "finite", "empty_trace", "figure_columns", "figure_data",
    "report_figure", "speed_range"]

_MIB = 1024**2
OUT_OF_MEMORY_NAME = "out of memory"
"""The name (and legend entry) of the grey hatched bar of a plan that ran out of memory."""
MARKS_NAME = "marks"
"""The name of the text trace that writes best, tie and over budget above the throughput bars."""
OVER_BUDGET_NAME = "over budget"
"""The name (and legend entry) of the hatch drawn over the bars of a plan that ran over the budget."""
DOES_NOT_FIT_COLOR = "#7F7F7F"
BEST_COLOR = "#2CA02C"
TIE_COLOR = "#98DF8A"
"""The colour of a samples/s bar as fast as the best within noise (a tie, :attr:`memlab.Report.ties`)."""
RATE_COLOR = "#72B7B2"
INTERVAL_COLOR = "#3B3B3B"
"""The colour of the error bars: where the median samples/s lies, 95% (:func:`memlab.report.noise.speed_interval`)."""

_ERROR_CAP_PX = 4
_SPEED_HEADROOM = 1.2
MARK_FONT_PX = 12
"""The size of the words and signs above the throughput bars (best, tie, over budget): never shrunk."""
MIN_TEXT_PX = 10
"""The least size of text in a bar (a plan out of memory says so in its bar): smaller, plotly leaves it out (the
hover says it)."""


def report_figure(report: Report) -> Any:
    """The figure of :meth:`Report.plot <memlab.report.data.Report.plot>`.

    Example:
        >>> from memlab.report.data import Trial
        >>> from memlab.plan import Plan
        >>> r = Report([Trial(Plan(), "ok", 2**20, {"params": 2**20}, 0.5, 8.0, None, "cpu")], budget=2**21)
        >>> [shape.name for shape in report_figure(r).layout.shapes]
        ['budget']
    """
    data = figure_data(report)
    host = host_data(report.trials, data["labels"])  # a panel under the memory one, where a plan keeps host bytes
    columns = figure_columns(report, data)
    fig = comparison_figure(columns, categories=tuple(data["categories"]), host=bool(host))
    if data["budget_mib"] is not None:  # its label where it covers no bar
        fig.add_shape(budget_line(data["budget_mib"]))
        fig.add_annotation(budget_note(report.budget or 0, memory_tops(columns, data), fig.layout.bargap))
    title = "memlab: memory and speed per plan"
    if data["caption"] is not None:  # why the best is best, under the title (the bars say which)
        title += f"<br><sup>{data['caption']}</sup>"
    axis = plan_axis(data["labels"])
    fig.update_xaxes(plan_axis_layout(axis, data["labels"]), row=1)
    height = figure_height(axis, _REPORT_HEIGHT)
    if host:
        add_host_panel(fig, host, data["hover"], plan_axis_layout(axis, data["labels"]))
        height = 2 * height - 100  # the host row as tall as the first, less the title's margin
    fig.update_layout(title=title, margin={"t": 90}, height=height)
    fig.update_yaxes(range=speed_range(data), row=1, col=THROUGHPUT_COLUMN)
    return fig


def speed_range(data: Mapping[str, Any]) -> list[float]:
    """The throughput axis's range: from 0 to above the highest error bar, with room for the words over it (plotly
    leaves a text point's words out of its autorange, so they would reach into the panel's title).

    Example:
        >>> speed_range({"samples_per_s": [10.0, None], "speed_high": [12.0, None]})
        [0, 14.4]
    """
    tops = [max(speed, high if high is not None else speed)
            for speed, high in zip(data["samples_per_s"], data["speed_high"], strict=True) if speed is not None]
    top = max(tops, default=0.0)
    return [0, round(top * _SPEED_HEADROOM, 6) if top > 0 else 1]


FIGURE_TITLES = ("Throughput", "Peak memory by category")
"""The titles of the two panels of every memlab figure: samples/s per plan in column 1 (axes ``x``, ``y``), peak
memory by category per plan in column 2 (axes ``x2``, ``y2``)."""

THROUGHPUT_COLUMN, MEMORY_COLUMN = 1, 2
_REPORT_HEIGHT = 460
_COLUMN_WIDTHS = (0.4, 0.6)


def _trace_columns(categories: tuple[str, ...]) -> tuple[int, ...]:
    return (*(MEMORY_COLUMN for _ in categories), MEMORY_COLUMN, MEMORY_COLUMN, MEMORY_COLUMN, THROUGHPUT_COLUMN,
            THROUGHPUT_COLUMN)


def comparison_figure(
    columns: list[dict[str, Any]] | None = None,
    *,
    more_titles: tuple[str, ...] = (),
    categories: tuple[str, ...] = CATEGORIES,
    host: bool = False,
) -> Any:  # a plotly Figure
    """The figure of :meth:`Report.plot` and of the live figure: the subplot layout, axes and per-plan traces.

    Row 1 is throughput (column 1) and peak memory by category (column 2), holding :func:`comparison_traces`
    filled with ``columns`` (see :func:`figure_columns`; None: empty, for a live figure to fill). ``more_titles``
    adds rows below (two titles per row) for the caller's own traces; the live figure adds one. ``categories``:
    the stacked memory categories (an inference report's are :data:`memlab.report.INFERENCE_CATEGORIES`). ``host``:
    a second row whose right panel is :data:`~memlab.report.views.host_figure.HOST_TITLE` (column 2 only; the caller's
    rows below it). plotly is imported here, never when memlab is imported.

    Example:
        >>> fig = comparison_figure(more_titles=("Memory of the running trial", "Memory vs throughput"))
        >>> [a.text for a in fig.layout.annotations][:2], fig.data[0].xaxis, fig.data[-1].xaxis
        (['Throughput', 'Peak memory by category'], 'x2', 'x')
    """
    from plotly.subplots import make_subplots

    rows = 1 + int(host) + len(more_titles) // 2
    fig = make_subplots(
        rows=rows,
        cols=2,
        specs=[[{}, {}], *([[None, {}]] if host else []), *([[{}, {}]] * (len(more_titles) // 2))],
        column_widths=list(_COLUMN_WIDTHS),
        horizontal_spacing=0.12,
        vertical_spacing=0.16,
        subplot_titles=(*FIGURE_TITLES, *((HOST_TITLE,) if host else ()), *more_titles),
    )
    for trace, column in zip(comparison_traces(columns, categories), _trace_columns(categories), strict=True):
        fig.add_trace(trace, row=1, col=column)
    # The legend's groups separate what the colours mean (memory categories) from what a bar's state means; a click
    # hides one entry, not its whole group. No width: the figure follows the cell.
    fig.update_layout(
        barmode="stack", bargap=0.25, autosize=True, legend={"groupclick": "toggleitem", "tracegroupgap": 12},
        uniformtext={"minsize": MIN_TEXT_PX, "mode": "hide"},
    )
    fig.update_xaxes(title_text="plan", type="category", automargin=True, row=1)
    fig.update_yaxes(title_text="samples/s", rangemode="tozero", row=1, col=THROUGHPUT_COLUMN)
    fig.update_yaxes(title_text="peak memory (MiB)", rangemode="tozero", row=1, col=MEMORY_COLUMN)
    return fig


def comparison_traces(
    columns: list[dict[str, Any]] | None = None, categories: tuple[str, ...] = CATEGORIES
) -> list[Any]:
    """The ten per-plan traces, styled: the five categories, "out of memory", "over budget" and "error" (peak
    memory panel), "samples/s" (throughput panel, with its 95% interval as error bars) and the words above its bars
    (:data:`MARKS_NAME`: best, tie, over budget, at the top of each bar's error bar), in that order; filled
    with ``columns`` (:func:`figure_columns`), else empty. An inference report's figure has its own ``categories``
    (four, with the KV cache), and so nine traces.

    The legend shows two groups: "memory" (the categories, plain colours) and "status", each verdict's mark as it
    is drawn: "out of memory" (a grey hatched bar), "over budget" (the hatch over the plan's own colours) and
    "error" (a red cross), each only where a plan has it (:func:`figure_columns` sets ``showlegend``). Every hover
    starts with the plan's label and its levers spelled out (``hovertext``, see :func:`figure_data`).

    Example:
        >>> traces = comparison_traces()
        >>> [trace.name for trace in traces][5:], traces[0].legendgroup, traces[5].legendgrouptitle.text
        (['out of memory', 'over budget', 'error', 'samples/s', 'marks'], 'memory', 'status')
        >>> traces[0].marker.pattern.shape is None  # a category's legend swatch is never hatched
        True
    """
    traces: list[Any] = [
        empty_trace(
            "Bar",
            name,
            # Never hatched: plotly draws a legend swatch with its trace's first bar's pattern, so a hatch here
            # would hatch the swatch whenever the first plan is over the budget ("over budget" draws the hatch).
            marker={"color": CATEGORY_COLORS[name]},
            legendgroup="memory",
            legendgrouptitle_text="memory" if number == 0 else None,
            hovertemplate="%{hovertext}<br>" + name + ": %{y:.2f} MiB<extra></extra>",
        )
        for number, name in enumerate(categories)
    ]
    traces.append(
        empty_trace(
            "Bar",
            OUT_OF_MEMORY_NAME,
            marker={"color": DOES_NOT_FIT_COLOR, "pattern": {"shape": HATCH}},
            legendgroup="status",
            legendgrouptitle_text="status",
            textposition="inside",
            insidetextanchor="middle",
            hovertemplate="%{hovertext}<br>needs at least %{y:.2f} MiB (reached %{customdata:.2f})<extra></extra>",
        )
    )
    traces.append(
        empty_trace(
            "Bar",
            OVER_BUDGET_NAME,
            # The hatch over a plan's stacked colours: a bar with a base is not stacked (plotly draws it over the
            # stack, as in barmode "overlay"), clear but for its hatch; the categories' own hovers stay in reach.
            base=0,
            marker={"color": "rgba(255,255,255,0)", "line": {"width": 0},
                    "pattern": {"shape": HATCH, "fillmode": "overlay", "fgcolor": "#333333", "size": 8,
                                "solidity": 0.25}},
            legendgroup="status",
            legendgrouptitle_text="status",  # on each: plotly titles a group from its first shown trace
            hoverinfo="skip",
            hovertemplate="%{hovertext}<extra></extra>",
        )
    )
    traces.append(
        empty_trace(
            "Scatter",
            "error",
            mode="markers",
            marker={"symbol": "x", "size": 12, "color": BUDGET_COLOR},
            legendgroup="status",
            legendgrouptitle_text="status",
            hovertemplate="%{hovertext}<br>error: %{text}<extra></extra>",
        )
    )
    traces.append(
        empty_trace(
            "Bar",
            "samples/s",
            marker={"color": RATE_COLOR, "pattern": {"fillmode": "overlay", "fgcolor": "#333333", "size": 8,
                                                    "solidity": 0.25}},
            showlegend=False,
            error_y={
                "type": "data",
                "symmetric": False,
                "array": [],
                "arrayminus": [],
                "color": INTERVAL_COLOR,
                "thickness": 1.5,
                "width": _ERROR_CAP_PX,
            },
            hovertemplate="%{hovertext}<br>%{y:.3r} samples/s%{customdata}<extra></extra>",
        )
    )
    # The words above the throughput bars (best, tie, over budget), as points at the top of each bar's whisker: a
    # bar's own text sits on the bar, under its error bar's upper half.
    traces.append(
        empty_trace(
            "Scatter",
            MARKS_NAME,
            mode="text",
            textposition="top center",
            textfont={"size": MARK_FONT_PX},
            cliponaxis=False,
            showlegend=False,
            hoverinfo="skip",
        )
    )
    for trace, values in zip(traces, columns or [], strict=False):
        for key, value in values.items():
            trace[key] = value
    return traces


def empty_trace(kind: str, name: str, **style: Any) -> Any:
    """A plotly trace of ``kind`` (``"Bar"``, ``"Scatter"``) named ``name``, styled by ``style``, with no points yet:
    what every memlab figure starts with and fills in place (see :func:`figure_columns`).

    Example:
        >>> trace = empty_trace("Scatter", "live memory", mode="lines")
        >>> trace.type, trace.name, trace.x, trace.mode
        ('scatter', 'live memory', (), 'lines')
    """
    import plotly.graph_objects as go

    return getattr(go, kind)(name=name, x=[], y=[], **style)


def figure_columns(report: Report, data: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """What each of the :func:`comparison_traces` shows, in trace order: ``{"x": ..., "y": ..., "hovertext": ...}``
    and, where the trace has them, ``"text"`` (above a speed bar: :func:`memlab.report.views.verdicts.bar_marks`, in
    ``"textfont.color"``), ``"showlegend"`` (a status entry only where its mark is drawn), ``"customdata"`` (the MiB
    an out-of-memory plan reached; the speed's interval as text), ``"marker.color"`` and the error bars
    ``"error_y.array"`` / ``"error_y.arrayminus"`` (how far the 95% interval of the samples/s reaches above and
    below the bar) and ``"error_y.width"`` (their caps: none on numbered, thin bars).

    An out-of-memory plan's "does not fit" bar reaches what is known of its peak, a lower bound: the budget that
    stopped it, or more where it reached more before the allocation that broke it (failing both, the highest peak
    drawn, so the bar is never invisible), written as a bound. A plan without an interval (timed once) gets no error
    bar: its reach is the string ``"NaN"`` (JSON has no NaN: plotly sends a float NaN as null, which plotly.js draws
    as a flat cap on the bar, while it reads ``"NaN"`` as NaN and skips the bar).

    Example:
        >>> from memlab.plan import Plan
        >>> from memlab.report.data import Trial
        >>> oom = Trial(Plan(), "oom", 0, {}, None, None, None, "cpu", error="out of memory", budget=2**21)
        >>> column = figure_columns(Report([oom]))[5]
        >>> column["y"], column["customdata"], column["text"], column["hovertext"][0][-28:]
        ([2.0], [0.0], ['does not fit: \u2265 2 MiB'], 'does not fit (out of memory)')
    """
    data = figure_data(report) if data is None else data
    labels = data["labels"]
    numbered = len(labels) > FULL_LABELS_UP_TO
    heights = _does_not_fit_heights(report, data)
    over = [verdict == OVER_BUDGET for verdict in data["verdict"]]
    hatch: list[str] | str = [HATCH if is_over else "" for is_over in over] if any(over) else ""
    columns: list[dict[str, Any]] = [{"x": labels, "y": values} for values in data["categories"].values()]
    columns.append(
        {
            "x": labels,
            "y": heights,
            "customdata": data["does_not_fit"],
            # Written in the bar where bars are wide enough to hold it; numbered bars are too thin (the hover says it).
            "text": [f"does not fit: \u2265 {height:,.4g} MiB" if height is not None and not numbered else ""
                     for height in heights],
            # Each legend entry of the status group is shown where its mark is drawn, and only there.
            "showlegend": any(height is not None for height in heights),
        }
    )
    # the hatch over the whole stack of a plan over the budget, as high as its peak (no bars where none is over,
    # and no hover: the categories' bars under it say what the plan is)
    hatched = [(label, peak) for label, peak, is_over in zip(labels, data["peak_mib"], over, strict=True) if is_over]
    columns.append({"x": [label for label, _ in hatched], "y": [peak for _, peak in hatched], "hovertext": [],
                    "showlegend": bool(hatched)})
    columns.append({"x": labels, "y": data["error"], "text": data["error_text"],
                    "showlegend": any(value is not None for value in data["error"])})
    above, below = _interval_reach(data)
    marks = data["marks"]
    columns.append(
        {
            "x": labels,
            "y": data["samples_per_s"],
            "marker.color": [
                DOES_NOT_FIT_COLOR if is_over else BEST_COLOR if mark == "best" else TIE_COLOR if mark else RATE_COLOR
                for is_over, mark in zip(over, marks, strict=True)
            ],
            "marker.pattern.shape": hatch,
            "customdata": [
                _interval_text(low, high) for low, high in zip(data["speed_low"], data["speed_high"], strict=True)
            ],
            "error_y.array": above,
            "error_y.arrayminus": below,
            "error_y.width": _ERROR_CAP_PX if not numbered else 0,  # caps wider than thin bars would only clutter
        }
    )
    # The verdict by the bar, where the eye looks: best, its ties, and what does not fit; above the top of the bar's
    # error bar (never under its whisker) at MARK_FONT_PX, never shrunk (a sign where the word would not fit).
    slot_px = PLOTLY_PANEL_PX / max(1, len(labels))
    words = bar_marks(marks, over, slot_px, MARK_FONT_PX, numbered=numbered)
    shown = [i for i, word in enumerate(words) if word and data["samples_per_s"][i] is not None]
    columns.append(
        {
            "x": [labels[i] for i in shown],
            "y": [data["samples_per_s"][i] + (above[i] if isinstance(above[i], float) else 0.0) for i in shown],
            "text": staggered_marks(words, shown, slot_px, MARK_FONT_PX),
            "textfont.color": [DOES_NOT_FIT_COLOR if over[i] and not marks[i] else BEST_COLOR for i in shown],
            "hovertext": [],
        }
    )
    for column in columns:  # a hover only where the trace has a bar or a marker: a figure of dozens stays small
        if "hovertext" in column:
            continue
        column["hovertext"] = [
            hover if value is not None else "" for hover, value in zip(data["hover"], column["y"], strict=True)
        ]
    return columns


# --- the data ------------------------------------------------------------------------------------------------------


def _does_not_fit_heights(report: Report, data: Mapping[str, Any]) -> list[float | None]:
    floor = max((peak for peak in data["peak_mib"] if peak), default=1.0)
    heights: list[float | None] = []
    for trial, reached in zip(report.trials, data["does_not_fit"], strict=True):
        if reached is None:
            heights.append(None)
            continue
        budget = trial.budget if trial.budget is not None else report.budget
        # What is known of its peak, no more and no less: the step needed at least the budget that stopped it, and
        # at least what it reached (how much more is not known; the hover says what it reached).
        height = max(reached, (budget or 0) / _MIB)
        heights.append(height if height > 0 else floor)
    return heights


_NO_ERROR_BAR = "NaN"


def _interval_reach(data: Mapping[str, Any]) -> tuple[list[float | str], list[float | str]]:
    """How far each speed's interval reaches above and below it ("NaN" without one: plotly draws no error bar)."""
    above: list[float | str] = []
    below: list[float | str] = []
    for speed, low, high in zip(data["samples_per_s"], data["speed_low"], data["speed_high"], strict=True):
        if speed is None or low is None or high is None:
            above.append(_NO_ERROR_BAR)
            below.append(_NO_ERROR_BAR)
        else:
            above.append(max(0.0, high - speed))
            below.append(max(0.0, speed - low))
    return above, below


def _interval_text(low: float | None, high: float | None) -> str:
    return "" if low is None or high is None else f" (95% interval {axis_number(low)} to {axis_number(high)})"


def _description(trial: Trial) -> str:
    """The trial's plan spelled out, with the model's own weight dtype where its label says it."""
    words = trial.plan.describe() + (f" ({BF16_ON_CPU_SHORT})" if BF16_ON_CPU in trial.notes else "")
    if trial.label != trial.plan.label() and trial.model_weights is not None:
        words += f", {trial.model_weights} weights (as loaded)"
    return words


def finite(value: float | None) -> float | None:
    """``value`` where it is a finite number, else None: what a figure can draw.

    Example:
        >>> finite(2.5), finite(float("inf")), finite(float("nan")), finite(None)
        (2.5, None, None, None)
    """
    return value if value is not None and math.isfinite(value) else None


def figure_data(report: Report, categories: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The figure as plain data: lists aligned with ``labels``, sizes in MiB, None where a bar is absent.

    Keys:
        ``labels``: one per trial (a repeated label gets `` (2)``, `` (3)``... so bars never merge).
        ``describe``: each trial's plan spelled out (:meth:`memlab.Plan.describe`).
        ``hover``: the first lines of each trial's hover: its label (after its number where the bars are
        numbered, see :data:`~memlab.report.views.plan_axis.FULL_LABELS_UP_TO`) and its description.
        ``status``: each trial's status. ``fits``: the report's view of whether each trial fits.
        ``verdict``: each trial's verdict as the table says it (:func:`memlab.report.views.verdicts.verdicts`).
        ``marks``: ``"best"``, ``"tie"`` or ``""`` per trial (:func:`memlab.report.views.verdicts.best_marks`).
        ``caption``: why the best is best (:func:`memlab.report.views.verdicts.best_caption`), or None.
        ``categories``: ``{category: [MiB or None]}``, values for trials that ran (``"ok"``), for ``categories``
        (default: the report's, :attr:`memlab.Report.categories`) in order.
        ``does_not_fit``: MiB reached by out-of-memory trials, None elsewhere.
        ``error``: 0 for failed trials (a marker on the axis), None elsewhere.
        ``error_text``: the one-line message of failed trials, "" elsewhere.
        ``peak_mib``: every trial's peak (None for errors).
        ``samples_per_s``: speeds of ``"ok"`` trials, None elsewhere.
        ``speed_low``, ``speed_high``: the 95% interval of each speed
        (:func:`memlab.report.noise.speed_interval`), None where there is none (timed once, or no speed).
        ``best``: the best trial's label, or None. ``budget_mib``: the budget, or None. ``unit``: ``"MiB"``.

    Example:
        >>> from memlab.plan import Plan
        >>> from memlab.report.data import Trial
        >>> ok = Trial(Plan(), "ok", 2**20, {"params": 2**20}, 0.5, 8.0, None, "cpu")
        >>> oom = Trial(Plan(micro_batch=8), "oom", 3 * 2**20, {"activations": 3 * 2**20},
        ...             None, None, None, "cpu")
        >>> d = figure_data(Report([ok, oom]))
        >>> d["labels"], d["categories"]["params"], d["does_not_fit"], d["best"]
        (['plain', 'mb8x1'], [1.0, None], [None, 3.0], 'plain')
        >>> d["describe"][1], d["speed_low"]
        ('micro-batch 8 x accumulation 1', [None, None])
    """
    labels = run_labels([trial.label for trial in report.trials])
    numbered = len(labels) > FULL_LABELS_UP_TO
    by_category: dict[str, list[float | None]] = {name: [] for name in categories or report.categories}
    does_not_fit: list[float | None] = []
    error: list[float | None] = []
    error_text: list[str] = []
    peak: list[float | None] = []
    speed: list[float | None] = []
    low: list[float | None] = []
    high: list[float | None] = []
    describe: list[str] = []
    hover: list[str] = []
    best = report.best
    best_label = None
    for number, (label, trial) in enumerate(zip(labels, report.trials, strict=True), start=1):
        ran = trial.status == "ok"
        for name in by_category:
            by_category[name].append(trial.breakdown.get(name, 0) / _MIB if ran else None)
        does_not_fit.append(trial.peak_bytes / _MIB if trial.status == "oom" else None)
        error.append(0.0 if trial.status == "error" else None)
        error_text.append(one_line(trial.error) if trial.status == "error" and trial.error else "")
        peak.append(trial.peak_bytes / _MIB if trial.status != "error" else None)
        speed.append(finite(trial.samples_per_s) if ran else None)  # inf or NaN (a step timed at 0 s): no bar
        interval = (
            runs_speed_interval(trial.step_times, trial.step_runs, trial.rows_per_step)
            if ran and speed[-1]
            else None
        )
        low.append(None if interval is None else finite(interval[0]))
        high.append(None if interval is None else finite(interval[1]))
        describe.append(_description(trial))
        hover.append(f"{f'#{number} ' if numbered else ''}<b>{label}</b><br>{describe[-1]}")
        if trial is best:
            best_label = label
    verdict, words = verdicts(report), verdict_words(report)
    marks = best_marks(report)
    caption = best_caption(report)
    for index, (word, mark) in enumerate(zip(verdict, marks, strict=True)):
        reason = caption if mark == "best" else "tie: as fast as the best within noise" if mark else None
        # "fits" goes without saying (a figure of dozens stays small); what does not fit, and why best, are said.
        hover[index] += ("" if word == FITS else f"<br>{words[index]}") + (f"<br>{reason}" if reason else "")
    return {
        "labels": labels,
        "describe": describe,
        "hover": hover,
        "status": [trial.status for trial in report.trials],
        "verdict": verdict,
        "verdict_words": words,
        "marks": marks,
        "caption": caption,
        "fits": [report.fits(trial) for trial in report.trials],
        "categories": by_category,
        "does_not_fit": does_not_fit,
        "error": error,
        "error_text": error_text,
        "peak_mib": peak,
        "samples_per_s": speed,
        "speed_low": low,
        "speed_high": high,
        "best": best_label,
        "budget_mib": None if report.budget is None else report.budget / _MIB,
        "unit": "MiB",
    }


register_views(report_figure=report_figure)
