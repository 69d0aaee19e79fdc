"""How a ``%%memfit`` run is shown, and what the cell gives back: the live figure while trials run, the static record
that replaces it however the run ends, the table of an interrupted run, and the one-line KeyboardInterrupt that
keeps its finished trials.

Unless ``--quiet`` (or in a terminal IPython, which cannot draw a widget), :func:`show_run` displays the live
figure (:class:`~memlab.frontends.jupyter.live.LiveOutput`) at the first trial and updates it while trials run; when
the run ends (normally, on Ctrl-C, or with an error) that output is replaced by a static record of the figure (an
SVG, see :mod:`memlab.report.views.static`) and the widget is closed, so the saved notebook shows the figure without a
kernel. Below it, when the run ends normally, the timeline of one plan (the best, else the last; any other picked in
a list): :class:`~memlab.frontends.jupyter.timeline_view.TimelineView` with ``keep=True``, whose drawing is a static
record too, updated in place at each pick, so the saved notebook keeps the timeline last picked; the list is closed
(left as a line naming the plan drawn) when the next cell runs (:func:`close_timelines`). A MemlabError
raised while the job runs becomes the one-line UsageError; an interrupt is returned, its frames cleared, and raised
by the magic as :func:`stopped`.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

from IPython.display import display

from memlab.errors import MemlabError
from memlab.frontends.jupyter.live import LiveOutput
from memlab.frontends.jupyter.magic.parse import usage_error
from memlab.frontends.jupyter.magic.run import Job
from memlab.frontends.jupyter.timeline_view import TimelineView
from memlab.report import Report

__all__ = ["OPEN_TIMELINES", "clear_chain", "close_timelines", "show_run", "show_timelines", "shows_widgets", "stopped"]

OPEN_TIMELINES: list[TimelineView] = []
"""The magic's timeline lists still open (closed when the next cell runs)."""


def shows_widgets(shell: Any) -> bool:
    """Whether the front end can draw a widget: a Jupyter kernel can; a terminal IPython only prints its repr.

    Example:
        >>> from IPython.testing import globalipapp
        >>> shows_widgets(globalipapp.get_ipython())  # a terminal-like test shell
        False
    """
    return getattr(shell, "kernel", None) is not None


def show_run(job: Job, shell: Any, quiet: bool = False) -> tuple[Report, bool]:
    """Run ``job``, shown: with the live figure where ``shell`` draws widgets and not ``quiet``. Its report, and
    whether Ctrl-C stopped it. Everything was checked before this runs; the live figure is shown at the first trial,
    so that a refused invocation displays nothing.

    Example:
        >>> from memlab.options import RunOptions
        >>> report, interrupted = show_run(Job(RunOptions(), ("params",), lambda options: Report([])), shell=None)
        >>> len(report), interrupted
        (0, False)
    """
    options = job.options
    output: LiveOutput | None = None
    if not quiet and shows_widgets(shell):
        output = LiveOutput(options.budget, categories=job.categories)
        options = options.replace(callback=output)
    return _run_shown(lambda: job.work(options), output)


def _run_shown(run: Callable[[], Report], output: LiveOutput | None) -> tuple[Report, bool]:
    """Run a cell's work and leave what its live figure drew as a static record, however it ends: the report, and
    whether Ctrl-C stopped it. The interrupt is returned, its frames cleared, not raised from here: IPython keeps
    the traceback it sees, and this one holds the cell body's tensors (the caller raises :func:`stopped`). A
    MemlabError becomes the one-line UsageError."""
    try:
        report = run()
    except KeyboardInterrupt as interrupt:
        report = getattr(interrupt, "report", None) or (output.report if output is not None else Report([]))
        clear_chain(interrupt)
    except BaseException as error:
        if output is not None:  # what the figure had drawn stays, as a static record
            output.finish(output.report)
        if isinstance(error, MemlabError):
            raise usage_error(str(error)) from None
        raise
    else:
        if output is not None:
            output.finish(report, show=True)
            show_timelines(report)
        return report, False
    print(f"Interrupted: {len(report)} plan(s) were measured; the model is as it was.")
    if output is not None:
        output.finish(report)
    if len(report):
        display(report)
    return report, True


def show_timelines(report: Report) -> TimelineView | None:
    """Show the list of ``report``'s plans and the timeline of the one picked (the best, else the last) as a kept
    record; None where no trial has a timeline (a sharded estimate). Never raises: the run's result matters more.

    Example:
        >>> show_timelines(Report([])) is None
        True
    """
    try:
        trials = list(report.trials)
        best = report.best
        view = TimelineView(keep=True)
        view.update(trials, pick=next((i for i, trial in enumerate(trials) if trial is best), None))
        if view.record is None:
            return None
        view.display()
        OPEN_TIMELINES.append(view)
        return view
    except Exception as error:  # noqa: BLE001 - as LiveOutput.finish: a drawing problem never fails the cell
        import warnings

        warnings.warn(f"memlab could not show the timeline: {error}", RuntimeWarning, stacklevel=2)
        return None


def close_timelines(info: Any = None) -> None:
    """Close every open timeline list (what ``%load_ext memlab`` has IPython call before each cell runs): once the
    user moves on, each list is a line of text and its drawing stays as last picked, so the saved notebook holds no
    widget that a reload without the kernel would show as an error. Never raises.

    Example:
        >>> close_timelines(); OPEN_TIMELINES
        []
    """
    while OPEN_TIMELINES:
        view = OPEN_TIMELINES.pop()
        try:
            view.close()
        except Exception:  # noqa: BLE001, S110 - a front end gone away: nothing left to close
            pass


def clear_chain(error: BaseException) -> None:
    """Clear the frames of ``error``'s traceback and of those it was raised from or during: what they held is freed.

    Example:
        >>> try:
        ...     raise KeyboardInterrupt
        ... except KeyboardInterrupt as interrupt:
        ...     clear_chain(interrupt)
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)
        current.__traceback__ = None
        current = current.__cause__ or current.__context__


def stopped(report: Report) -> KeyboardInterrupt:
    """A fresh KeyboardInterrupt for a cell that Ctrl-C stopped: no traceback (so no frame of the run), the
    finished trials as ``.report`` (``sys.last_value.report`` in the notebook), shown by IPython as one line.

    Example:
        >>> stopped(Report([]))._render_traceback_()
        ['KeyboardInterrupt: %%memfit stopped after 0 plan(s); the model is as it was']
    """
    interrupt = KeyboardInterrupt()
    interrupt.report = report  # type: ignore[attr-defined]
    line = f"KeyboardInterrupt: %%memfit stopped after {len(report)} plan(s); the model is as it was"
    interrupt._render_traceback_ = lambda: [line]  # type: ignore[attr-defined]  # IPython's one-line hook
    return interrupt.with_traceback(None)
