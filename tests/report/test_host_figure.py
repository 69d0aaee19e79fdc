"""Host memory in a report's figures (issue 60, DESIGN.md 2.4): Report.plot() and the static SVG draw a host panel
where some plan keeps bytes on the host, with the host budget and "does not fit (host)"; none where no plan does."""

from __future__ import annotations

import re

from memlab import Plan
from memlab.report import Report, Trial
from memlab.report.views.colors import HOST_COLOR
from memlab.report.views.static import report_svg

GIB = 2**30
MIB = 2**20


def _trial(plan: Plan, host_bytes: int, host_budget: int | None = 24 * GIB, peak: int = 12 * GIB) -> Trial:
    return Trial(plan, "ok", peak, {"params": peak // 2, "optimizer": peak // 2}, 0.5, 8.0, None, "cuda:0",
                 budget=16 * GIB, host_bytes=host_bytes, host_budget=host_budget)


def _report() -> Report:
    return Report([_trial(Plan(), 0), _trial(Plan(offload="optimizer"), 14 * GIB),
                   _trial(Plan(offload="all"), 30 * GIB, peak=9 * GIB)], budget=16 * GIB)


def test_the_plotly_figure_has_a_host_panel_with_each_plans_host_bytes_and_the_host_budget() -> None:
    fig = _report().plot()
    names = [trace.name for trace in fig.data]
    assert names[:10] == ["params", "grads", "optimizer", "activations", "other", "out of memory", "over budget",
                          "error", "samples/s", "marks"]  # the ten the live figure relies on, unchanged
    host = fig.data[names.index("host memory")]
    assert list(host.x) == ["plain", "offload-optimizer", "offload-all"]
    assert list(host.y) == [0.0, 14 * GIB / MIB, 30 * GIB / MIB]
    assert host.marker.color == HOST_COLOR
    # a panel of its own, under the peak memory panel and as wide
    assert (host.xaxis, host.yaxis) == ("x3", "y3")
    assert fig.layout.xaxis3.domain == fig.layout.xaxis2.domain
    assert fig.layout.yaxis3.domain[1] < fig.layout.yaxis2.domain[0]
    assert "Host memory" in [note.text for note in fig.layout.annotations]
    assert fig.layout.yaxis3.title.text == "host memory (MiB)"
    # the plan over the host budget: hatched and said, on the bar and in its hover
    assert list(host.text) == ["", "", "does not fit (host)"]
    assert list(host.marker.pattern.shape) == ["", "", "/"]
    assert "does not fit (host)" in host.hovertext[2] and "does not fit" not in host.hovertext[1]
    line = next(shape for shape in fig.layout.shapes if shape.name == "host budget")
    assert (line.yref, line.y0, line.line.dash) == ("y3", 24 * GIB / MIB, "dot")
    assert "host budget 24.00 GiB" in [note.text for note in fig.layout.annotations]


def test_a_figure_without_host_bytes_has_no_host_panel() -> None:
    fig = Report([_trial(Plan(), 0), _trial(Plan(micro_batch=2), 0)], budget=16 * GIB).plot()
    assert "host memory" not in [trace.name for trace in fig.data]
    assert "xaxis3" not in fig.layout and [shape.name for shape in fig.layout.shapes] == ["budget"]


def test_without_a_host_budget_the_host_panel_has_no_budget_line() -> None:
    fig = Report([_trial(Plan(offload="optimizer"), 14 * GIB, host_budget=None)]).plot()
    assert "host memory" in [trace.name for trace in fig.data]
    assert "host budget" not in [shape.name for shape in fig.layout.shapes]


def test_the_static_svg_draws_the_host_panel_its_budget_and_the_host_verdict() -> None:
    svg = report_svg(_report())
    assert ">Host memory</text>" in svg and "host memory (GiB)" in svg
    bars = re.findall(r'<g class="plan host" data-verdict="(\w+)"><title>([^<]*)</title>(.*?)</g>', svg)
    assert [(verdict, title.split("\n")[0]) for verdict, title, _ in bars] == [("fits", "offload-optimizer"),
                                                                                ("host", "offload-all")]
    assert all(f'fill="{HOST_COLOR}"' in drawn for _, _, drawn in bars)
    assert "host memory 30 GiB" in bars[1][1] and "does not fit (host)" in bars[1][2]
    assert "host budget 24.00 GiB" in svg and 'stroke-dasharray="2,3"' in svg
    assert "offload all (does not fit: over the host budget)" in svg  # the key under the panels
    legend = svg[:svg.index(">Throughput</text>")]
    assert all(entry in legend for entry in (">host memory</text>", ">does not fit (host)</text>",
                                             ">host budget</text>"))


def test_the_static_svg_without_host_bytes_has_no_host_panel() -> None:
    svg = report_svg(Report([_trial(Plan(), 0)], budget=16 * GIB))
    assert "Host memory" not in svg and "host budget" not in svg
