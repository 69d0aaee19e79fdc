"""The progress bar of a run: which plan of how many runs now, its step, and about how long is left.

A tqdm bar, as everywhere in the Python world; memlab only feeds it. tqdm's own estimate of the time left appears
after the first plan has finished, which for a large model is minutes of silence, so the bar also listens to the
step events (:mod:`memlab.events`) and estimates from the first step on.

In a notebook tqdm draws the bar as a widget, which a saved notebook cannot show without the kernel that made it
(after a reload JupyterLab says "Error displaying widget: model not found"). So there the bar is shown with a
display id, and when the run ends its output becomes one line of text that says what the run did.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

from memlab.events import Event, StepFinished, TrialFinished, TrialStarted

__all__ = ["STEPS_PER_PLAN_GUESS", "RunProgress", "chain_callbacks", "run_progress"]

STEPS_PER_PLAN_GUESS = 6
"""Steps a plan is expected to take before one has finished (warm-up, tracked, timed), for the first estimate."""


class RunProgress:
    """Follows a run's events and keeps a tqdm bar's text current: ``plan 2 of 12: bf16, timed step 3, ~40 s left``.

    Args:
        total: how many plans the run has (a search: how many it may measure at most; ``at_most=True``).
        enabled: show the bar (a run of one plan never shows one).
        at_most: ``total`` is an upper bound (a search skips plans), so the time left is said as "at most".
        clock: seconds, for tests.

    Example:
        >>> from memlab.plan import Plan
        >>> seconds = iter([0.0, 0.0, 2.0])
        >>> progress = RunProgress(3, enabled=False, clock=lambda: next(seconds))
        >>> progress(TrialStarted(Plan(), 0, 3))
        >>> progress(StepFinished(Plan(), 0, 0, "warmup", 2.0, 1.0, None, None))
        >>> progress.text
        'plan 1 of 3: plain, warm-up step 1, about 34 s left'
    """

    def __init__(
        self, total: int, enabled: bool = True, *, at_most: bool = False, clock: Callable[[], float] = time.monotonic
    ) -> None:
        from tqdm.auto import tqdm

        notebook = any(cls.__module__ == "tqdm.notebook" for cls in tqdm.__mro__)
        self.total = total
        self.at_most = at_most
        self.clock = clock
        self.bar = tqdm(
            total=total, desc="memlab", unit="plan", disable=not enabled or total < 2, leave=False,
            bar_format="{desc} {n_fmt}/{total_fmt} |{bar}| {postfix}", **({"display": False} if notebook else {}),
        )
        self._handle: Any = None  # where a notebook shows the bar, so that its output can become text at the end
        if notebook and not self.bar.disable:
            from IPython.display import display

            self._handle = display(self.bar.container, display_id=True)
        self.text = ""
        self.settled = 0
        self._label = ""
        self._position = 0
        self._plan_started = self._started = self.clock()
        self._plan_seconds: list[float] = []
        self._first_step: float | None = None

    def __call__(self, event: Event) -> None:
        if isinstance(event, TrialStarted):
            self._label, self._position = event.plan.label(), len(self._plan_seconds) + 1
            self._plan_started = self.clock()
            self._show("starting")
        elif isinstance(event, StepFinished):
            if self._first_step is None:
                self._first_step = event.seconds
            kind = {"warmup": "warm-up step", "tracked": "memory step", "timed": "timed step"}[event.kind]
            self._show(f"{kind} {event.step + 1}")
        elif isinstance(event, TrialFinished):
            self._plan_seconds.append(self.clock() - self._plan_started)

    def advance(self, settled: int) -> None:
        """Move the bar to ``settled`` plans done (measured, or ruled out by a search)."""
        self.bar.update(settled - self.settled)
        self.settled = settled

    def say(self, text: str) -> None:
        """Show ``text`` as the bar's message (for what is not a plan, such as a final re-measurement)."""
        self.text = text
        self.bar.set_postfix_str(text)

    def seconds_left(self) -> float | None:
        """About how long the rest of the run takes: the mean plan so far, or before any plan has finished, the
        first step's time for every step a plan is expected to take; None before the first step."""
        if self._plan_seconds:
            per_plan = statistics.fmean(self._plan_seconds)
        elif self._first_step is not None:
            per_plan = self._first_step * STEPS_PER_PLAN_GUESS
        else:
            return None
        remaining = max(self.total - self.settled, 0)
        return max(per_plan * remaining - (self.clock() - self._plan_started), 0.0)

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
        count = len(self._plan_seconds)
        plans = f"{count} plan{'' if count == 1 else 's'}"
        doing = "stopped after measuring" if stopped else "measured"
        return f"memlab: {doing} {plans} in {_duration(self.clock() - self._started)}"

    def _show(self, doing: str) -> None:
        where = f"plan {self._position}" + (f" of {self.total}" if not self.at_most else "")
        if self._position > self.total:  # the close contenders, timed again after every plan has run
            where = "timing again in turn"
        text = f"{where}: {self._label}, {doing}"
        left = self.seconds_left()
        if left is not None:
            text += f", {'at most ' if self.at_most else ''}about {_duration(left)} left"
        self.say(text)


@contextlib.contextmanager
def run_progress(total: int, enabled: bool, *, at_most: bool = False) -> Iterator[RunProgress]:
    """A :class:`RunProgress` that is closed when the block ends, whatever happens in it.

    Example:
        >>> with run_progress(2, enabled=False) as progress:
        ...     progress.advance(1)
        >>> progress.settled
        1
    """
    progress = RunProgress(total, enabled, at_most=at_most)
    try:
        yield progress
    except BaseException:
        progress.close(stopped=True)
        raise
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


def _duration(seconds: float) -> str:
    """Seconds as a person says them: ``34 s``, ``3 min``, ``1.5 h``."""
    if seconds < 90:
        return f"{max(round(seconds), 1)} s"
    if seconds < 5400:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"
