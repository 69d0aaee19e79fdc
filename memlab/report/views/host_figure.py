"""Host memory drawn: where some plan keeps bytes on the host (:attr:`memlab.report.Trial.host_bytes`, DESIGN.md
2.4), every figure of a report gets a third panel under the peak memory one, "Host memory": one bar per plan in the
host colour, the host budget as a dotted line, and a plan that fits the device but not the host hatched and written
"does not fit (host)", as the table's status column says it. A report whose plans keep nothing on the host has no
such panel (its figure is the two panels it always was).

:func:`host_data` is the panel as plain data; :func:`host_traces` and :func:`host_budget_marks` draw it in plotly
(:func:`memlab.report.views.figure.report_figure`); :meth:`memlab.report.views.svg.panels.PlanBars.host` draws it in
the static SVG. plotly is imported inside the functions that draw.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from memlab.plan import format_bytes
from memlab.report.views.colors import BUDGET_COLOR, HATCH, HOST_COLOR

__all__ = ["DOES_NOT_FIT_HOST", "HOST_BUDGET_NAME", "HOST_NAME", "HOST_TITLE", "HostTrial", "add_host_panel",
           "host_budget_marks", "host_data", "host_traces"]

HOST_TITLE = "Host memory"
"""The title of the host panel."""
HOST_NAME = "host memory"
"""The name (and legend entry) of the host bars."""
HOST_BUDGET_NAME = "host budget"
"""The name of the host budget's dotted line (a plotly shape)."""
DOES_NOT_FIT_HOST = "does not fit (host)"
"""What a plan that fits the device and misses the host budget is called, in the table and on its host bar."""

_MIB = 1024**2


class HostTrial(Protocol):
    """What the host panel reads of a :class:`memlab.report.Trial` (named so, this module imports nothing of the
    report's data: the report's figures import it)."""

    status: str
    host_bytes: int
    host_budget: int | None

    @property
    def verdict_figure(self) -> str: ...


def host_data(trials: Sequence[HostTrial], labels: list[str]) -> dict[str, Any] | None:
    """The host panel as plain data of a report's ``trials``, aligned with ``labels`` (one per trial): ``host_mib``
    (None for a failed plan, which kept nothing measured), ``over`` (True where the host decided that the plan does
    not fit: :attr:`Trial.verdict_figure <memlab.report.Trial.verdict_figure>` ``"host"``), ``budget`` (the smallest
    host budget the plans that ran were judged against, in bytes, as the table's host line says it; None without one)
    and ``budget_mib``. None where no plan keeps a byte on the host: no panel is drawn.

    Example:
        >>> from memlab.plan import Plan
        >>> from memlab.report.data import Trial
        >>> plain = Trial(Plan(), "ok", 9, {}, 0.5, 8.0, None, "cuda", host_budget=2**30)
        >>> off = Trial(Plan(offload="all"), "ok", 5, {}, 0.9, 4.0, None, "cuda", host_bytes=2**31, host_budget=2**30)
        >>> data = host_data([plain, off], ["plain", "offload-all"])
        >>> data["host_mib"], data["over"], data["budget_mib"]
        ([0.0, 2048.0], [False, True], 1024.0)
        >>> host_data([plain], ["plain"]) is None
        True
    """
    if not any(trial.host_bytes > 0 and trial.status != "error" for trial in trials):
        return None
    budgets = [trial.host_budget for trial in trials if trial.host_budget is not None and trial.status == "ok"]
    budget = min(budgets) if budgets else None
    return {
        "labels": list(labels),
        "host_mib": [trial.host_bytes / _MIB if trial.status != "error" else None for trial in trials],
        "over": [trial.status == "ok" and trial.verdict_figure == "host" for trial in trials],
        "budget": budget,
        "budget_mib": None if budget is None else budget / _MIB,
    }


def host_traces(data: dict[str, Any], hover: list[str]) -> list[Any]:
    """The host panel's plotly traces: :data:`HOST_NAME`, a bar per plan in the host colour (hatched, with
    :data:`DOES_NOT_FIT_HOST` above it, where the host decided), each hover starting as the figure's do (``hover``:
    :func:`memlab.report.views.figure.figure_data`'s).

    Example:
        >>> data = {"labels": ["a", "b"], "host_mib": [0.0, 2048.0], "over": [False, True], "budget_mib": 1024.0}
        >>> [bar] = host_traces(data, ["<b>a</b>", "<b>b</b>"])
        >>> bar.name, bar.y, bar.text, bar.marker.pattern.shape
        ('host memory', (0.0, 2048.0), ('', 'does not fit (host)'), ('', '/'))
    """
    import plotly.graph_objects as go

    over: list[bool] = data["over"]
    return [
        go.Bar(
            name=HOST_NAME,
            x=data["labels"],
            y=data["host_mib"],
            marker={"color": HOST_COLOR, "pattern": {"shape": [HATCH if miss else "" for miss in over],
                                                     "fillmode": "overlay", "fgcolor": "#333333", "size": 8,
                                                     "solidity": 0.25}},
            text=[DOES_NOT_FIT_HOST if miss else "" for miss in over],
            textposition="outside",
            cliponaxis=False,
            textfont={"color": BUDGET_COLOR},
            legendgroup="host",
            legendgrouptitle_text="host",
            hovertext=[f"{words}<br>{DOES_NOT_FIT_HOST}" if miss else words
                       for words, miss in zip(hover, over, strict=True)],
            hovertemplate="%{hovertext}<br>host memory: %{y:.2f} MiB<extra></extra>",
        )
    ]


def add_host_panel(fig: Any, data: dict[str, Any], hover: list[str], plan_axis: dict[str, Any]) -> None:
    """The host panel drawn in row 2, column 2 of ``fig`` (made by :func:`memlab.report.views.figure.comparison_figure`
    with ``host=True``): :func:`host_traces`, its plan axis laid out as ``plan_axis`` says (the memory panel's), and
    the host budget's line where there is one.

    Example:
        >>> from memlab.report.views.figure import comparison_figure
        >>> fig = comparison_figure(host=True)
        >>> data = {"labels": ["a"], "host_mib": [2048.0], "over": [True], "budget": 2**30, "budget_mib": 1024.0}
        >>> add_host_panel(fig, data, ["<b>a</b>"], {})
        >>> fig.data[-1].name, fig.data[-1].yaxis, [shape.name for shape in fig.layout.shapes]
        ('host memory', 'y3', ['host budget'])
    """
    for trace in host_traces(data, hover):
        fig.add_trace(trace, row=2, col=2)
    fig.update_xaxes(plan_axis, title_text="plan", type="category", row=2, col=2)
    fig.update_yaxes(title_text="host memory (MiB)", rangemode="tozero", row=2, col=2)
    if data["budget"] is not None:
        line, note = host_budget_marks(data["budget"], fig.data[-1].xaxis, fig.data[-1].yaxis)
        fig.add_shape(line)
        fig.add_annotation(note)


def host_budget_marks(budget: int, xref: str, yref: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The host budget across the host panel (axes ``xref``, ``yref``): a dotted line and its label at its right
    end, as plotly's shape and annotation.

    Example:
        >>> line, note = host_budget_marks(2**30, "x3", "y3")
        >>> line["name"], line["line"]["dash"], line["y0"], line["xref"], note["text"]
        ('host budget', 'dot', 1024.0, 'x3 domain', 'host budget 1.00 GiB')
    """
    line = {"type": "line", "xref": f"{xref} domain", "x0": 0, "x1": 1, "yref": yref, "y0": budget / _MIB,
            "y1": budget / _MIB, "layer": "above", "line": {"color": BUDGET_COLOR, "dash": "dot", "width": 2},
            "name": HOST_BUDGET_NAME}
    note = {"text": f"{HOST_BUDGET_NAME} {format_bytes(budget)}", "xref": f"{xref} domain", "yref": yref, "x": 1,
            "y": budget / _MIB, "xanchor": "right", "yanchor": "bottom", "showarrow": False,
            "bgcolor": "rgba(255,255,255,0.85)", "borderpad": 2, "font": {"color": BUDGET_COLOR}}
    return line, note
