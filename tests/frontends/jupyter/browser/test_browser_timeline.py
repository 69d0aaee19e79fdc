"""The panel's step timeline in a real browser (JupyterLab in headless Chromium): it appears after a run, follows a
click on a plan's bar in the figure, and is there again after a save and a reload. Screenshot:
``tests/artifacts/panel-timeline.png``."""

from __future__ import annotations

from typing import Any

import pytest
from browser_lab import (
    ARTIFACTS,
    CHECKPOINTING_BOX,
    DRAW_TIMEOUT_MS,
    KERNEL_TIMEOUT_MS,
    RUN_TIMEOUT_MS,
    Server,
    _open_notebook,
    _save,
    _tick_labels,
)
from browser_reload import _reload_until_drawn

# One xdist group with the other browser tests: they share the worker's JupyterLab and Chromium (tests/conftest.py).
pytestmark = pytest.mark.browser

CELLS = (
    "import memlab\nfrom models import lm_batch, tiny_gpt2\n"
    "p = memlab.panel(tiny_gpt2(), lm_batch(rows=4, length=8), steps=1, noise=0)\np",
)
# The centre of the tallest bar of the leftmost plan (the first trial) in the panel's figure, in page pixels.
LEFTMOST_BAR = """points => {
    const boxes = points.map(point => point.getBoundingClientRect()).filter(box => box.width > 0 && box.height > 2);
    const left = Math.min(...boxes.map(box => box.x));
    const column = boxes.filter(box => Math.abs(box.x - left) < 2).sort((a, b) => b.height - a.height);
    return [column[0].x + column[0].width / 2, column[0].y + column[0].height / 2];
}"""


def test_the_panels_timeline_follows_a_click_and_survives_a_reload(lab: Server, chromium: Any) -> None:
    from playwright.sync_api import expect

    url, _ = lab.open("timeline.ipynb", CELLS)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page = chromium.new_page(viewport={"width": 1400, "height": 2000})
    try:
        _open_notebook(page, url)
        page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
        panel = page.locator(".memlab-panel")
        run = panel.locator("button", has_text="Run")
        run.wait_for(state="visible", timeout=KERNEL_TIMEOUT_MS)
        timeline = panel.locator(".memlab-timeline")
        expect(timeline).to_be_hidden()  # nothing run yet: nothing to draw
        plot = panel.locator(".js-plotly-plot")
        run.click()
        expect(_tick_labels(plot)).to_contain_text(["plain"], timeout=RUN_TIMEOUT_MS)
        expect(run).to_be_enabled(timeout=RUN_TIMEOUT_MS)
        checkpointing = panel.locator(CHECKPOINTING_BOX)  # off, every block or k of the blocks
        checkpointing.select_option(label="every block")
        run.click()
        expect(_tick_labels(plot)).to_contain_text(["plain", "ckpt"], timeout=RUN_TIMEOUT_MS)
        expect(run).to_be_enabled(timeout=RUN_TIMEOUT_MS)

        # After a run, the timeline of the plan just run, with its peak named.
        expect(timeline.locator("svg")).to_be_visible(timeout=30_000)
        expect(timeline).to_contain_text("ckpt: peak")
        expect(timeline).to_contain_text("backward")
        assert timeline.locator("svg polygon").count() >= 3  # stacked categories

        # A click on the first plan's bar draws that plan's timeline.
        x, y = plot.locator(".barlayer .trace.bars .point path").evaluate_all(LEFTMOST_BAR)
        page.mouse.click(x, y)
        expect(timeline).to_contain_text("plain: peak", timeout=30_000)
        expect(timeline).not_to_contain_text("ckpt: peak")
        timeline.scroll_into_view_if_needed()
        panel.screenshot(path=str(ARTIFACTS / "panel-timeline.png"))

        # Saved and reloaded (the kernel alive): the panel, its picked timeline included, is drawn again.
        _save(page)
        _reload_until_drawn(page, url, ".memlab-panel .memlab-timeline svg", "timeline-panel")
        expect(page.locator(".memlab-panel .memlab-timeline")).to_contain_text("plain: peak", timeout=DRAW_TIMEOUT_MS)
        expect(page.locator(".memlab-panel .memlab-timeline svg")).to_be_visible()
    finally:
        page.close()
        lab.shut_down_kernels()
    assert (ARTIFACTS / "panel-timeline.png").stat().st_size > 10_000
