"""Issue 84 item 9: workshop notebooks 06 (``%%memfit``, ``fit``, the panel) and 14 (GRPO under ``memlab.watch``, its
timelines, ``fit`` on a trainer) in JupyterLab at 1,280 and 1,000 px windows with the file browser open (output areas
of about 850 and 640 px): every figure and table inside its output area, and no text cut. Found before: notebook
14's timeline legend cut after "backward" (a scroll bar in a legend taller than its figure) and a watch timeline's
legend run past its SVG's edge at 1,280 px; the panel's point name "accum2 ck" and its host budget's placeholder cut;
at 1,000 px the ``%%memfit`` table 806 px wide in a 640-px area, its time, samples/s and noise scrolled out of sight.

Each notebook runs at the small sizes CI runs it at (``tests/notebook_runs.py``), at 1,280 px; notebook 06's panel is
then run on four settings, its controls set and Run clicked in the browser, so that its figure and table hold several
plans. The window is then narrowed to 1,000 px, and the panel cleared and run again there.
What is checked in each output, scrolled into view as a reader sees it: figures (an ``<img>``, an inline
``<svg>``, a plotly plot) and tables within the room the output has; the notebook itself not scrolling sideways; each
static SVG record's texts within its own drawing (laid out by Chromium from the record's source, with the fonts it
draws them in); each plotly legend shown whole (no scroll bar) and each point's name inside its plot; each text
field's placeholder within the field. Screenshots of every cell with an output, at both widths:
``tests/artifacts/notebook-widths-{06,14}-{1280,1000}-NN.png``."""

from __future__ import annotations

import base64
import urllib.parse
from typing import Any

import nbformat
import pytest
from browser_lab import ARTIFACTS, REPO, Server, _open_notebook, _run_until_done
from notebook_runs import OVERRIDES, SMALL

# One xdist group with the other browser tests: they share the worker's JupyterLab and Chromium (tests/conftest.py).
pytestmark = pytest.mark.browser

WIDTHS = (1280, 1000)

# Notebook 06's panel run on four settings, as a person sets its controls and clicks Run (its live figure and table
# then hold a point and a row per plan, "accum2 ckpt" among them): the controls a setting changes, by their labels.
PANEL_SETTINGS = ({}, {"accumulation": "2", "checkpointing": "every block"}, {"precision": "bf16"},
                  {"micro-batch": "2", "accumulation": "2"})
PANEL_START = {"micro-batch": "4", "accumulation": "1", "checkpointing": "off", "precision": "fp32"}  # CI's 4 rows

# Each figure of an output area (an <img>, an inline <svg> not inside another, a plotly plot; hidden ones left out)
# or table that reaches past the room its output has: the output's box less its padding (JupyterLab's rendered HTML
# keeps 20 px on its right, where a table is cut off).
OUTSIDE = """area => {
    const shown = [...area.querySelectorAll("img, svg, .js-plotly-plot, table")].filter(element =>
        element.getClientRects().length
        && !(element.tagName.toLowerCase() === "svg" && element.parentElement.closest("svg"))
        && !element.closest(".modebar, .legend"));
    return shown.map(element => {
        const holder = element.closest(".jp-RenderedHTMLCommon") || element.closest(".jp-OutputArea-output") || area;
        const room = holder.getBoundingClientRect().right - parseFloat(getComputedStyle(holder).paddingRight);
        const own = element.getBoundingClientRect();
        return {what: element.tagName.toLowerCase(), left: Math.round(own.left), right: Math.round(own.right),
                room: Math.round(room)};
    }).filter(seen => seen.right > seen.room + 1 && seen.right > seen.left)
        .map(seen => `${seen.what} at ${seen.left}-${seen.right} px, its output's room ending at ${seen.room} px`);
}"""

# A plotly legend taller than its place (plotly then gives it a scroll bar and hides its last entries), and each
# point's name of a scatter that runs past its plot's edges, where plotly cuts it (unless the trace says not to).
PLOTLY_CUT = """area => {
    const found = [];
    for (const plot of area.querySelectorAll(".js-plotly-plot")) {
        for (const bar of plot.querySelectorAll(".legend .scrollbar")) {
            if (bar.getBoundingClientRect().height > 0) {
                found.push("a legend with a scroll bar: its last entries are hidden");
            }
        }
        for (const subplot of plot.querySelectorAll(".cartesianlayer .subplot")) {
            const id = [...subplot.classList].find(name => /^x[0-9]*y[0-9]*$/.test(name));
            const axis = id && plot._fullLayout._plots[id] && plot._fullLayout._plots[id].xaxis;
            if (!axis) continue;
            const left = plot.getBoundingClientRect().left + axis._offset, right = left + axis._length;
            for (const point of subplot.querySelectorAll(".textpoint text")) {
                const drawn = point.closest(".trace") && point.closest(".trace").__data__;
                const trace = drawn && drawn[0] && drawn[0].trace;
                if (trace && trace.cliponaxis === false) continue;  // drawn past the axes on purpose, never cut
                const text = point.getBoundingClientRect();
                if (text.width && (text.left < left - 1 || text.right > right + 1)) {
                    found.push(`the point name ${JSON.stringify(point.textContent)} at ${Math.round(text.left)}-`
                               + `${Math.round(text.right)} px, its plot at ${Math.round(left)}-${Math.round(right)}`);
                }
            }
        }
    }
    return found;
}"""

# Each text field whose placeholder is wider than the field's room for text (the browser cuts it there).
PLACEHOLDERS_CUT = """area => {
    const canvas = document.createElement("canvas").getContext("2d");
    return [...area.querySelectorAll("input[placeholder]")].filter(input => input.offsetWidth).map(input => {
        const style = getComputedStyle(input);
        canvas.font = `${style.fontWeight} ${style.fontSize} ${style.fontFamily}`;
        const room = input.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
        return {text: input.placeholder, needs: Math.ceil(canvas.measureText(input.placeholder).width),
                room: Math.floor(room)};
    }).filter(field => field.needs > field.room + 1).map(field =>
        `the placeholder ${JSON.stringify(field.text)} needs ${field.needs} px in a field of ${field.room}`);
}"""

# The notebook's own scroll box scrolled sideways: something inside is wider than the notebook.
SIDEWAYS = """() => [...document.querySelectorAll(".jp-NotebookPanel-notebook, .jp-WindowedPanel-outer")]
    .filter(box => box.offsetWidth && box.scrollWidth > box.clientWidth + 1)
    .map(box => `the notebook is ${box.scrollWidth} px wide in ${box.clientWidth} px: it scrolls sideways`)"""

# The texts of an SVG record that reach past its drawing (its viewBox), laid out by the browser. Each text's box as
# drawn, turned axis titles included (getBBox is the box before the text's own rotation: a turned title 56 units long
# centred 22 units from the edge would read as starting at -6), in the viewBox's units.
SVG_TEXT_CUT = """() => {
    const svg = document.querySelector("svg");
    const view = svg.viewBox.baseVal, drawing = svg.getBoundingClientRect();
    const scale = view.width / drawing.width;
    return [...svg.querySelectorAll("text")].map(text => {
        const drawn = text.getBoundingClientRect();
        return [text.textContent, {x: view.x + (drawn.left - drawing.left) * scale, width: drawn.width * scale}];
    })
        .filter(([, box]) => box.width && (box.x < view.x - 1 || box.x + box.width > view.x + view.width + 1))
        .map(([words, box]) => `${JSON.stringify(words)} at ${Math.round(box.x)}-${Math.round(box.x + box.width)} `
                               + `in a drawing ${Math.round(view.width)} wide`);
}"""


def notebook_cells(name: str) -> list[Any]:
    """The notebook's cells with CI's small sizes after its parameters cell (and notebook 06's panel runs)."""
    notebook = nbformat.read(REPO / "notebooks" / name, as_version=4)
    cells = list(notebook.cells)
    at = next(i for i, cell in enumerate(cells) if "parameters" in cell.metadata.get("tags", []))
    sizes = "; ".join(f"{key} = {value!r}" for key, value in OVERRIDES.get(name, SMALL).items())
    cells = [*cells[: at + 1], nbformat.v4.new_code_cell(sizes + "  # CI's small sizes"), *cells[at + 1 :]]
    return cells


def run_the_panel(page: Any) -> None:
    """Set the panel's controls for each of :data:`PANEL_SETTINGS` and click Run, each run waited for."""
    panel = page.locator(".memlab-panel").first
    for number, settings in enumerate(PANEL_SETTINGS, start=1):
        for label, value in {**PANEL_START, **settings}.items():
            control = panel.locator(f".widget-inline-hbox:has(> label:text-is('{label}'))")
            if control.locator("select").count():
                control.locator("select").select_option(value)
            else:
                control.locator("input").fill(value)
                control.locator("input").press("Enter")
        panel.locator("button", has_text="Run").first.click()
        page.wait_for_function(
            """count => document.querySelectorAll('.memlab-panel .memlab-report tbody tr').length === count
                && !document.querySelector('.memlab-panel .memlab-status').textContent.startsWith('Running')""",
            arg=number, timeout=120_000, polling=500)


def svg_sources(area: Any) -> list[str]:
    """The SVG records an output area shows as pictures (JupyterLab draws ``image/svg+xml`` as an ``<img>``)."""
    sources = area.evaluate("area => [...area.querySelectorAll('img')].filter(image => image.offsetWidth)"
                            ".map(image => image.src).filter(source => source.startsWith('data:image/svg+xml'))")
    found = []
    for source in sources:
        head, _, data = source.partition(",")
        found.append(base64.b64decode(data).decode() if head.endswith(";base64") else urllib.parse.unquote(data))
    return found


def cut_in_svg(scratch: Any, source: str) -> list[str]:
    """The texts of the SVG ``source`` that run past its drawing, as Chromium lays them out."""
    scratch.set_content(f"<!doctype html><html><body style='margin:0'>{source}</body></html>")
    return list(scratch.evaluate(SVG_TEXT_CUT))


def problems_at(page: Any, scratch: Any, name: str, width: int) -> list[str]:
    """Everything cut or outside its output area in the notebook open in ``page``, at a ``width``-px window; a
    screenshot of each cell with an output.

    Each cell is looked at scrolled into view, as a reader sees it (JupyterLab lays out cells out of sight lazily),
    and told of the window's new width there: plotly lays a figure out again on the window's resize event, which a
    figure out of sight at the time misses (it keeps its old width until the next one)."""
    found = [f"{width} px: {problem}" for problem in page.evaluate(SIDEWAYS)]
    cells = page.locator(".jp-Notebook .jp-Cell")
    for index in range(cells.count()):
        cell = cells.nth(index)
        if not cell.locator(".jp-OutputArea-output").count():
            continue
        cell.scroll_into_view_if_needed()
        page.evaluate("() => window.dispatchEvent(new Event('resize'))")
        page.wait_for_timeout(800)
        cell.screenshot(path=str(ARTIFACTS / f"notebook-widths-{name[:2]}-{width}-{index:02d}.png"))
        area = cell.locator(".jp-OutputArea").first
        first_line = cell.locator(".jp-InputArea-editor").inner_text().strip().splitlines()[:1]
        where = f"{width} px, cell {index} ({first_line[0][:50] if first_line else ''})"
        seen = [*area.evaluate(OUTSIDE), *area.evaluate(PLOTLY_CUT), *area.evaluate(PLACEHOLDERS_CUT)]
        seen += [f"an SVG record's text {cut}" for source in svg_sources(area) for cut in cut_in_svg(scratch, source)]
        found += [f"{where}: {problem}" for problem in seen]
    return found


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", ["06_memfit_and_panel.ipynb", "14_grpo_without_running_out_of_memory.ipynb"])
def test_a_workshop_notebook_fits_its_output_areas_at_1280_and_1000_px(name: str, lab: Server,
                                                                       chromium: Any) -> None:
    cells = notebook_cells(name)
    url, _ = lab.open(f"widths-{name}", cells)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page = chromium.new_page(viewport={"width": WIDTHS[0], "height": 1600})
    scratch = chromium.new_page()
    try:
        _open_notebook(page, url)
        page.evaluate("() => window.jupyterapp.shell.activateById('filebrowser')")
        page.locator("#filebrowser").wait_for(state="visible", timeout=30_000)
        _run_until_done(page, "notebook:run-all-cells", len(cells), 600)
        outputs = page.locator(".jp-Notebook .jp-Cell .jp-OutputArea").all_inner_texts()
        errors = [text for text in outputs if "Traceback" in text]
        assert not errors, errors[0][-2000:]
        found: list[str] = []
        for width in WIDTHS:
            page.set_viewport_size({"width": width, "height": 1600})
            page.wait_for_timeout(2000)
            if name.startswith("06"):
                # The panel run at this width, its figure drawn afresh (Clear): a panel's figure drawn in a wider
                # window keeps that width when the window narrows (its plotly layout keeps an explicit width).
                panel = page.locator(".memlab-panel").first
                panel.scroll_into_view_if_needed()
                if width != WIDTHS[0]:
                    panel.locator("button", has_text="Clear").first.click()
                    page.wait_for_function(
                        "() => !document.querySelectorAll('.memlab-panel .memlab-report tbody tr').length",
                        timeout=30_000, polling=500)
                run_the_panel(page)
            found += problems_at(page, scratch, name, width)
        assert found == [], "\n".join(found)
    except BaseException:
        page.screenshot(path=str(ARTIFACTS / f"notebook-widths-{name[:2]}-failed.png"))
        raise
    finally:
        scratch.close()
        page.close()
        lab.shut_down_kernels()


def test_the_svg_check_sees_a_cut_text_and_passes_a_turned_title_drawn_inside(chromium: Any) -> None:
    """A title turned upwards 22 units from the left edge (memlab's axis titles) is inside its drawing, though its
    box before the turn starts at -6; a text starting at -20 is cut."""
    page = chromium.new_page()
    try:
        turned = ("<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 200 100' width='400' height='200'>"
                  "<text x='22' y='50' text-anchor='middle' font-size='10' transform='rotate(-90 22 50)'>"
                  "samples per second</text></svg>")
        assert cut_in_svg(page, turned) == []
        cut = ("<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 200 100' width='400' height='200'>"
               "<text x='-20' y='50' font-size='10'>samples/s</text></svg>")
        assert [text.split(" at ")[0] for text in cut_in_svg(page, cut)] == ['"samples/s"']
    finally:
        page.close()
