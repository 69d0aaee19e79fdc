"""Issue 61 (items 1 and 7) in a real browser (JupyterLab in headless Chromium, a 1400 px window): no text of a
plotly figure is drawn over another, nor the words above the throughput bars under their error bars' whiskers.

The faces: ``Report.plot()`` and the live figure (the panel's and ``%%memfit``'s) of plans timed several times, so
that each speed has its 95% interval drawn as an error bar, with a best, a tie and a plan over the budget; and
``trial.timeline.plot()`` of one plan (its title once, none over the legend, the phases named in the legend) and
``report.plot(kind="timeline")`` of two. Screenshots: ``tests/artifacts/labels-*.png`` (report, live, timeline,
timelines).
"""

from __future__ import annotations

from typing import Any

import pytest
from browser_lab import ARTIFACTS, DRAW_TIMEOUT_MS, GLYPHS_OVERLAP, Server, _open_notebook, _run_until_done

# One xdist group with the other browser tests: they share the worker's JupyterLab and Chromium (tests/conftest.py).
pytestmark = pytest.mark.browser

SETUP = """\
import memlab
from memlab import Plan, Report, Trial
from models import lm_batch, tiny_gpt2
MIB = 2**20

def timed(plan, peak_mib, speed, spread):
    step = 8 / speed
    times = (step * (1 - spread), step, step * (1 + spread), step * (1 - spread / 2), step * (1 + spread / 2))
    parts = {"params": peak_mib * MIB // 2, "activations": peak_mib * MIB - peak_mib * MIB // 2}
    return Trial(plan, "ok", peak_mib * MIB, parts, step, speed, None, "cpu", rows_per_step=8, step_times=times)

# wide intervals: whiskers long enough to reach through a word written at the bar's top
report = Report([timed(Plan(micro_batch=8), 900, 30.0, 0.3), timed(Plan(checkpointing=True), 300, 10.0, 0.25),
                 timed(Plan(precision="bf16"), 400, 10.2, 0.25), timed(Plan(loss="chunked"), 350, 4.0, 0.1)],
                budget=512 * MIB)
assert report.best.label == "ckpt" and [t.label for t in report.ties] == ["bf16"]"""
REPORT = "report.plot()"
LIVE = """\
from memlab.frontends.jupyter.live import LiveFigure
live = LiveFigure(budget=report.budget)  # the figure the panel and %%memfit draw
live.show_report(report)
live.widget"""
TIMELINE = """\
model, batch = tiny_gpt2(), lm_batch(rows=4, length=8)
trial = memlab.measure(model, batch, Plan(), steps=1, noise=0)
trial.timeline.plot()"""
TIMELINES = "memlab.compare(model, batch, [Plan(), Plan(checkpointing=True)], steps=1, noise=0).plot(kind='timeline')"
CELLS = (SETUP, REPORT, LIVE, TIMELINE, TIMELINES)
PHASES = ("forward", "backward", "optimizer step")
CONTENTS = "elements => elements.map(element => element.textContent)"
TEXTS = ".annotation-text, .g-xtitle text, .g-ytitle text, .legendtext, .textpoint"

# The words above a throughput panel's bars (best, tie, over budget) and the whiskers of its error bars, in page
# pixels; the pairs of a word and a whisker that touch.
UNDER_WHISKERS = """plot => {
    const words = [...plot.querySelectorAll(".subplot.xy .bartext, .subplot.xy .textpoint text")]
        .filter(text => text.textContent.trim());
    const whiskers = [...plot.querySelectorAll(".subplot.xy .errorbar path")]
        .map(path => path.getBoundingClientRect()).filter(box => box.height > 0.5);
    const touching = [];
    for (const word of words) {
        const a = word.getBoundingClientRect();
        for (const b of whiskers) {
            if (a.left < b.right && b.left < a.right && a.top < b.bottom - 0.5 && b.top < a.bottom - 0.5) {
                touching.push([word.textContent, Math.round(a.top), Math.round(a.bottom), Math.round(b.top)]);
            }
        }
    }
    return {words: words.map(word => word.textContent), whiskers: whiskers.length, touching};
}"""


def _texts_apart(name: str, plot: Any) -> list[Any]:
    """Pairs of texts of the figure (titles, subplot titles, the legend, axis titles, the words on bars) that
    overlap (the ticks left out: the two axes' zeros meet at the origin)."""
    texts = plot.locator(f"{TEXTS}, .gtitle, .bartext, .legendtitletext")
    assert plot.locator(".gtitle, .annotation-text").count() >= 1, name
    overlaps = texts.evaluate_all(GLYPHS_OVERLAP)
    return [(name, "texts overlap", overlaps)] if overlaps else []


def _words_above_whiskers(name: str, plot: Any) -> list[Any]:
    drawn = plot.evaluate(UNDER_WHISKERS)
    assert {"best", "tie"} <= set(drawn["words"]) and drawn["whiskers"] >= 3, (name, drawn)
    return [(name, "words under whiskers", drawn["touching"])] if drawn["touching"] else []


@pytest.mark.timeout(600)
def test_no_text_is_drawn_over_a_legend_a_title_or_a_whisker(lab: Server, chromium: Any) -> None:
    url, _ = lab.open("labels.ipynb", CELLS)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page = chromium.new_page(viewport={"width": 1400, "height": 2000})
    try:
        _open_notebook(page, url)
        _run_until_done(page, "notebook:run-all-cells", len(CELLS), 400)
        cells = page.locator(".jp-Notebook .jp-Cell")
        problems: list[Any] = []
        for index in range(len(CELLS)):
            text = cells.nth(index).locator(".jp-OutputArea").inner_text()
            assert "Traceback" not in text and "Error displaying" not in text, (index, text[-2000:])
        for index, name in ((1, "report"), (2, "live"), (3, "timeline"), (4, "timelines")):
            cell = cells.nth(index)
            plot = cell.locator(".js-plotly-plot").first
            plot.locator(".gtitle, .annotation-text").first.wait_for(state="attached", timeout=DRAW_TIMEOUT_MS)
            page.wait_for_timeout(500)  # plotly's second layout pass (automargin) settles
            cell.scroll_into_view_if_needed()
            cell.screenshot(path=str(ARTIFACTS / f"labels-{name}.png"))
            problems += _texts_apart(name, plot)
            if name in ("report", "live"):
                problems += _words_above_whiskers(name, plot)
            else:
                legend = plot.locator(".legendtext").evaluate_all(CONTENTS)
                # the phases' shades named in the legend, beside the categories, in the order they come
                if [words for words in legend if words in PHASES] != list(PHASES):
                    problems.append((name, "phases not in the legend", legend))
        # one plan's timeline: its peak said once, as the figure's title
        titles = cells.nth(3).locator(".gtitle, .annotation-text").evaluate_all(CONTENTS)
        if len([title for title in titles if "peak" in title]) != 1:
            problems.append(("timeline", "its title not once", titles))
        assert problems == []
    finally:
        page.close()
        lab.shut_down_kernels()
