"""Issue 71 item 7: every figure memlab draws in a notebook fits its cell. In JupyterLab at a 1,280-px window with
the file browser open (an output area of about 850 px), the ``%%memfit`` figure and its record, the panel's figure
and timeline, ``Report.plot()``, timelines (one, and several on one axis) and ``memlab.watch``'s figure are each
no wider than their output area, the static records that replace the live figures (an SVG, which JupyterLab shows
as an ``<img>``) included; and no memlab table's sideways-scrolling box reaches past its output area (the panel's
did at 1,000 px: its HTML widget grew to the table's width, so the table's right part was cut, with no scroll bar).
Screenshots:
``tests/artifacts/widths-1280-*.png``, and ``widths-1000-*.png`` after the window is narrowed to 1,000 px."""

from __future__ import annotations

from typing import Any

import pytest
from browser_lab import (
    ARTIFACTS,
    KERNEL_TIMEOUT_MS,
    RUN_TIMEOUT_MS,
    Server,
    _open_notebook,
    _run_until_done,
)

from memlab.report.views.static import WIDTH

# One xdist group with the other browser tests: they share the worker's JupyterLab and Chromium (tests/conftest.py).
pytestmark = pytest.mark.browser

WATCH = """\
import tempfile
import torch
from datasets import Dataset
from transformers import Trainer, TrainingArguments
from models import tiny_llama

def collate(rows):
    ids = torch.tensor([row["input_ids"] for row in rows])
    return {"input_ids": ids, "labels": ids.clone()}

arguments = TrainingArguments(output_dir=tempfile.mkdtemp(), report_to=[], use_cpu=True, save_strategy="no",
                              max_steps=3, per_device_train_batch_size=2, disable_tqdm=True)
data = Dataset.from_dict({"input_ids": [[(i + j) % 127 + 1 for j in range(16)] for i in range(8)]})
trainer = Trainer(model=tiny_llama(), args=arguments, train_dataset=data, data_collator=collate)
watched = memlab.watch(trainer)
trainer.train()
watched.remove()"""

CELLS = (
    "%load_ext memlab\nimport memlab\nfrom models import lm_batch, tiny_gpt2\n"
    "model, batch = tiny_gpt2(), lm_batch(rows=4, length=16)",
    "%%memfit model batch --try checkpointing=off,on precision=fp32,bf16 --steps 1 --noise 0",
    "report = _\nreport.plot()",
    "report.trials[0].timeline.plot()",
    'report.plot(kind="timeline")',
    "p = memlab.panel(model, batch, steps=1, noise=0)\np",
    WATCH,
)
NAMES = ("setup", "memfit", "report-plot", "timeline", "timelines", "panel", "watch")

# Each figure of an output area (an <img>, an inline <svg> not inside another, a plotly plot; hidden ones left out)
# that reaches past the area's right edge, or is wider than the area.
TOO_WIDE = """area => {
    const box = area.getBoundingClientRect();
    const figures = [...area.querySelectorAll("img, svg, .js-plotly-plot")].filter(element =>
        element.getClientRects().length
        && !(element.tagName.toLowerCase() === "svg" && element.parentElement.closest("svg"))
        && !element.closest(".modebar, .legend"));
    return figures.map(element => {
        const own = element.getBoundingClientRect();
        return {kind: element.tagName.toLowerCase() + (element.className && element.className.baseVal === undefined
                                                      ? "." + String(element.className).split(" ")[0] : ""),
                left: Math.round(own.left), right: Math.round(own.right), width: Math.round(own.width),
                area: [Math.round(box.left), Math.round(box.right)]};
    }).filter(figure => figure.width > 0 && (figure.right > box.right + 1 || figure.width > box.width + 1));
}"""

# Each memlab table's sideways-scrolling box that reaches past its output area's right edge: its right part is cut,
# with no scroll bar to reach it.
TABLES_CUT = """area => {
    const right = area.getBoundingClientRect().right;
    return [...area.querySelectorAll(".memlab-report > div")].filter(box => box.getClientRects().length)
        .map(box => ({box: Math.round(box.getBoundingClientRect().right), area: Math.round(right),
                      table: box.scrollWidth, shown: box.clientWidth}))
        .filter(seen => seen.box > seen.area + 1);
}"""

FIGURE_COUNT = """area => [...area.querySelectorAll("img, svg, .js-plotly-plot")].filter(
    element => element.getClientRects().length && element.getBoundingClientRect().width > 200).length"""


def _too_wide(page, cells, name: str) -> list[Any]:  # type: ignore[no-untyped-def]
    """Every figure wider than its output area, in every cell, each cell looked at scrolled into view (JupyterLab
    lays out off-screen cells lazily); a screenshot of each memlab cell."""
    found = []
    for index, cell_name in enumerate(NAMES):
        cell = cells.nth(index)
        cell.scroll_into_view_if_needed()
        page.wait_for_timeout(300)
        area = cell.locator(".jp-OutputArea").first
        if index:
            assert area.evaluate(FIGURE_COUNT) > 0, f"{cell_name}: no figure drawn ({name})"
            cell.screenshot(path=str(ARTIFACTS / f"widths-{name}-{cell_name}.png"))
        found += [{"cell": cell_name, **figure} for figure in area.evaluate(TOO_WIDE)]
        found += [{"cell": cell_name, "table cut": cut} for cut in area.evaluate(TABLES_CUT)]
    return found


def test_every_figure_fits_its_output_area_at_1280_px_with_the_file_browser_open(lab: Server, chromium: Any) -> None:
    from playwright.sync_api import expect

    url, _ = lab.open("widths.ipynb", CELLS)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page = chromium.new_page(viewport={"width": 1280, "height": 1600})  # 1,280 px wide, tall for the screenshots
    try:
        _open_notebook(page, url)
        page.evaluate("() => window.jupyterapp.shell.activateById('filebrowser')")
        expect(page.locator("#filebrowser")).to_be_visible(timeout=30_000)
        _run_until_done(page, "notebook:run-all-cells", len(CELLS), KERNEL_TIMEOUT_MS / 1000 + 240)
        cells = page.locator(".jp-Notebook .jp-Cell")
        area = cells.nth(1).locator(".jp-OutputArea").first
        # narrower than the static figures' own width (memlab.report.views.static.WIDTH): the issue saw 848 px
        assert 700 < area.bounding_box()["width"] < WIDTH  # type: ignore[index]
        panel = page.locator(".memlab-panel")
        panel.locator("button", has_text="Run").first.click()
        expect(panel.locator(".memlab-timeline svg")).to_be_visible(timeout=RUN_TIMEOUT_MS)
        page.screenshot(path=str(ARTIFACTS / "widths-page.png"))
        wide = _too_wide(page, cells, "1280")
        assert wide == [], "\n".join(map(str, wide))
        # A narrower window: every figure follows its cell (plotly's on the window's resize).
        page.set_viewport_size({"width": 1000, "height": 1600})
        page.wait_for_timeout(1500)
        wide = _too_wide(page, cells, "1000")
        assert wide == [], "\n".join(map(str, wide))
    except BaseException:
        page.screenshot(path=str(ARTIFACTS / "widths-failed.png"), full_page=True)
        raise
    finally:
        page.close()
        lab.shut_down_kernels()
