"""A workshop notebook run in JupyterLab, its outputs cleared and saved, is the committed file but for one line: a
save does not leave the notebooks modified in git (issue 61, item 11), except for the kernel's Python version.

Why a save changed them before: JupyterLab writes the kernel's whole ``language_info`` on every save (the committed
files had its name alone), and it drops ``outputs_hidden`` from a cell whose outputs are cleared (it also un-hides
a cell's outputs whenever it runs the cell, so that key never hid a solution's answers). The one line left is
``language_info.version``, the kernel's Python (3.11.7 here, another on the next machine): no committed file can
hold every reader's."""

from __future__ import annotations

import json
import platform
import shutil
from typing import Any

import pytest
from browser_lab import KERNEL_TIMEOUT_MS, REPO, Server, _open_notebook, _save

RUN_FIRST_CODE_CELL = """() => {
    const panel = window.jupyterapp.shell.currentWidget;
    const cells = panel.content.widgets;
    panel.content.activeCellIndex = cells.findIndex(cell => cell.model.type === "code");
    window.jupyterapp.commands.execute("notebook:run-cell");
}"""
pytestmark = pytest.mark.browser

FIRST_CODE_CELL_RAN = """() => {
    const panel = window.jupyterapp.shell.currentWidget;
    const cell = panel.content.widgets.find(cell => cell.model.type === "code");
    return cell.model.executionCount !== null && panel.sessionContext.session.kernel.status === "idle";
}"""


@pytest.mark.parametrize("notebook", ["00_where_memory_goes.ipynb", "01_gradient_accumulation.ipynb"])
def test_a_notebook_run_cleared_and_saved_is_the_committed_file(notebook: str, lab: Server, chromium: Any) -> None:
    """00's solution is a folded markdown cell, 01's a folded code cell (source_hidden)."""
    committed = REPO / "notebooks" / notebook
    path = lab.root / notebook
    shutil.copyfile(committed, path)
    page = chromium.new_page(viewport={"width": 1400, "height": 1200})
    try:
        _open_notebook(page, f"{lab.base}/lab/tree/{notebook}?token={lab.token}")
        page.evaluate(RUN_FIRST_CODE_CELL)  # the kernel tells JupyterLab its language_info, as any run does
        page.wait_for_function(FIRST_CODE_CELL_RAN, timeout=KERNEL_TIMEOUT_MS, polling=500)
        page.evaluate("() => window.jupyterapp.commands.execute('notebook:clear-all-cell-outputs')")
        _save(page)
        saved, before = path.read_text(encoding="utf-8"), committed.read_text(encoding="utf-8")
        version = json.loads(saved)["metadata"]["language_info"]["version"]
        assert version == platform.python_version()  # the kernel's Python
        without_version = saved.replace(f',\n   "version": "{version}"\n', "\n")
        assert without_version == before, _diff(before, saved)
    finally:
        page.close()
        lab.shut_down_kernels()


def _diff(before: str, after: str) -> str:
    import difflib

    return "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True), "committed", "saved", n=1))
