"""Results: :class:`Trial` and :class:`Report` as data, their tables, and their figures.

- :mod:`memlab.report.data`: Trial, Report (best, ties, fits, JSON, pandas).
- :mod:`memlab.report.inference_trial`: InferenceTrial, an inference plan's Trial.
- :mod:`memlab.report.noise`: the interval of a median step time; when two speeds differ beyond the noise.
- :mod:`memlab.report.views.tables`: text and HTML tables (pandas renders them).
- :mod:`memlab.report.views.figure`: the plotly figures (Report.plot and the live figure's top row).
- :mod:`memlab.report.views.plan_axis`: how a figure names its bars, one per plan.
- :mod:`memlab.report.views.static`: the record a notebook keeps after a run: the figure as SVG
  (:mod:`memlab.report.views.svg.layout`, :mod:`memlab.report.views.svg.panels`, :mod:`memlab.report.views.svg`), text,
  plotly JSON.
- :mod:`memlab.report.format`: one-line messages, seconds and rates as text.

The data never imports its views: :mod:`memlab.report.views` holds them by name, and this package imports the view
modules, each registering its functions. Pandas and plotly are imported when first drawn, so ``import memlab``
imports neither.
"""

from __future__ import annotations

from memlab.report.data import CATEGORIES, INFERENCE_CATEGORIES, STATUSES, Report, Trial
from memlab.report.format import format_rate, format_seconds, one_line
from memlab.report.inference_trial import InferenceTrial

# The view modules register their functions as they are imported (memlab.report.views): the data asks for them by name.
from memlab.report.views import figure as _figure  # noqa: F401 - registers Report.plot's figure
from memlab.report.views import tables as _tables  # noqa: F401 - registers the text and HTML tables
from memlab.report.views import timeline_figure as _timeline_figure  # noqa: F401 - registers the timelines' figures

__all__ = [
    "CATEGORIES", "INFERENCE_CATEGORIES", "STATUSES", "InferenceTrial", "Report", "Trial", "format_rate",
    "format_seconds", "one_line",
]
