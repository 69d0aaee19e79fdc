"""memlab.watch's live figure on a real (tiny) Trainer, on CPU: redrawn every logging step and at the last, stacked
by category, and left as a static record (SVG, text) when training ends, with the costliest step's timeline below it."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

pytest.importorskip("datasets")
pytest.importorskip("plotly")
from trainers import make_trainer  # noqa: E402

import memlab  # noqa: E402
from memlab.frontends.jupyter.watch_figure import WatchFigure, steps_figure  # noqa: E402
from memlab.report.views.svg.steps import step_series  # noqa: E402


class Shown:
    """Stands in for IPython's display: keeps what was shown, and each update of it."""

    def __init__(self) -> None:
        self.objects: list[Any] = []
        self.updates: list[Any] = []

    def __call__(self, obj: Any, **keywords: Any) -> Any:
        self.objects.append(obj)
        return self

    def update(self, obj: Any, **keywords: Any) -> None:
        self.updates.append(obj)


def test_redraws_every_logging_step_and_the_last_then_leaves_a_static_record(tmp_path: Any) -> None:
    trainer = make_trainer(tmp_path, steps=5, logging_steps=2)
    watched = memlab.watch(trainer, budget="1GiB", show=False)
    shown = Shown()
    figure = WatchFigure(watched, display=shown)
    trainer.train()
    watched.remove()
    assert figure.redraws == 3  # steps 2, 4 and 5 (the last)
    # The figure while it trained, then below it, once training ended, the costliest step's timeline.
    assert len(shown.objects) == 2 and shown.objects[0].__class__.__name__ == "FigureWidget"
    assert shown.objects[1] is figure.timeline_record and set(figure.timeline_record) == {"text/plain", "image/svg+xml"}
    assert figure.timeline_record["text/plain"].startswith(f"memlab timeline: step {watched.peak_step}: peak ")
    assert "forward" in figure.timeline_record["image/svg+xml"]
    record = shown.updates[-1]
    assert record is figure.record and figure.widget is None  # the widget gave way to the record
    assert set(record) == {"text/plain", "image/svg+xml"}  # one static form: no plotly JSON (JupyterLab adds a PNG)
    assert "5 steps" in record["text/plain"] and "within the 1.00 GiB budget" in record["text/plain"]
    svg = record["image/svg+xml"]
    assert svg.startswith("<svg") and "budget 1.00 GiB" in svg
    # On CPU the tracker knows each category at the step's peak, and they sum to it.
    assert all(sum(step.categories.values()) == step.peak_bytes for step in watched.steps)
    drawn = {trace.name for trace in steps_figure(step_series(watched.steps, watched.budget)).data if trace.x}
    assert {"samples/s", "params", "grads", "activations"} <= drawn and "peak" not in drawn


def test_a_step_without_categories_draws_the_peak(tmp_path: Any) -> None:
    from types import SimpleNamespace as Record

    from memlab.report.views.svg.steps import step_series

    series = step_series([Record(step=1, peak_bytes=2**20, samples_per_s=1.0, categories={})])
    assert list(series["memory"]) == ["peak"]


@pytest.mark.parametrize(("last", "tick"), [(1, 1), (3, 1), (10, 2), (40, 5), (1000, 200)])
def test_the_step_axis_writes_whole_steps_only(last: int, tick: int) -> None:
    """Three steps were ticked 1, 1.5, 2, 2.5, 3 and written "1 2 2 3 3"; now every tick is a whole step, at most
    about eight of them."""
    from types import SimpleNamespace as Record

    from memlab.frontends.jupyter.watch_figure import steps_figure
    from memlab.report.views.svg.steps import step_series

    records = [Record(step=step, peak_bytes=2**20, samples_per_s=1.0, categories={}) for step in range(1, last + 1)]
    figure = steps_figure(step_series(records))
    assert figure.layout.xaxis.dtick == figure.layout.xaxis2.dtick == tick
    assert isinstance(tick, int) and (last - 1) / tick <= 8


def test_show_false_draws_nothing_and_show_none_outside_a_kernel_neither(tmp_path: Any) -> None:
    trainer = make_trainer(tmp_path, steps=1)
    for show in (False, None):
        watched = memlab.watch(trainer, show=show)
        assert watched._listeners == [] and watched._end_listeners == []
        watched.remove()


def test_import_memlab_and_watch_import_no_front_end(tmp_path: Any) -> None:
    code = ("import sys, memlab, memlab.trainer.watch; "
            "print(sorted(m for m in ('IPython', 'plotly', 'ipywidgets') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
