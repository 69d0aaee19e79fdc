"""A saved notebook reloaded in JupyterLab with its kernel alive, until a restored widget's figure is drawn."""

from __future__ import annotations

from browser_lab import ARTIFACTS, DRAW_TIMEOUT_MS, _open_notebook


def _reload_until_drawn(page, url: str, drawn: str, name: str) -> None:  # type: ignore[no-untyped-def]
    """Reload the saved notebook (its kernel alive) and wait until ``drawn`` (a selector of the restored widget's
    figure) is visible, each cell scrolled into view first. JupyterLab restores a live widget by asking the kernel for
    its models after the page loads; on a loaded machine that request is sometimes lost and the output stays "Loading
    widget..." until the next reload (jupyterlab_widgets' behaviour, not memlab's: a user reloads again). One more
    reload is allowed, and what the first one showed is kept as ``reload-<name>-first.png`` and said if the second
    fails too."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    first_showed = ""
    for attempt in range(2):
        page.reload(wait_until="domcontentloaded")
        _open_notebook(page, url)
        # JupyterLab renders a cell's outputs (a widget's view included) once the cell comes near the viewport:
        # every cell is brought into view once, as a person scrolling down would.
        cells = page.locator(".jp-Notebook .jp-Cell")
        for index in range(cells.count()):
            cells.nth(index).scroll_into_view_if_needed()
        try:
            target = page.locator(drawn).first
            target.wait_for(state="attached", timeout=90_000 if attempt == 0 else DRAW_TIMEOUT_MS)
            target.scroll_into_view_if_needed()  # an output far from the viewport is laid out but not painted
            page.locator(f"{drawn} >> visible=true").first.wait_for(state="visible", timeout=30_000)
            return
        except PlaywrightTimeout as timed_out:
            if attempt == 1:
                raise AssertionError(
                    f"{name}: not drawn after two reloads; the first showed: {first_showed!r}") from timed_out
            page.screenshot(path=str(ARTIFACTS / f"reload-{name}-first.png"))
            first_showed = " | ".join(
                f"cell {index}: {text[:160]!r}"
                # all_inner_texts waits for nothing: a markdown cell has no output area, where inner_text() waited
                # its 30 s and raised, ending the test before the second reload (a README run at load 10-12).
                for index, text in enumerate(" ".join(cells.nth(i).locator(".jp-OutputArea").all_inner_texts())
                                             for i in range(cells.count())))
            print(f"{name}: not drawn after a reload ({first_showed}); reloading once more")
