"""Issue 48 in a real browser (JupyterLab in headless Chromium, a 1400 px window): every face of a run marks each
plan's verdict as its table prints it, shows in its legend only what it draws, clips no title and scrolls no
sideways. The faces: a ``%%memfit`` record, ``Report.plot()``, the HTML report (``memlab demo``'s), the panel
(before and after a reload) and ``memlab.watch``'s figure (its record, and its live figure's axes).

One notebook, one kernel, the tiny GPT-2 of ``tests/models.py`` (``noise=0``, one step). The budget lies between
the plain plan's peak and checkpointing's, so that one plan does not fit and one does: a run capped by it (the magic,
the panel) stops the plain plan as out of memory; the report of the two measured without a cap, judged against it,
has the plain plan over the budget. A long note (as ``fit`` writes) on one row checks that rows stay short; a
table of 13 searched plans, every column shown and a short note with a long word (as ``fit``'s selective
checkpointing row has), that the widest table a search makes fits the window. Screenshots:
``tests/artifacts/verdicts-*.png`` (memfit, report, html-report, panel, panel-reloaded, watch-record, watch,
wide-table). The watch's live figure keeps its labels apart too (its step axis starts at the first step, not at 0).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from browser_lab import (
    ARTIFACTS,
    CHECKPOINTING_BOX,
    DRAW_TIMEOUT_MS,
    GLYPHS_OVERLAP,
    PLOTLY_TEXTS,
    RUN_TIMEOUT_MS,
    TABLES_OUTSIDE,
    Server,
    _open_notebook,
    _run_until_done,
    _save,
)
from browser_reload import _reload_until_drawn

# One xdist group with the other browser tests: they share the worker's JupyterLab and Chromium (tests/conftest.py).
pytestmark = pytest.mark.browser

SETUP = """\
%load_ext memlab
import memlab
from models import lm_batch, tiny_gpt2
model, batch = tiny_gpt2(), lm_batch(rows=8, length=32)  # checkpointing saves 40% of the peak
free = memlab.compare(model, batch, [memlab.Plan(), memlab.Plan(checkpointing=True)], steps=1, noise=0)
plain, ckpt = free.trials
budget_kib = (plain.peak_bytes + ckpt.peak_bytes) // 2 // 1024  # between the two: one fits, one does not
budget = budget_kib * 1024
import dataclasses
note = "timed again in turn with mb4x2 ckpt, mb2x4 chunked-loss (3 rounds): close in speed when first measured"
trials = [free.trials[0], dataclasses.replace(ckpt, notes=(*ckpt.notes, note))]  # a note as long as fit's
report = memlab.Report(trials, budget=budget)  # measured without a cap, judged against the budget
assert [report.fits(trial) for trial in report.trials] == [False, True], (plain.peak_bytes, ckpt.peak_bytes)"""
MEMFIT = "%%memfit model batch --try checkpointing=off,on --budget {budget_kib}KiB --steps 1 --noise 0"
REPORT = "display(report)\nreport.plot()"
HTML = (
    "from memlab.frontends.cli.main import write_html_report\n"
    "write_html_report(report, 'report.html', title='memlab demo');"
)
PANEL = "p = memlab.panel(model, batch, steps=1, noise=0, budget=budget)\np"
WATCH = """\
import tempfile
from trainers import make_trainer
trainer = make_trainer(tempfile.mkdtemp(), steps=3, logging_steps=1)
watched = memlab.watch(trainer, budget=200 * 1024)  # under its steps' peak: over the budget
trainer.train()
watched.remove()"""
WATCH_LIVE = """\
import plotly.graph_objects as go
from memlab.frontends.jupyter.watch_figure import steps_figure
from memlab.report.views.svg.steps import step_series

go.FigureWidget(steps_figure(step_series(watched.steps, watched.budget)))  # the figure watch shows while it runs"""
WIDE = """\
from reports import report_of  # 13 plans as fit measures them: numbered, timed, some over the budget or out of memory
searched = report_of(13).trials
wide = memlab.Report([dataclasses.replace(trial, tokens_per_s=trial.samples_per_s and 512 * trial.samples_per_s,
                                          notes=("checkpointing 1 of 2 blocks (block 0)",) if number == 12 else ())
                      for number, trial in enumerate(searched)], budget=report_of(13).budget)
wide  # every column a search's table has, and a short note with a long word (fit's selective checkpointing row)"""
CELLS = (SETUP, MEMFIT, REPORT, HTML, PANEL, WATCH, WATCH_LIVE, WIDE)
MEMFIT_CELL, REPORT_CELL, PANEL_CELL, WATCH_CELL, WATCH_LIVE_CELL, WIDE_CELL = 1, 2, 4, 5, 6, 7

FITS, OVER_BUDGET, OUT_OF_MEMORY, ERROR = "fits", "over budget", "out of memory", "error"
STATUS_VERDICTS = {
    "ok": FITS,
    "ok (estimate)": FITS,
    "does not fit (over budget)": OVER_BUDGET,
    "does not fit (OOM)": OUT_OF_MEMORY,
    "error": ERROR,
}
GREY = "rgb(127, 127, 127)"  # DOES_NOT_FIT_COLOR, as the browser reports it

# The table of a face, as a person reads it: each row's plan (its best or tie mark cut off) and status.
TABLE = """root => {
    const table = root.querySelector("table");
    if (!table) return null;
    const names = [...table.querySelectorAll("thead th")].map(th => th.textContent.trim());
    const plan = names.indexOf("plan"), status = names.indexOf("status");
    return [...table.querySelectorAll("tbody tr")].map(row => {
        const cells = [...row.querySelectorAll("td")].map(td => td.textContent.trim());
        return [cells[plan], cells[status], Math.round(row.getBoundingClientRect().height)];
    });
}"""

# A plotly figure's verdict per plan, read from what it draws: the throughput panel's bar at the plan's tick (its
# fill, a pattern's ground colour where it is hatched, the word on it), else the memory panel's hatched grey bar (out
# of memory), else an error cross.
PLOTLY_VERDICTS = """plot => {
    const middle = element => { const box = element.getBoundingClientRect(); return box.left + box.width / 2; };
    const paint = path => {
        const fill = path.getAttribute("style") || "";
        const url = fill.match(/fill: url\\(["']?#([^"')]+)/);
        if (!url) return {hatched: false, colour: getComputedStyle(path).fill};
        const pattern = document.getElementById(url[1]);
        const ground = pattern && pattern.querySelector("rect");
        return {hatched: true, colour: ground ? getComputedStyle(ground).fill : ""};
    };
    const bars = subplot => [...plot.querySelectorAll(`.subplot.${subplot} .barlayer .point path`)]
        .filter(path => path.getBoundingClientRect().height > 0.5)
        .map(path => ({x: middle(path), ...paint(path)}));
    const words = [...plot.querySelectorAll(".subplot.xy .bartext, .subplot.xy .textpoint text")]
        .map(text => [middle(text), text.textContent]);
    const speed = bars("xy"), memory = bars("x2y2");
    const crosses = [...plot.querySelectorAll(".subplot.x2y2 .scatterlayer .point")].map(middle);
    const ticks = selector => [...plot.querySelectorAll(selector)].map(text => [text.textContent, middle(text)]);
    const memoryTicks = Object.fromEntries(ticks(".x2tick text"));
    return ticks(".xtick text").map(([label, x]) => {
        const near = (items, at) => items.filter(item => Math.abs((item.x ?? item[0] ?? item) - at) < 12);
        const bar = near(speed, x)[0];
        const mx = memoryTicks[label];
        let verdict;
        if (bar) verdict = bar.hatched || bar.colour === "GREY" ? "over budget" : "fits";
        else if (near(memory, mx).some(b => b.hatched && b.colour === "GREY")) verdict = "out of memory";
        else if (crosses.some(c => Math.abs(c - mx) < 12)) verdict = "error";
        else verdict = "nothing drawn";
        const word = near(words, x).map(w => w[1]).join(" ");
        return {label, verdict, word, colour: bar ? bar.colour : null};
    });
}""".replace("GREY", GREY)

LEGEND = """plot => [...plot.querySelectorAll(".legend .traces .legendtext")].map(text => text.textContent)"""

# The words and signs on and above the bars (best, tie, over budget above the throughput bars' error bars; out of
# memory in its bar), each with the height in pixels
# of one of its lines as drawn: plotly shrinks a bar's text by a transform, which the box shows.
BAR_TEXT = """plot => [...plot.querySelectorAll(".barlayer .bartext, .subplot.xy .textpoint text")]
    .filter(text => text.textContent.trim())
    .map(text => [text.textContent, text.getBoundingClientRect().height / Math.max(1,
                  text.querySelectorAll("tspan.line").length)])"""

# Each legend entry's swatch: [its words, whether it is hatched] (a pattern fill, as plotly draws a bar's pattern).
SWATCHES = r"""plot => [...plot.querySelectorAll(".legend .traces")].map(entry => [
    entry.querySelector(".legendtext").textContent,
    [...entry.querySelectorAll(".legendpoints path")].some(path => /url\(/.test(path.getAttribute("style") || ""))])"""

# Texts (titles, axis titles, legend, annotations) whose box reaches outside the figure's: clipped.
CLIPPED = """root => {
    const outer = root.getBoundingClientRect();
    return [...root.querySelectorAll("text")].filter(text => text.textContent.trim()).map(text => {
        const box = text.getBoundingClientRect();
        return box.width && (box.left < outer.left - 1 || box.right > outer.right + 1 || box.top < outer.top - 1
                             || box.bottom > outer.bottom + 1) ? text.textContent : null;
    }).filter(Boolean);
}"""

# What scrolls sideways: the page, the notebook, each output.
SIDEWAYS = """() => [document.documentElement, document.body, ...document.querySelectorAll(
        ".jp-WindowedPanel-outer, .jp-Notebook, .jp-OutputArea-output, .memlab-panel, .memlab-report > div")]
    .filter(element => element.scrollWidth > element.clientWidth + 1)
    .map(element => {
        const right = element.getBoundingClientRect().right;
        const past = [...element.querySelectorAll("*")].filter(inner => inner.getBoundingClientRect().right > right + 1)
            .slice(0, 3).map(inner => `${inner.tagName}.${inner.getAttribute("class")} ${
                Math.round(inner.getBoundingClientRect().width)} px`);
        return `${element.className || element.tagName}: ${element.scrollWidth} > ${element.clientWidth} (${past})`;
    })"""

# An SVG record, as a JupyterLab <img> or inlined: each plan's verdict (its groups' data-verdict, named by their
# tooltip's first line), whether its speed bar is hatched, and the legend's words (the texts above the panels).
SVG_VERDICTS = """root => {
    let svg = root;
    if (root.tagName === "IMG") {
        const text = decodeURIComponent(root.src.replace(/^data:image\\/svg\\+xml[^,]*,/, ""));
        svg = new DOMParser().parseFromString(text, "image/svg+xml").documentElement;
    }
    const plans = {};
    for (const group of svg.querySelectorAll("g.plan")) {
        const label = group.querySelector("title").textContent.split("\\n")[0];
        const hatched = [...group.querySelectorAll("rect")].some(rect => rect.getAttribute("fill").startsWith("url("));
        (plans[label] = plans[label] || []).push([group.getAttribute("data-verdict"), hatched]);
    }
    const top = Math.min(...[...svg.querySelectorAll("text")].filter(t => t.textContent === "Throughput")
        .map(t => Number(t.getAttribute("y"))));
    const legend = [...svg.querySelectorAll(":scope > text")].filter(t => Number(t.getAttribute("y")) < top - 20)
        .map(t => t.textContent).slice(1);
    return {plans, legend, words: [...svg.querySelectorAll("g.plan > text")].map(t => t.textContent)};
}"""


# An <img> not wholly inside its output area (cut off on the right, or scaled past it).
INSIDE_OUTPUT = """img => {
    const box = img.getBoundingClientRect(), area = img.closest(".jp-OutputArea-output").getBoundingClientRect();
    return box.right <= area.right + 1 && box.width > 300 ? [] : [[box.width, box.right, area.right]];
}"""


# An SVG record's texts (an <img>'s drawn inline, out of sight, to be measured): those reaching outside the figure,
# and pairs whose boxes overlap (a title over the legend).
SVG_TEXTS = """root => {
    let svg = root, holder = null;
    if (root.tagName === "IMG") {
        holder = document.createElement("div");
        holder.style.cssText = "position:absolute;left:0;top:0;width:1200px;visibility:hidden";
        holder.innerHTML = decodeURIComponent(root.src.replace(/^data:image\\/svg\\+xml[^,]*,/, ""));
        document.body.appendChild(holder);
        svg = holder.querySelector("svg");
    }
    const outer = svg.getBoundingClientRect();
    const texts = [...svg.querySelectorAll("text")].filter(text => text.textContent.trim());
    const boxes = texts.map(text => text.getBoundingClientRect());
    const clipped = texts.filter((text, i) => boxes[i].left < outer.left - 1 || boxes[i].right > outer.right + 1
        || boxes[i].top < outer.top - 1 || boxes[i].bottom > outer.bottom + 1).map(text => text.textContent);
    const overlaps = [];
    for (let i = 0; i < boxes.length; i++) {
        for (let j = i + 1; j < boxes.length; j++) {
            const a = boxes[i], b = boxes[j];
            if (a.left < b.right - 1 && b.left < a.right - 1 && a.top < b.bottom - 1 && b.top < a.bottom - 1) {
                overlaps.push([texts[i].textContent, texts[j].textContent]);
            }
        }
    }
    if (holder) holder.remove();
    return {clipped, overlaps};
}"""


def _svg_texts_whole(name: str, root: Any) -> None:
    """(c) an SVG figure's texts inside it, none over another."""
    assert root.evaluate(SVG_TEXTS) == {"clipped": [], "overlaps": []}, name


def _table_verdicts(rows: list[list[Any]]) -> dict[str, str]:
    return {re.sub(r"\s+[\u2605\u2248].*$", "", plan): STATUS_VERDICTS[status] for plan, status, _ in rows}


def _check_plotly_face(name: str, plot: Any, table: dict[str, str]) -> None:
    """(a) the verdict drawn for each plan is the table's; the best plan's bar says "best"; (b) the legend shows
    "over budget", "out of memory" and "error" only where drawn, each swatch as its mark is drawn (the memory
    categories' plain, the hatch only on the entries of plans that do not fit); (c) no text outside the figure."""
    drawn = plot.evaluate(PLOTLY_VERDICTS)
    assert {plan["label"]: plan["verdict"] for plan in drawn} == table, (name, drawn, table)
    for plan in drawn:
        if plan["verdict"] == OVER_BUDGET:
            assert plan["colour"] == GREY and plan["word"] in ("over budget", "overbudget", "\u00d7"), (name, plan)
    legend = plot.evaluate(LEGEND)
    assert ("over budget" in legend) == (OVER_BUDGET in table.values()), (name, legend)
    assert ("out of memory" in legend) == (OUT_OF_MEMORY in table.values()), (name, legend)
    assert ("error" in legend) == (ERROR in table.values()), (name, legend)
    # the marks readable: a line of each at least 10 px high (a 10 px font's box is about 12 px), never shrunk
    assert all(height >= 10 for _, height in plot.evaluate(BAR_TEXT)), (name, plot.evaluate(BAR_TEXT))
    swatches = dict(plot.evaluate(SWATCHES))
    assert {words for words, hatched in swatches.items() if hatched} == (
        {"over budget", "out of memory"} & set(legend)), (name, swatches)
    assert plot.evaluate(CLIPPED) == [], name
    assert plot.locator(f"{PLOTLY_TEXTS}, .gtitle").evaluate_all(GLYPHS_OVERLAP) == [], name


def _check_face(name: str, area: Any, table: dict[str, str]) -> None:
    """The checks of a notebook output holding a figure: drawn by plotly where JupyterLab draws its JSON (or the
    figure is a widget), else the SVG record, an <img>, which must sit inside its output area."""
    plot = area.locator(".js-plotly-plot")
    if plot.count():
        plot.first.locator(".barlayer .point >> visible=true").first.wait_for(timeout=DRAW_TIMEOUT_MS)
        _check_plotly_face(name, plot.first, table)
        return
    record = area.locator("img[src^='data:image/svg+xml']").first
    record.wait_for(timeout=DRAW_TIMEOUT_MS)
    _check_svg_face(name, record, table)
    _svg_texts_whole(name, record)
    assert record.evaluate(INSIDE_OUTPUT) == [], name


def _check_svg_face(name: str, root: Any, table: dict[str, str]) -> None:
    """The same checks on an SVG record (its marks are read from the SVG's own elements)."""
    drawn = root.evaluate(SVG_VERDICTS)
    verdicts = {label: {verdict for verdict, _ in groups} for label, groups in drawn["plans"].items()}
    assert verdicts == {label: {verdict} for label, verdict in table.items()}, (name, drawn, table)
    for label, groups in drawn["plans"].items():  # every group of a plan that does not fit is hatched
        assert all(hatched == (table[label] in (OVER_BUDGET, OUT_OF_MEMORY)) for verdict, hatched in groups
                   if verdict != ERROR), (name, label, groups)
    legend = drawn["legend"]
    assert ("over budget" in legend) == (OVER_BUDGET in table.values()), (name, legend)
    assert ("out of memory" in legend) == (OUT_OF_MEMORY in table.values()), (name, legend)
    assert ("error" in legend) == (ERROR in table.values()), (name, legend)
    assert ("best" in legend) == ("best" in drawn["words"] or "\u2605" in drawn["words"]), (name, drawn)


def _no_sideways_scroll(page: Any, name: str) -> None:
    assert page.evaluate(SIDEWAYS) == [], name


def _rows_short(rows: list[list[Any]], name: str) -> None:
    """The notes column does not squeeze a row to many lines (it did to 7 to 9): at most four (a line is about
    18 px, and a cell has 0.5em of padding above and below)."""
    assert all(height <= 90 for _, _, height in rows), (name, rows)


@pytest.mark.timeout(900)
def test_every_face_marks_verdicts_as_its_table_and_keeps_its_layout(lab: Server, chromium: Any) -> None:
    from playwright.sync_api import expect

    url, path = lab.open("verdicts.ipynb", CELLS)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page = chromium.new_page(viewport={"width": 1400, "height": 2000})
    try:
        _open_notebook(page, url)
        _run_until_done(page, "notebook:run-all-cells", len(CELLS), 600)
        cells = page.locator(".jp-Notebook .jp-Cell")
        for index in range(len(CELLS)):
            text = cells.nth(index).locator(".jp-OutputArea").inner_text()
            assert "Traceback" not in text and "Error displaying" not in text, (index, text[-2000:])

        # The %%memfit record (plotly, the session trusts it) and the Report's table under it.
        memfit = cells.nth(MEMFIT_CELL)
        rows = memfit.locator(".jp-OutputArea").evaluate(TABLE)
        memfit_table = _table_verdicts(rows)
        assert memfit_table == {"plain": OUT_OF_MEMORY, "ckpt": FITS}, rows
        _check_face("%%memfit", memfit.locator(".jp-OutputArea"), memfit_table)
        _rows_short(rows, "%%memfit")
        memfit.screenshot(path=str(ARTIFACTS / "verdicts-memfit.png"))

        # Report.plot(): the plain plan ran, and is over the budget.
        report_cell = cells.nth(REPORT_CELL)
        rows = report_cell.locator(".jp-OutputArea").evaluate(TABLE)
        report_table = _table_verdicts(rows)
        assert report_table == {"plain": OVER_BUDGET, "ckpt": FITS}, rows
        _check_face("Report.plot", report_cell.locator(".jp-OutputArea"), report_table)
        _rows_short(rows, "Report")  # its long note does not squeeze the row
        report_cell.screenshot(path=str(ARTIFACTS / "verdicts-report.png"))

        # The widest table a search makes fits a 1400 px window (JupyterLab's output area, 968 px of it for the table).
        wide = cells.nth(WIDE_CELL)
        wide.scroll_into_view_if_needed()
        assert wide.locator(".jp-OutputArea").evaluate_all(TABLES_OUTSIDE) == []
        wide.screenshot(path=str(ARTIFACTS / "verdicts-wide-table.png"))

        # The panel: Run the plain plan, then checkpointing, in the browser.
        panel = page.locator(".memlab-panel").first
        run = panel.locator("button", has_text="Run")
        run.click()
        expect(panel.locator(".memlab-report")).to_contain_text("plain", timeout=RUN_TIMEOUT_MS)
        expect(run).to_be_enabled(timeout=RUN_TIMEOUT_MS)
        checkpointing = panel.locator(CHECKPOINTING_BOX)  # off, every block or k of the blocks
        checkpointing.select_option(label="every block")
        run.click()
        expect(panel.locator(".memlab-report")).to_contain_text("ckpt", timeout=RUN_TIMEOUT_MS)
        expect(run).to_be_enabled(timeout=RUN_TIMEOUT_MS)
        panel_plot = panel.locator(".js-plotly-plot").first
        page.wait_for_timeout(1500)  # the figure widget's last redraw
        rows = panel.locator(".memlab-report").evaluate(TABLE)
        panel_table = _table_verdicts(rows)
        assert panel_table == {"plain": OUT_OF_MEMORY, "ckpt": FITS}, rows
        _check_plotly_face("panel", panel_plot, panel_table)
        before = panel_plot.bounding_box()
        panel.screenshot(path=str(ARTIFACTS / "verdicts-panel.png"))

        # watch: its record (SVG) says over or within the budget as its steps do; its live figure's axes are whole.
        watch = cells.nth(WATCH_CELL).locator(".jp-OutputArea")
        # Its steps' record first, then the timeline of its costliest step (issue 45), each an SVG image.
        watch.locator("img").nth(1).wait_for(timeout=DRAW_TIMEOUT_MS)
        record, timeline = watch.locator("img").first, watch.locator("img").last
        assert "memory over one step" in timeline.evaluate("img => decodeURIComponent(img.src)")
        text = record.evaluate("img => decodeURIComponent(img.src)")
        said = re.search(r"peak ([\d.]+) (KiB|MiB) at step \d+; (over|within) the ([\d.]+) (KiB|MiB) budget", text)
        assert said, text[:600]
        peak = float(said[1]) * (1024 if said[2] == "MiB" else 1)
        assert said[3] == ("over" if peak > float(said[4]) * (1024 if said[5] == "MiB" else 1) else "within"), said[0]
        assert said[3] == "over", said[0]  # the budget is under every step's peak
        _svg_texts_whole("watch's record", record)  # its axis title whole ("samples/s"), its title not on its legend
        assert record.evaluate(INSIDE_OUTPUT) == [], "watch's record"
        watch_live = cells.nth(WATCH_LIVE_CELL).locator(".js-plotly-plot").first
        watch_live.locator(".barlayer .point, .scatterlayer .trace").first.wait_for(timeout=DRAW_TIMEOUT_MS)
        y_titles = watch_live.locator(".g-ytitle text, .g-y2title text").all_text_contents()
        assert "samples/s" in y_titles, y_titles
        assert watch_live.evaluate(CLIPPED) == [], "watch"
        cells.nth(WATCH_CELL).screenshot(path=str(ARTIFACTS / "verdicts-watch-record.png"))
        cells.nth(WATCH_LIVE_CELL).screenshot(path=str(ARTIFACTS / "verdicts-watch.png"))

        _no_sideways_scroll(page, "notebook")

        # Saved and reloaded, the kernel alive: the panel is drawn again, as wide, its marks the same.
        _save(page)
        _reload_until_drawn(page, url, ".memlab-panel .js-plotly-plot .barlayer .point", "verdicts-panel")
        panel = page.locator(".memlab-panel").first
        panel_plot = panel.locator(".js-plotly-plot").first
        page.wait_for_timeout(1500)
        rows = panel.locator(".memlab-report").evaluate(TABLE)
        assert _table_verdicts(rows) == panel_table, rows
        _check_plotly_face("panel after a reload", panel_plot, panel_table)
        after = panel_plot.bounding_box()
        assert before and after and after["width"] >= before["width"] - 4, (before, after)
        panel.screenshot(path=str(ARTIFACTS / "verdicts-panel-reloaded.png"))
        _no_sideways_scroll(page, "notebook after a reload")
    finally:
        page.close()
        lab.shut_down_kernels()

    # The HTML report, as `memlab demo` writes it, at 1400 px.
    page = chromium.new_page(viewport={"width": 1400, "height": 2000})
    try:
        page.goto((path.parent / "report.html").as_uri(), wait_until="load")
        svg = page.locator("svg").first
        rows = page.evaluate(f"() => ({TABLE})(document.body)")
        html_table = _table_verdicts(rows)
        assert html_table == report_table, rows
        _check_svg_face("HTML report", svg, html_table)
        _svg_texts_whole("HTML report", svg)
        page.screenshot(path=str(ARTIFACTS / "verdicts-html-report.png"), full_page=True)
        _no_sideways_scroll(page, "HTML report")
        assert (path.parent / "report.html").stat().st_size < 100_000
    finally:
        page.close()


def test_watchs_live_figure_keeps_its_labels_apart(lab: Server, chromium: Any) -> None:
    """memlab.watch's live figure (its plotly widget, as it shows while trainer.train() runs): no text on another."""
    cells = ("import memlab\nbudget = 200 * 1024\n" + WATCH, WATCH_LIVE)
    url, _ = lab.open("watch.ipynb", cells)
    page = chromium.new_page(viewport={"width": 1400, "height": 1200})
    try:
        _open_notebook(page, url)
        _run_until_done(page, "notebook:run-all-cells", len(cells), 300)
        cell = page.locator(".jp-Notebook .jp-Cell").nth(1)
        # Below the first cell's training log it may lie outside the viewport, laid out but never painted (twice
        # on a busy machine, the trace never became visible in 150 s): it is brought into view first.
        cell.scroll_into_view_if_needed()
        plot = cell.locator(".js-plotly-plot").first
        plot.wait_for(timeout=DRAW_TIMEOUT_MS)
        plot.scroll_into_view_if_needed()
        plot.locator(".scatterlayer .trace").first.wait_for(timeout=DRAW_TIMEOUT_MS)
        assert plot.locator(f"{PLOTLY_TEXTS}, .gtitle").evaluate_all(GLYPHS_OVERLAP) == []
    finally:
        page.close()
        lab.shut_down_kernels()
