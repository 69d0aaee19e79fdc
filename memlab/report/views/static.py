"""The record of a run that a notebook keeps (:func:`record_bundle`): a static SVG of the Report's figure, a line of
text, and plotly's JSON for front ends that draw it.

Why an SVG by hand (:func:`report_svg`, laid out in :mod:`memlab.report.views.svg.layout`): plotly's own static export
(``Figure.write_image``) needs kaleido and a Chrome, which users, Binder and CI mostly lack, and a notebook's output
must render with no kernel at all: after a reload, in nbconvert's HTML, on GitHub. Bars need only rectangles, lines
and text, so memlab writes them itself, from the same plain data the plotly figure draws
(:func:`memlab.report.views.figure.figure_data` and :func:`~memlab.report.views.figure.figure_columns`), in the same
colours, naming the bars the same way (:func:`~memlab.report.views.plan_axis.plan_axis`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from memlab.plan import format_bytes
from memlab.report.data import Report
from memlab.report.format import format_rate
from memlab.report.views.figure import report_figure
from memlab.report.views.svg.layout import WIDTH, report_svg

if TYPE_CHECKING:
    from memlab.report.timeline import Timeline

__all__ = [
    "INTERACTIVE_LIMIT", "PLOTLY_MIME", "WIDTH", "figure_bundle", "record_bundle", "record_text", "report_svg",
    "timeline_bundle",
]

PLOTLY_MIME = "application/vnd.plotly.v1+json"
"""The mime type of a plotly figure's JSON, which JupyterLab's plotly renderer draws interactive."""
INTERACTIVE_LIMIT = 64_000
"""The most characters of plotly JSON a record holds; a larger figure (a search of a hundred plans) keeps only its SVG,
so that no record weighs more than about 150 kB in the notebook."""


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
    return figure_bundle(record_text(report), report_svg(report), report_figure(report) if interactive else None)


def figure_bundle(text: str, svg: str, figure: Any = None) -> dict[str, Any]:
    """A record of any figure (``memlab.watch``'s too): ``text``, ``svg``, and the plotly ``figure``'s JSON where
    one is given and it fits in :data:`INTERACTIVE_LIMIT`.

    Example:
        >>> sorted(figure_bundle("t", "<svg/>"))
        ['image/svg+xml', 'text/plain']
    """
    bundle: dict[str, Any] = {"text/plain": text, "image/svg+xml": svg}
    if figure is not None:
        data = _plotly_json(figure)
        if len(json.dumps(data, separators=(",", ":"))) <= INTERACTIVE_LIMIT:
            bundle[PLOTLY_MIME] = data
    return bundle


def timeline_bundle(timelines: Sequence[Timeline]) -> dict[str, Any]:
    """The record a notebook keeps of step timelines (the magic's picked plan, ``memlab.watch``'s costliest step):
    their SVG (:func:`memlab.report.views.timeline_figure.timelines_svg`, thinned to a few hundred points whatever the
    number of events, so a 70B estimate's weighs what a tiny model's does) and a line naming each peak.

    Example:
        >>> from memlab.report.timeline import Timeline, TimelinePeak
        >>> t = Timeline(("other",), [0, 1], {"other": [0, 2048]}, [("forward", 0, 1)],
        ...              TimelinePeak(2048, "forward", "fc", {"other": 2048}, {}, at=1), label="plain")
        >>> bundle = timeline_bundle([t])
        >>> bundle["text/plain"], bundle["image/svg+xml"][:4]
        ('memlab timeline: plain: peak 2.0 KiB: forward of fc', '<svg')
    """
    from memlab.report.views.timeline_figure import timeline_title, timelines_svg

    text = "memlab timeline: " + "; ".join(timeline_title(timeline) for timeline in timelines)
    return figure_bundle(text, timelines_svg(timelines))


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


def _plotly_json(plotly_figure: Any) -> dict[str, Any]:
    """The plotly figure as JSON without its template's per-trace defaults (most of its bytes, unused by bars)."""
    figure = json.loads(plotly_figure.to_json())
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
