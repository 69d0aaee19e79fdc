"""``%%memfit``'s timeline in a real IPython shell standing in for a kernel: after a run, a list of the plans and the
picked plan's step timeline, kept as a static record that each pick updates in place (what a saved notebook keeps),
bounded in size; the list closed (a line of text) when the next cell runs; none with --quiet, in a terminal, or where
no trial has a timeline. The shell fixture and the front
end are test_magic.py's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell
from test_magic import FAST, MLP_LOSS, WIDGET_VIEW, FrontEnd, magic_shell, memfit

from memlab.frontends.jupyter.magic import render as magic_render
from memlab.frontends.jupyter.timeline_view import TimelineView
from memlab.report.views.static import timeline_bundle

RUN = FAST.replace(" --quiet", "")


@pytest.fixture(scope="module")
def shell() -> Iterator[InteractiveShell]:
    yield from magic_shell()


@pytest.fixture
def front_end(shell: InteractiveShell, monkeypatch: pytest.MonkeyPatch) -> Iterator[FrontEnd]:
    front = FrontEnd()
    monkeypatch.setattr(shell, "display_pub", front)
    monkeypatch.setattr(magic_render, "shows_widgets", lambda shell: True)  # as in a Jupyter kernel
    yield front
    magic_render.close_timelines()  # no list of this test is left for another test's cells to close


@pytest.fixture
def views(monkeypatch: pytest.MonkeyPatch) -> list[TimelineView]:
    """Every TimelineView the magic makes, kept (the test then picks in its list as a user would)."""
    made: list[TimelineView] = []

    class Kept(TimelineView):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(magic_render, "TimelineView", Kept)
    return made


def test_the_magic_shows_the_best_plans_timeline_and_a_pick_updates_the_kept_record(
    shell: InteractiveShell, front_end: FrontEnd, views: list[TimelineView]
) -> None:
    report = memfit(shell, f"mlp pairs --try checkpointing=off,on {RUN}", MLP_LOSS)
    assert [trial.label for trial in report] == ["plain", "ckpt"]
    figure, picker, drawn = front_end.outputs  # the figure's record, the list, the picked plan's timeline
    assert WIDGET_VIEW not in figure["data"] and WIDGET_VIEW in picker["data"]
    [view] = views
    assert [text for text, _ in view.picker.options] == ["plain (plan 1)", "ckpt (plan 2)"]
    best = report.trials.index(report.best)  # picked first: the best plan
    listed = picker["data"]["text/plain"]
    assert view.picker.value == best and listed.startswith("timeline of ") and f"(plan {best + 1})" in listed
    timeline = report.trials[best].timeline
    assert timeline is not None and drawn["data"] == timeline_bundle([timeline])
    assert set(drawn["data"]) == {"image/svg+xml", "text/plain"}  # no widget: it shows without a kernel

    other = 1 - best
    view.picker.value = other  # what the user does in the list, with the kernel alive
    assert len(front_end.outputs) == 3 and front_end.published[-1]["update"]
    assert front_end.published[-1]["display_id"] == drawn["display_id"]
    assert front_end.outputs[2]["data"]["text/plain"].startswith(f"memlab timeline: {report.trials[other].label}: ")
    assert report.trials[other].label in front_end.outputs[2]["data"]["image/svg+xml"]
    assert len(json.dumps(front_end.outputs[2]["data"])) < 100_000


def test_an_estimate_offers_each_plans_timeline(shell: InteractiveShell, front_end: FrontEnd,
                                                 views: list[TimelineView]) -> None:
    memfit(shell, "model batch --dry-run --try checkpointing=off,on precision=fp32,bf16 --steps 1")
    [view] = views
    assert len(view.picker.options) == 4
    for index in range(4):  # every estimate's fake step has a timeline to pick
        view.picker.value = index
        assert view.picker.options[index][0].endswith(f"(plan {index + 1})")
        assert front_end.outputs[2]["data"]["text/plain"].startswith("memlab timeline: ")


def test_quiet_shows_no_timeline(shell: InteractiveShell, front_end: FrontEnd, views: list[TimelineView]) -> None:
    memfit(shell, f"mlp pairs {FAST}", MLP_LOSS)
    assert front_end.outputs == [] and views == []


def test_a_run_without_timelines_shows_no_list(shell: InteractiveShell, front_end: FrontEnd,
                                               views: list[TimelineView], monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    import memlab

    def without_timelines(*args: Any, **options: Any) -> memlab.Report:
        report = real(*args, **options)
        return memlab.Report([dataclasses.replace(trial, timeline=None) for trial in report.trials])

    from memlab.frontends.jupyter.magic import run as magic_run

    real = magic_run.compare
    monkeypatch.setattr(magic_run, "compare", without_timelines)
    memfit(shell, f"mlp pairs {RUN}", MLP_LOSS)
    assert len(front_end.outputs) == 1 and views[0].record is None


def test_the_next_cell_closes_the_list_and_the_drawing_stays(shell: InteractiveShell, front_end: FrontEnd,
                                                              views: list[TimelineView]) -> None:
    report = memfit(shell, f"mlp pairs --try checkpointing=off,on {RUN}", MLP_LOSS)
    [view] = views
    view.picker.value = 0
    drawn = front_end.outputs[2]["data"]
    assert drawn["text/plain"].startswith(f"memlab timeline: {report.trials[0].label}: ")
    shell.run_cell("after = 1")  # the user moves on: IPython's pre_run_cell closes the list
    figure, listed, kept = front_end.outputs
    assert listed["data"] == {"text/plain": f"timeline of {report.trials[0].label} (plan 1)"}  # no widget left to save
    assert kept["data"] == drawn and view.picker.comm is None and view.widget.comm is None
    assert magic_render.OPEN_TIMELINES == []
