"""Figures: throughput and peak memory by category per plan (plotly), shared by Report.plot and the live figure.

plotly is imported inside the functions that draw, never when memlab is imported.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memlab.measure.tracker import CATEGORIES
from memlab.plan import format_bytes
from memlab.report.data import Report
from memlab.report.format import one_line

__all__ = [
    "BEST_COLOR",
    "BUDGET_COLOR",
    "CATEGORY_COLORS",
    "DOES_NOT_FIT_COLOR",
    "FIGURE_TITLES",
    "MEMORY_COLUMN",
    "RATE_COLOR",
    "THROUGHPUT_COLUMN",
    "budget_line",
    "budget_note",
    "comparison_figure",
    "comparison_traces",
    "figure_columns",
    "figure_data",
    "report_figure",
]

_MIB = 1024**2
CATEGORY_COLORS = {
    "params": "#4C78A8",
    "grads": "#F58518",
    "optimizer": "#54A24B",
    "activations": "#E45756",
    "other": "#B0B0B0",
}
"""The colour of each memory category's bars."""
DOES_NOT_FIT_COLOR = "#7F7F7F"
BEST_COLOR = "#2CA02C"
RATE_COLOR = "#72B7B2"
BUDGET_COLOR = "#D62728"


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
    fig = comparison_figure(figure_columns(report, data))
    if data["budget_mib"] is not None:
        fig.add_shape(budget_line(data["budget_mib"]))
        fig.add_annotation(budget_note(report.budget or 0))
    title = "memlab: memory and speed per plan"
    if data["best"] is not None:
        title += f" (best: {data['best']})"
    fig.update_layout(title=title, margin={"t": 80})
    return fig


FIGURE_TITLES = ("Throughput", "Peak memory by category")
"""The titles of the two panels of every memlab figure: samples/s per plan in column 1 (axes ``x``, ``y``), peak
memory by category per plan in column 2 (axes ``x2``, ``y2``)."""

THROUGHPUT_COLUMN, MEMORY_COLUMN = 1, 2
_COLUMN_WIDTHS = (0.4, 0.6)
_TRACE_COLUMNS = (*(MEMORY_COLUMN for _ in CATEGORIES), MEMORY_COLUMN, MEMORY_COLUMN, THROUGHPUT_COLUMN)


def comparison_figure(
    columns: list[dict[str, Any]] | None = None, *, more_titles: tuple[str, ...] = ()
) -> Any:  # a plotly Figure
    """The figure of :meth:`Report.plot` and of the live figure: the subplot layout, axes and per-plan traces.

    Row 1 is throughput (column 1) and peak memory by category (column 2), holding :func:`comparison_traces`
    filled with ``columns`` (see :func:`figure_columns`; None: empty, for a live figure to fill). ``more_titles``
    adds rows below (two titles per row) for the caller's own traces; the live figure adds one. plotly is
    imported here, never when memlab is imported.

    Example:
        >>> fig = comparison_figure(more_titles=("Memory of the running trial", "Memory vs throughput"))
        >>> [a.text for a in fig.layout.annotations][:2], fig.data[0].xaxis, fig.data[-1].xaxis
        (['Throughput', 'Peak memory by category'], 'x2', 'x')
    """
    from plotly.subplots import make_subplots

    rows = 1 + len(more_titles) // 2
    fig = make_subplots(
        rows=rows,
        cols=2,
        column_widths=list(_COLUMN_WIDTHS),
        horizontal_spacing=0.12,
        vertical_spacing=0.16,
        subplot_titles=(*FIGURE_TITLES, *more_titles),
    )
    for trace, column in zip(comparison_traces(columns), _TRACE_COLUMNS, strict=True):
        fig.add_trace(trace, row=1, col=column)
    fig.update_layout(barmode="stack", legend_title_text="memory", bargap=0.25)
    fig.update_xaxes(title_text="plan", type="category", row=1)
    fig.update_yaxes(title_text="samples/s", rangemode="tozero", row=1, col=THROUGHPUT_COLUMN)
    fig.update_yaxes(title_text="peak memory (MiB)", rangemode="tozero", row=1, col=MEMORY_COLUMN)
    return fig


def comparison_traces(columns: list[dict[str, Any]] | None = None) -> list[Any]:
    """The eight per-plan traces, styled: the five categories, "does not fit" and "error" (peak memory panel), and
    "samples/s" (throughput panel), in that order; filled with ``columns`` (:func:`figure_columns`), else empty.

    Example:
        >>> [trace.name for trace in comparison_traces()][5:]
        ['does not fit', 'error', 'samples/s']
    """
    import plotly.graph_objects as go

    traces: list[Any] = [
        go.Bar(
            name=name,
            x=[],
            y=[],
            marker_color=CATEGORY_COLORS[name],
            legendgroup="memory",
            hovertemplate="%{x}<br>" + name + ": %{y:.2f} MiB<extra></extra>",
        )
        for name in CATEGORIES
    ]
    traces.append(
        go.Bar(
            name="does not fit",
            x=[],
            y=[],
            marker={"color": DOES_NOT_FIT_COLOR, "pattern": {"shape": "/"}},
            legendgroup="does not fit",
            textposition="inside",
            insidetextanchor="middle",
            hovertemplate="%{x}<br>does not fit: out of memory (reached %{customdata:.2f} MiB)<extra></extra>",
        )
    )
    traces.append(
        go.Scatter(
            name="error",
            x=[],
            y=[],
            mode="markers",
            marker={"symbol": "x", "size": 12, "color": BUDGET_COLOR},
            hovertemplate="%{x}<br>error: %{text}<extra></extra>",
        )
    )
    traces.append(
        go.Bar(
            name="samples/s",
            x=[],
            y=[],
            marker_color=RATE_COLOR,
            showlegend=False,
            hovertemplate="%{x}<br>%{y:.3g} samples/s<extra></extra>",
        )
    )
    for trace, values in zip(traces, columns or [], strict=False):
        for key, value in values.items():
            trace[key] = value
    return traces


def figure_columns(report: Report, data: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """What each of the :func:`comparison_traces` shows, in trace order: ``{"x": ..., "y": ...}`` and, where the
    trace has them, ``"text"``, ``"customdata"`` (the MiB an out-of-memory plan reached) and ``"marker.color"``.

    An out-of-memory plan's "does not fit" bar is at least as high as its budget: a trial stopped by the budget
    may have reached little before the allocation that broke it (failing both, the highest peak drawn, so the bar
    is never invisible).

    Example:
        >>> from memlab.plan import Plan
        >>> from memlab.report.data import Trial
        >>> oom = Trial(Plan(), "oom", 0, {}, None, None, None, "cpu", error="out of memory", budget=2**21)
        >>> figure_columns(Report([oom]))[5]
        {'x': ['plain'], 'y': [2.0], 'customdata': [0.0], 'text': ['does not fit']}
    """
    data = figure_data(report) if data is None else data
    labels = data["labels"]
    heights = _does_not_fit_heights(report, data)
    columns: list[dict[str, Any]] = [{"x": labels, "y": data["categories"][name]} for name in CATEGORIES]
    columns.append(
        {
            "x": labels,
            "y": heights,
            "customdata": data["does_not_fit"],
            "text": ["does not fit" if height is not None else "" for height in heights],
        }
    )
    columns.append({"x": labels, "y": data["error"], "text": data["error_text"]})
    columns.append(
        {
            "x": labels,
            "y": data["samples_per_s"],
            "marker.color": [BEST_COLOR if label == data["best"] else RATE_COLOR for label in labels],
        }
    )
    return columns


def budget_line(budget_mib: float) -> dict[str, Any]:
    """The dashed budget line across the peak memory panel, as a plotly shape.

    Example:
        >>> budget_line(8.0)["yref"], budget_line(8.0)["line"]["dash"]
        ('y2', 'dash')
    """
    return {
        "type": "line",
        "xref": "x2 domain",
        "x0": 0,
        "x1": 1,
        "yref": "y2",
        "y0": budget_mib,
        "y1": budget_mib,
        "line": {"color": BUDGET_COLOR, "dash": "dash", "width": 2},
        "name": "budget",
    }


def budget_note(budget: int) -> dict[str, Any]:
    """The label of :func:`budget_line` (``"budget 8.0 GiB"``), as a plotly annotation.

    Example:
        >>> budget_note(2**20)["text"]
        'budget 1.0 MiB'
    """
    return {
        "text": f"budget {format_bytes(budget)}",
        "xref": "x2 domain",
        "yref": "y2",
        "x": 0,
        "y": budget / _MIB,
        "xanchor": "left",
        "yanchor": "bottom",
        "showarrow": False,
        "font": {"color": BUDGET_COLOR},
    }


def _does_not_fit_heights(report: Report, data: Mapping[str, Any]) -> list[float | None]:
    floor = max((peak for peak in data["peak_mib"] if peak), default=1.0)
    heights: list[float | None] = []
    for trial, reached in zip(report.trials, data["does_not_fit"], strict=True):
        if reached is None:
            heights.append(None)
            continue
        budget = trial.budget if trial.budget is not None else report.budget
        height = max(reached, (budget or 0) / _MIB)
        heights.append(height if height > 0 else floor)
    return heights


def figure_data(report: Report) -> dict[str, Any]:
    """The figure as plain data: lists aligned with ``labels``, sizes in MiB, None where a bar is absent.

    Keys:
        ``labels``: one per trial (a repeated label gets `` (2)``, `` (3)``... so bars never merge).
        ``status``: each trial's status. ``fits``: the report's view of whether each trial fits.
        ``categories``: ``{category: [MiB or None]}``, values for trials that ran (``"ok"``).
        ``does_not_fit``: MiB reached by out-of-memory trials, None elsewhere.
        ``error``: 0 for failed trials (a marker on the axis), None elsewhere.
        ``error_text``: the one-line message of failed trials, "" elsewhere.
        ``peak_mib``: every trial's peak (None for errors).
        ``samples_per_s``: speeds of ``"ok"`` trials, None elsewhere.
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
    """
    labels: list[str] = []
    seen: dict[str, int] = {}
    for trial in report.trials:
        count = seen.get(trial.label, 0) + 1
        seen[trial.label] = count
        labels.append(trial.label if count == 1 else f"{trial.label} ({count})")
    categories: dict[str, list[float | None]] = {name: [] for name in CATEGORIES}
    does_not_fit: list[float | None] = []
    error: list[float | None] = []
    error_text: list[str] = []
    peak: list[float | None] = []
    speed: list[float | None] = []
    best = report.best
    best_label = None
    for label, trial in zip(labels, report.trials, strict=True):
        ran = trial.status == "ok"
        for name in CATEGORIES:
            categories[name].append(trial.breakdown[name] / _MIB if ran else None)
        does_not_fit.append(trial.peak_bytes / _MIB if trial.status == "oom" else None)
        error.append(0.0 if trial.status == "error" else None)
        error_text.append(one_line(trial.error) if trial.status == "error" and trial.error else "")
        peak.append(trial.peak_bytes / _MIB if trial.status != "error" else None)
        speed.append(trial.samples_per_s if ran else None)
        if trial is best:
            best_label = label
    return {
        "labels": labels,
        "status": [trial.status for trial in report.trials],
        "fits": [report.fits(trial) for trial in report.trials],
        "categories": categories,
        "does_not_fit": does_not_fit,
        "error": error,
        "error_text": error_text,
        "peak_mib": peak,
        "samples_per_s": speed,
        "best": best_label,
        "budget_mib": None if report.budget is None else report.budget / _MIB,
        "unit": "MiB",
    }
