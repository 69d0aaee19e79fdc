"""What every figure marks on each plan, as the table says it: its verdict, and why the best plan is best.

The table's status column (:func:`memlab.report.views.tables.status_text`) and every figure (Report.plot, the live
figure, the static SVG, the HTML report) read the same :func:`verdicts`, so a plan over the budget never looks like
one that fits, and the same :func:`best_marks` / :func:`best_caption`, so the best plan and its ties are marked on
the bars with the reason beside them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # reads a Report's trials and verdicts; imports nothing of the report at run time
    from memlab.report.data import Report

__all__ = ["FITS", "OUT_OF_MEMORY", "OVER_BUDGET", "ERROR", "MARK_WORDS", "NARROW_MARKS", "VERDICT_WORDS", "bar_marks",
           "best_caption", "best_marks", "staggered_marks", "verdict_words", "verdicts"]

FITS, OVER_BUDGET, OUT_OF_MEMORY, ERROR = "fits", "over budget", "out of memory", "error"
VERDICT_WORDS = {
    FITS: "fits",
    OVER_BUDGET: "does not fit (over budget)",
    OUT_OF_MEMORY: "does not fit (out of memory)",
    ERROR: "error",
}
"""Each verdict as a figure's legend and hover say it."""

MARK_WORDS = {"best": "best", "tie": "tie", OVER_BUDGET: "over<br>budget"}
"""What a plotly figure writes above a throughput bar (``<br>`` breaks a line), where the bar is wide enough."""
NARROW_MARKS = {"best": "\u2605", "tie": "=", OVER_BUDGET: "\u00d7"}
"""The signs written where a bar is too narrow for its word (the hover, and the SVG's tooltip, say it)."""


def verdicts(report: Report) -> list[str]:
    """Each trial's verdict, in order: :data:`FITS`, :data:`OVER_BUDGET` (it ran, but its verdict figure is over
    the budget), :data:`OUT_OF_MEMORY` or :data:`ERROR`; the table's status column says the same.

    Example:
        >>> from memlab.plan import Plan
        >>> from memlab.report.data import Report, Trial
        >>> small = Trial(Plan(), "ok", 500, {}, 0.5, 8.0, None, "cpu")
        >>> large = Trial(Plan(micro_batch=4), "ok", 900, {}, 0.4, 10.0, None, "cpu")
        >>> oom = Trial(Plan(micro_batch=8), "oom", 900, {}, None, None, None, "cpu")
        >>> verdicts(Report([small, large, oom], budget=800))
        ['fits', 'over budget', 'out of memory']
    """
    words = []
    for trial in report.trials:
        if trial.status == "oom":
            words.append(OUT_OF_MEMORY)
        elif trial.status == "error":
            words.append(ERROR)
        else:
            words.append(FITS if report.fits(trial) else OVER_BUDGET)
    return words


def verdict_words(report: Report) -> list[str]:
    """Each trial's verdict as a figure's hover says it (:data:`VERDICT_WORDS`), a plan that misses its host budget
    ``"does not fit (host)"`` (or ``"(over budget and host)"``: drawn as over the budget), as the table's status column
    says.

    Example:
        >>> from memlab.plan import Plan
        >>> from memlab.report.data import Report, Trial
        >>> host = Trial(Plan(offload="all"), "ok", 5, {}, 0.5, 8.0, None, "cuda", host_bytes=9, host_budget=8)
        >>> verdicts(Report([host])), verdict_words(Report([host]))
        (['over budget'], ['does not fit (host)'])
    """
    from memlab.report.format import over_words

    return [f"does not fit ({over_words(trial)})" if word == OVER_BUDGET else VERDICT_WORDS[word]
            for word, trial in zip(verdicts(report), report.trials, strict=True)]


def best_marks(report: Report) -> list[str]:
    """``"best"`` on the best trial, ``"tie"`` on those as fast within noise (:attr:`Report.ties`), ``""``
    elsewhere: what the figures write on the bars (:func:`best_caption`'s example has a tie).

    Example:
        >>> from memlab.plan import Plan
        >>> from memlab.report.data import Report, Trial
        >>> best_marks(Report([Trial(Plan(), "ok", 900, {}, 0.5, 16.0, None, "cpu"),
        ...                    Trial(Plan(checkpointing=True), "error", 0, {}, None, None, None, "cpu")]))
        ['best', '']
    """
    best, ties = report.best, report.ties
    return ["best" if trial is best else "tie" if any(trial is tie for tie in ties) else "" for trial in report.trials]


def best_caption(report: Report) -> str | None:
    """Why the best plan is best, in a few words (None when nothing fits): the caption a figure shows and the
    hover of its bar.

    Example:
        >>> from memlab.plan import Plan
        >>> from memlab.report.data import Report, Trial
        >>> a = Trial(Plan(), "ok", 900, {}, 0.5, 16.0, None, "cpu", rows_per_step=8, step_times=(0.4, 0.6))
        >>> b = Trial(Plan(checkpointing=True), "ok", 500, {}, 0.55, 14.5, None, "cpu", rows_per_step=8,
        ...           step_times=(0.5, 0.6))
        >>> best_marks(Report([a, b])), best_caption(Report([a, b]))
        (['tie', 'best'], 'best: ckpt, as fast as plain within noise and a lower peak')
        >>> best_caption(Report([Trial(Plan(), "ok", 9, {}, None, None, None, "cuda", estimated=True)]))
        'best: plain, lowest peak among plans that fit (nothing was timed)'
    """
    best = report.best
    if best is None:
        return None
    from memlab.report.views.plan_axis import run_labels  # torch-free, and nothing of the report's

    names = {id(trial): name for trial, name in zip(report.trials, run_labels([t.label for t in report.trials]),
                                                    strict=True)}
    best_name = names.get(id(best), best.label)
    if best.samples_per_s is None:
        return f"best: {best_name}, lowest peak among plans that fit (nothing was timed)"
    ties = report.ties
    if not ties:
        return f"best: {best_name}, fastest that fits"
    named = [names.get(id(trial), trial.label) for trial in ties[:3]]
    if len(ties) == 1:
        return f"best: {best_name}, as fast as {named[0]} within noise and a lower peak"
    listed = ", ".join(named[:-1]) + f" and {named[-1]}" if len(ties) <= 3 else ", ".join(named) + \
        f" and {len(ties) - 3} more"
    return f"best: {best_name}, as fast as {listed} within noise and the lowest peak of them"


def bar_marks(
    marks: list[str], over: list[bool], slot_px: float, font_px: float, *, numbered: bool = False
) -> list[str]:
    """What each throughput bar says above it, readable at ``font_px``: its word (:data:`MARK_WORDS`: best, tie,
    over budget) where the widest line of it fits the bar's ``slot_px`` (its share of the axis), else its sign
    (:data:`NARROW_MARKS`); nothing on a plan that fits with no mark, nor on one over the budget where the bars are
    numbered (dozens of plans: its grey hatch says it). ``marks`` are :func:`best_marks`'s; ``over``: the plans
    over the budget. Widths are estimated generously (0.6 font sizes a character).

    Example:
        >>> bar_marks(["", "best", "tie"], [True, False, False], slot_px=80, font_px=12)
        ['over<br>budget', 'best', 'tie']
        >>> bar_marks(["", "best", "tie"], [True, False, False], slot_px=20, font_px=12)
        ['\u00d7', '\u2605', '=']
    """
    words = []
    for mark, is_over in zip(marks, over, strict=True):
        key = mark or (OVER_BUDGET if is_over and not numbered else "")
        if not key:
            words.append("")
            continue
        word = MARK_WORDS[key]
        widest = max(len(line) for line in word.split("<br>")) * 0.6 * font_px
        words.append(word if widest <= slot_px else NARROW_MARKS[key])
    return words


def staggered_marks(words: list[str], shown: list[int], slot_px: float, font_px: float) -> list[str]:
    """The ``shown`` words, every other one of a run of neighbours too wide for their bars' slots raised by a line
    (a last line of a no-break space: a text point's lines end at its point), so two neighbours' words or signs
    never overlap. Widths are estimated generously: 0.6 font sizes a character of a word, a font size a sign.

    Example:
        >>> staggered_marks(["=", "\u2605", "", "="], [0, 1, 3], slot_px=4.0, font_px=12)
        ['=', '\u2605<br>\u00a0', '=']
    """
    def width(word: str) -> float:
        return max(len(line) for line in word.split("<br>")) * font_px * (0.6 if len(word) > 1 else 1.0)

    texts: list[str] = []
    raised = False
    for n, i in enumerate(shown):
        near = n > 0 and shown[n - 1] == i - 1 and 2 * slot_px < width(words[i]) + width(words[i - 1])
        raised = near and not raised
        texts.append(words[i] + "<br>\u00a0" if raised else words[i])
    return texts
