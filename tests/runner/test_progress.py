"""The progress bar's time left, on a fake clock: an upper bound of what is really left, or "time left unknown"."""

from __future__ import annotations

import re
from typing import Any

import pytest

from memlab.events import StepFinished, TrialFinished, TrialStarted
from memlab.plan import Plan
from memlab.report import Trial
from memlab.runner.progress import UNKNOWN, RunProgress, duration, retiming_runs


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _finished(plan: Plan, index: int, total: int) -> TrialFinished:
    return TrialFinished(Trial(plan, "ok", 1, {}, 0.1, 10.0, None, "cpu"), index, total)


def _said_seconds(text: str) -> float | None:
    """The bound a bar's text states, in seconds (the upper end of its rounding); None for "unknown"."""
    if UNKNOWN in text:
        return None
    match = re.search(r"at most ([0-9.]+) (s|min|h) left", text)
    assert match, text
    return float(match.group(1)) * {"s": 1, "min": 60, "h": 3600}[match.group(2)]


def _run(progress: RunProgress, clock: Clock, plan: Plan, index: int, total: int, seconds: float,
         said: list[tuple[float, str]], steps: int = 4) -> None:
    """One run of ``seconds``: its start, ``steps`` steps, its end; each text the bar shows, with when."""
    progress(TrialStarted(plan, index, total))
    said.append((clock.now, progress.text))
    for step in range(steps):
        clock.now += seconds / steps
        progress(StepFinished(plan, index, step, "timed", seconds / steps, 1.0, None, None))
        said.append((clock.now, progress.text))
    progress(_finished(plan, index, total))


def test_nothing_is_said_of_the_time_left_before_a_run_has_finished() -> None:
    clock = Clock()
    progress = RunProgress(5, enabled=False, clock=clock)
    progress(TrialStarted(Plan(), 0, 5))
    clock.now = 30.0
    progress(StepFinished(Plan(), 0, 0, "warmup", 30.0, 1.0, None, None))
    assert progress.seconds_left() is None
    assert progress.text == f"plan 1 of 5: plain, warm-up step 1, {UNKNOWN}"


def test_after_the_last_plan_the_re_runs_of_a_close_race_are_still_counted() -> None:
    # The issue: "12/12 ... at most about 1 s left" for 3.5 minutes while the close race was timed again.
    clock, said = Clock(), []
    total = 12
    progress = RunProgress(total, enabled=False, at_most=True, then=retiming_runs(total), clock=clock)
    plans = [Plan(micro_batch=8 // 2 ** (i % 3) or 1, checkpointing=i % 2 == 0) for i in range(total)]
    for index, plan in enumerate(plans):
        _run(progress, clock, plan, index, total, 10.0, said)
        progress.advance(index + 1)
    assert progress.settled == total
    end_of_plans = clock.now
    for _ in range(3):  # three contenders, three rounds: 90 s more
        for index in (0, 1, 2):
            _run(progress, clock, plans[index], index, total, 10.0, said)
    end = clock.now
    assert end - end_of_plans == 90.0
    for when, text in said:
        bound = _said_seconds(text)
        assert bound is None or bound >= end - when, (when, text)
    re_runs = [(when, text) for when, text in said if text.startswith("timing again in turn: ")]
    assert len(re_runs) == 9 * 5 and re_runs[0][0] == end_of_plans
    assert re_runs[0][1].endswith("starting, at most 2 min left")  # nine re-runs of at most 10 s each: 90 s


def test_a_run_slower_than_every_one_before_it_makes_the_time_left_unknown() -> None:
    clock = Clock()
    progress = RunProgress(3, enabled=False, clock=clock)
    _run(progress, clock, Plan(), 0, 3, 10.0, [])
    progress.advance(1)
    progress(TrialStarted(Plan(checkpointing=True), 1, 3))
    clock.now += 9.0
    assert progress.seconds_left() == pytest.approx(11.0)  # two plans of at most 10 s, 9 s of one spent
    clock.now += 2.0  # 11 s: slower than any plan before it, so nothing bounds it
    progress(StepFinished(Plan(checkpointing=True), 1, 0, "timed", 11.0, 1.0, None, None))
    assert progress.seconds_left() is None and progress.text.endswith(UNKNOWN)
    progress(_finished(Plan(checkpointing=True), 1, 3))
    progress.advance(2)
    assert progress.seconds_left() == pytest.approx(11.0)  # the new slowest bounds the last plan


def test_work_that_is_not_a_run_of_plans_says_it_does_not_know() -> None:
    clock = Clock()
    progress = RunProgress(2, enabled=False, at_most=True, then=retiming_runs(2), clock=clock)
    for index in range(2):
        _run(progress, clock, Plan(), index, 2, 5.0, [])
        progress.advance(index + 1)
    progress.unbounded("estimating plans outside the searched space")
    assert progress.seconds_left() is None
    assert progress.text == f"estimating plans outside the searched space, {UNKNOWN}"


def test_no_re_runs_are_counted_when_the_race_is_not_settled() -> None:
    clock = Clock()
    progress = RunProgress(2, enabled=False, then=0, clock=clock)
    _run(progress, clock, Plan(), 0, 2, 4.0, [])
    progress.advance(1)
    assert progress.seconds_left() == pytest.approx(4.0)
    assert retiming_runs(1) == 0 and retiming_runs(2) == 6 and retiming_runs(40) == 9


@pytest.mark.parametrize(("seconds", "said"), [(0.0, "1 s"), (1.01, "2 s"), (89.5, "90 s"), (90.0, "2 min"),
                                               (121.0, "3 min"), (5400.0, "1.5 h"), (5401.0, "1.6 h")])
def test_durations_are_rounded_up(seconds: float, said: str) -> None:
    assert duration(seconds) == said


def test_no_bar_is_animated_into_a_log(monkeypatch: Any) -> None:
    """Piped to a log, stderr is no terminal: no bar, so no carriage-return updates (issue 48); on one, a bar."""
    import io
    import sys

    from memlab.runner.progress import RunProgress

    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    progress = RunProgress(3)
    assert progress.bar.disable
    progress.close()
    assert "\r" not in log.getvalue()

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())
    progress = RunProgress(3)
    assert not progress.bar.disable
    progress.close()
