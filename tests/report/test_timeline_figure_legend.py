"""A timeline's legend is shown whole at any width a notebook has (issue 84 item 9): a GRPO step names five categories,
the peak and six phases. The plotly figure is tall enough for its legend beside the plot (at 460 px it got a scroll
bar and hid "optimizer step" under "backward"), and the static SVG's legend wraps within its drawing (in one line it
ran 120 px past the SVG's edge, where it is cut)."""

from __future__ import annotations

import re

from memlab.measure.tracker import CATEGORIES
from memlab.report.timeline import Timeline, TimelinePeak
from memlab.report.views.plan_axis import text_width
from memlab.report.views.timeline_figure import PHASE_COLORS, timeline_figure, timelines_svg

GRPO_PHASES = ("generation", "old-policy", "reference", "forward", "backward", "optimizer")


def grpo_timeline() -> Timeline:
    """A step with every category and every phase of a GRPO step, in order."""
    x = list(range(len(GRPO_PHASES) * 10 + 1))
    series = {name: [(index + 1) * 1024 * (1 + point % 3) for point in x] for index, name in enumerate(CATEGORIES)}
    phases = [(name, 10 * index, 10 * index + 10) for index, name in enumerate(GRPO_PHASES)]
    top = max(sum(series[name][point] for name in CATEGORIES) for point in x)
    return Timeline(CATEGORIES, x, series, phases, TimelinePeak(top, "backward", "model", {}, {}, at=40))


def test_the_svg_legend_stays_within_its_drawing() -> None:
    svg = timelines_svg([grpo_timeline()])
    width = float(re.search(r'viewBox="0 0 ([\d.]+) ', svg).group(1))
    legend = {name for name in (*CATEGORIES, *GRPO_PHASES[:-1], "optimizer step")}
    drawn = re.findall(r'<text x="([\d.]+)" y="([\d.]+)"[^>]*>([^<]+)</text>', svg)
    entries = [(float(x), float(y), words) for x, y, words in drawn if words in legend]
    assert {words for _, _, words in entries} == legend  # every category and phase named once
    # each entry's words end inside the drawing, measured generously (the document's 11 px)
    assert all(x + text_width(words, 11) <= width for x, _, words in entries), entries
    # the rows under the legend start below its last line: no row's title sits on an entry
    lowest = max(y for _, y, _ in entries)
    titles = [float(y) for _, y, words in drawn if words.startswith("peak ")]
    assert titles and min(titles) > lowest + 8


def test_the_plotly_figure_is_tall_enough_for_its_legend() -> None:
    figure = timeline_figure([grpo_timeline()])
    shown = [trace for trace in figure.data if trace.showlegend is not False]
    phases = [trace for trace in shown if trace.legendgroup == "phases"]
    assert {trace.name for trace in phases} == {"optimizer step", *GRPO_PHASES[:-1]}
    assert set(PHASE_COLORS) >= set(GRPO_PHASES)
    # plotly.js at its default 12 px legend font: an entry takes 19 px, a group gap the figure's tracegroupgap, the
    # phases' title a line, and the legend's padding 10 px (JupyterLab in Chromium drew the GRPO step's legend 328 px
    # tall); the plot is the figure less its margins
    groups = len({trace.legendgroup for trace in shown})
    needs = 19 * (len(shown) + 1) + figure.layout.legend.tracegroupgap * (groups - 1) + 10
    top, bottom = figure.layout.margin.t, figure.layout.margin.b
    plot = figure.layout.height - (100 if top is None else top) - (80 if bottom is None else bottom)  # plotly's own
    assert plot >= needs, (plot, needs)
