"""The progress bar of a run: which plan of how many runs now, its step, and how long is left at most.

A tqdm bar, as everywhere in the Python world; memlab only feeds it, from the run's events (:mod:`memlab.events`).
The time left is an upper bound, or the bar says it does not know: a number that turns out wrong (a bar at "1 s
left" for minutes) is worse than none. The bound is the slowest run so far (a plan's warm-up, tracked and timed
steps) times the runs that may still come: the plans not yet measured or skipped, and the re-runs that timing a
close race again in turn may add after them (:mod:`memlab.runner.remeasure`: at most ``ROUNDS`` runs of each of
``MAX_CONTENDERS`` plans). Before any run has finished, once the running one has already taken longer than the
slowest before it, and in work that is not runs of plans (a search's suggestions, estimated on fake tensors), the
bar says "time left unknown" and shows the time elapsed.

In a notebook tqdm draws the bar as a widget, which a saved notebook cannot show without the kernel that made it
(after a reload JupyterLab says "Error displaying widget: model not found"). So there the bar is shown with a
display id, and when the run ends its output becomes one line of text that says what the run did.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

from memlab.events import Event, StepFinished, TrialFinished, TrialStarted
from memlab.runner.remeasure import MAX_CONTENDERS, ROUNDS

__all__ = ["UNKNOWN", "RunProgress", "chain_callbacks", "duration", "retiming_runs", "run_progress"]

UNKNOWN = "time left unknown"
"""What the bar says where it has no bound of the time left."""


def retiming_runs(plans: int) -> int:
    """At most how many runs timing a close race again in turn adds after ``plans`` plans.

    Example:
        >>> retiming_runs(2), retiming_runs(12)
        (6, 9)
    """
    return ROUNDS * min(MAX_CONTENDERS, plans) if plans > 1 else 0


class RunProgress:
    """Follows a run's events and keeps a tqdm bar's text current: ``plan 2 of 12: bf16, timed step 3, at most
    40 s left``.

    Args:
        total: how many plans the run has (a search: how many it may measure at most; ``at_most=True``).
        enabled: show the bar (a run of one plan never shows one).
        at_most: ``total`` is an upper bound (a search skips plans): the bar does not say "of total".
        then: at most how many runs may follow the plans (re-runs of a close race, :func:`retiming_runs`).
        clock: seconds, for tests.

    Example:
        >>> from memlab.plan import Plan
        >>> from memlab.report import Trial
        >>> now = [0.0]
        >>> progress = RunProgress(3, enabled=False, clock=lambda: now[0])
        >>> progress(TrialStarted(Plan(), 0, 3))
        >>> now[0] = 2.0; progress(StepFinished(Plan(), 0, 0, "warmup", 2.0, 1.0, None, None))
        >>> progress.text
        'plan 1 of 3: plain, warm-up step 1, time left unknown'
        >>> now[0] = 5.0; progress(TrialFinished(Trial(Plan(), "ok", 1, {}, 1.0, 1.0, None, "cpu"), 0, 3))
        >>> progress.advance(1); progress(TrialStarted(Plan(checkpointing=True), 1, 3))
        >>> progress.text
        'plan 2 of 3: ckpt, starting, at most 10 s left'
    """

    def __init__(
        self,
        total: int,
        enabled: bool = True,
        *,
        at_most: bool = False,
        then: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        from tqdm.auto import tqdm

        notebook = any(cls.__module__ == "tqdm.notebook" for cls in tqdm.__mro__)
        self.total = total
        self.at_most = at_most
        self.then = then
        self.clock = clock
        # Piped to a log (no terminal, no notebook) a bar is only carriage returns: none is drawn there.
        animated = notebook or _on_a_terminal()
        self.bar = tqdm(
            total=total, desc="memlab", unit="plan", disable=not enabled or total < 2 or not animated, leave=False,
            bar_format="{desc} {n_fmt}/{total_fmt} |{bar}| {elapsed} {postfix}",
            **({"display": False} if notebook else {}),
        )
        self._handle: Any = None  # where a notebook shows the bar, so that its output can become text at the end
        if notebook and not self.bar.disable:
            from IPython.display import display

            self._handle = display(self.bar.container, display_id=True)
        self.text = ""
        self.settled = 0
        self._label = ""
        self._position = 0
        self._started: float | None = None  # when the running run began; None between runs
        self._runs: list[float] = []  # seconds of every finished run, re-runs included
        self._reruns_started = 0  # runs begun after every plan was settled: a close race timed again
        self._unbounded = False
        self._begun = self.clock()  # when the whole run began (the summary's time)

    def __call__(self, event: Event) -> None:
        if isinstance(event, TrialStarted):
            self._label = event.plan.label()
            if self.settled >= self.total:
                self._reruns_started += 1
            else:
                self._position = self.settled + 1
            self._started = self.clock()
            self._show("starting")
        elif isinstance(event, StepFinished):
            kind = {"warmup": "warm-up step", "tracked": "memory step", "timed": "timed step"}[event.kind]
            self._show(f"{kind} {event.step + 1}")
        elif isinstance(event, TrialFinished) and self._started is not None:
            self._runs.append(self.clock() - self._started)
            self._started = None

    def advance(self, settled: int) -> None:
        """Move the bar to ``settled`` plans done (measured, or ruled out by a search)."""
        self.bar.update(settled - self.settled)
        self.settled = settled

    def say(self, text: str) -> None:
        """Show ``text`` as the bar's message (for what is not a step, such as the start of a re-measurement)."""
        self.text = text
        self.bar.set_postfix_str(text)

    def unbounded(self, doing: str) -> None:
        """From now on the work is not runs of plans (``doing`` says what it is): the time left is unknown.

        Example:
            >>> progress = RunProgress(2, enabled=False)
            >>> progress.unbounded("estimating plans outside the searched space"); progress.text
            'estimating plans outside the searched space, time left unknown'
        """
        self._unbounded = True
        self.say(f"{doing}, {UNKNOWN}")

    def seconds_left(self) -> float | None:
        """At most how long the rest of the run takes: the slowest finished run times the runs that may still come,
        less what the running one has taken; None where no bound is known (see the module docstring)."""
        if self._unbounded or not self._runs:
            return None
        slowest = max(self._runs)
        running = 0.0 if self._started is None else self.clock() - self._started
        if running > slowest:
            return None  # slower than any run before it: nothing bounds it
        if self.settled < self.total:
            runs_left = self.total - self.settled + self.then
        else:
            runs_left = self.then - self._reruns_started + (1 if self._started is not None else 0)
            if runs_left <= 0 and self._started is not None:
                return None  # more re-runs than expected
        return max(slowest * max(runs_left, 0) - running, 0.0)

    def close(self, *, stopped: bool = False) -> None:
        """Close the bar; in a notebook its output becomes one line (:meth:`summary`), which needs no kernel."""
        self.bar.close()
        if self._handle is not None:
            self._handle.update({"text/plain": self.summary(stopped=stopped)}, raw=True)
            self.bar.container.close()  # tqdm leaves the widget of an unfinished bar open
            self._handle = None

    def summary(self, *, stopped: bool = False) -> str:
        """What the run did, in one line: ``memlab: measured 4 plans in 12 s`` (``stopped after ...`` on an error
        or a Ctrl-C).

        Example:
            >>> from memlab.plan import Plan
            >>> seconds = iter([0.0, 0.0, 3.0, 40.0])
            >>> progress = RunProgress(3, enabled=False, clock=lambda: next(seconds))
            >>> progress(TrialStarted(Plan(), 0, 3)); progress(TrialFinished(None, 0, 3))
            >>> progress.summary()
            'memlab: measured 1 plan in 40 s'
        """
        count = len(self._runs) - min(self._reruns_started, len(self._runs))
        plans = f"{count} plan{'' if count == 1 else 's'}"
        doing = "stopped after measuring" if stopped else "measured"
        return f"memlab: {doing} {plans} in {duration(self.clock() - self._begun)}"

    def _show(self, doing: str) -> None:
        if self.settled >= self.total and self._reruns_started:
            where = "timing again in turn"  # the close contenders, after every plan has run
        else:
            where = f"plan {self._position}" + (f" of {self.total}" if not self.at_most else "")
        left = self.seconds_left()
        told = UNKNOWN if left is None else f"at most {duration(left)} left"
        self.say(f"{where}: {self._label}, {doing}, {told}")


@contextlib.contextmanager
def run_progress(
    total: int, enabled: bool, *, at_most: bool = False, then: int = 0, keep_open: bool = False
) -> Iterator[RunProgress]:
    """A :class:`RunProgress` that is closed when the block ends, whatever happens in it; with ``keep_open`` only
    when the block raises (the caller goes on with it and closes it). ``then``: at most how many re-runs may follow
    the plans (:func:`retiming_runs`).

    Example:
        >>> with run_progress(2, enabled=False) as progress:
        ...     progress.advance(1)
        >>> progress.settled
        1
    """
    progress = RunProgress(total, enabled, at_most=at_most, then=then)
    try:
        yield progress
    except BaseException:
        progress.close(stopped=True)
        raise
    if not keep_open:
        progress.close()


def chain_callbacks(*callbacks: Callable[[Event], Any] | None) -> Callable[[Event], None]:
    """One callback that hands each event to every given callback in turn (None entries are left out).

    Example:
        >>> seen = []
        >>> chain_callbacks(seen.append, None, seen.append)("event")
        >>> seen
        ['event', 'event']
    """
    present = [callback for callback in callbacks if callback is not None]

    def call_each(event: Event) -> None:
        for callback in present:
            callback(event)

    return call_each


def duration(seconds: float) -> str:
    """Seconds as a person says them, rounded up (the time left is a bound): ``34 s``, ``3 min``, ``1.5 h``.

    Example:
        >>> duration(0.2), duration(33.1), duration(151), duration(5401)
        ('1 s', '34 s', '3 min', '1.6 h')
    """
    if seconds < 90:
        return f"{max(math.ceil(seconds), 1)} s"
    if seconds < 5400:
        return f"{math.ceil(seconds / 60)} min"
    return f"{math.ceil(seconds / 360) / 10:.1f} h"


def _on_a_terminal() -> bool:
    """Whether tqdm's stream (stderr) is a terminal, where a bar redraws in place."""
    import sys

    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())
