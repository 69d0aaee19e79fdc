"""The panel in a real browser: JupyterLab 4 (and Notebook 7) on localhost, driven by Playwright in headless Chromium.

The test starts ``jupyter lab`` (or ``jupyter notebook``) in a temporary directory (its own config, settings,
workspaces and runtime directories, no news or update checks), writes a notebook whose cell builds the panel on a
tiny GPT-2, opens it, runs all cells, clicks the panel's Run button, and waits until the plotly figure draws the new
trial. It then switches checkpointing on in the browser, runs again, and checks that the second setting is drawn
too, in its colours. Screenshots go to ``tests/artifacts/`` (``panel.png`` for JupyterLab, ``panel-notebook7.png``
for Notebook 7). The server (and so the kernel) is always killed.

The Notebook 7 run needs the ``notebook`` package (>= 7); without it that case is skipped.

Chromium comes from Debian's ``chromium`` package (Playwright's own browser download does not work here). Without
it the test is skipped, except under ``CI=true``, where a missing browser is a failure.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from memlab.report import CATEGORIES
from memlab.report.figure import BEST_COLOR, CATEGORY_COLORS

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "tests" / "artifacts"
START_TIMEOUT_S = 90
KERNEL_TIMEOUT_MS = 150_000
RUN_TIMEOUT_MS = 120_000

KERNEL_READY = """() => {
    const widget = window.jupyterapp && window.jupyterapp.shell.currentWidget;
    const context = widget && widget.sessionContext;
    const kernel = context && context.session && context.session.kernel;
    return Boolean(context && context.isReady && kernel && kernel.status === "idle"
                   && kernel.connectionStatus === "connected");
}"""

FILLS = "elements => elements.map(element => getComputedStyle(element).fill)"

# The loss sleeps a little so that a run lasts long enough (about 1.5 s: a warm-up, a tracked and a timed step, as
# noise=0 asks) for the browser to see the controls disabled while it goes, however fast the machine is.
CELL = """\
import time
import memlab
from models import lm_batch, tiny_gpt2

def slow_loss(model, batch):
    time.sleep(0.4)
    return model(**batch).loss

p = memlab.panel(tiny_gpt2(), lm_batch(rows=4, length=8), loss_fn=slow_loss, steps=1, noise=0)
p"""


# A notebook as a person leaves it: a %%memfit run (its figure becomes a static record when it ends) and a panel
# that has run one setting.
RELOAD_CELLS = (
    "%load_ext memlab\nimport memlab\nfrom models import lm_batch, tiny_gpt2\n"
    "model, batch = tiny_gpt2(), lm_batch(rows=4, length=8)",
    "%%memfit model batch --try checkpointing=off,on --steps 1 --noise 0",
    "p = memlab.panel(model, batch, steps=1, noise=0)\np",
)
NOT_DIRTY = "() => { const w = window.jupyterapp.shell.currentWidget; return Boolean(w && !w.context.model.dirty); }"
KERNEL_ID = "() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.id"


def _require_chromium() -> None:
    if CHROMIUM.exists():
        return
    message = f"{CHROMIUM} is missing: install Debian's chromium package (apt-get install -y chromium)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message + "; under CI=true the browser test must run", pytrace=False)
    pytest.skip(message)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _write_notebook(path: Path, cells: tuple[str, ...] = (CELL,)) -> None:
    import nbformat

    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(cell) for cell in cells]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, path)


def _write_config(root: Path) -> dict[str, str]:
    """An isolated Jupyter config: no news, no update check, no notification toast; returns the environment."""
    config = root / "config"
    settings = root / "settings"
    (config).mkdir()
    (config / "jupyter_server_config.json").write_text(
        json.dumps({"LabApp": {"news_url": None, "check_for_updates_class": "jupyterlab.NeverCheckForUpdate"}})
    )
    notification = settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    notification.parent.mkdir(parents=True)
    notification.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    tracker = settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
    tracker.parent.mkdir(parents=True)
    tracker.write_text(json.dumps({"autoStartDefaultKernel": True}))  # no "Select Kernel" dialog
    env = dict(os.environ)
    env.update(
        JUPYTER_CONFIG_DIR=str(config),
        JUPYTER_RUNTIME_DIR=str(root / "runtime"),
        JUPYTERLAB_SETTINGS_DIR=str(settings),
        JUPYTERLAB_WORKSPACES_DIR=str(root / "workspaces"),
        PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        TOKENIZERS_PARALLELISM="false",
    )
    return env


FRONT_ENDS = {
    # name: (command after ``python -m``, options of that front end, path of the notebook, screenshot)
    "lab": (
        ["jupyter", "lab"],
        ["--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        "lab/tree/panel.ipynb",
        "panel.png",
    ),
    "notebook": (["notebook"], [], "notebooks/panel.ipynb", "panel-notebook7.png"),
}


@pytest.fixture(params=sorted(FRONT_ENDS))
def jupyter_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A Jupyter server on localhost serving ``tmp_path / "notebooks"``; yields (front end, the notebook's URL)."""
    front_end: str = request.param
    with _serve(front_end, tmp_path, (CELL,)) as served:
        yield served


@pytest.fixture
def lab_with_memfit_and_panel(tmp_path: Path) -> Iterator[tuple[str, str, Path]]:
    """JupyterLab serving a notebook with a ``%%memfit`` cell and a panel cell; yields (base URL, token, its file)."""
    with _serve("lab", tmp_path, RELOAD_CELLS) as (_, url):
        yield url.split("/lab/")[0], url.split("token=")[1], tmp_path / "notebooks" / "panel.ipynb"


@contextlib.contextmanager
def _serve(front_end: str, tmp_path: Path, cells: tuple[str, ...]) -> Iterator[tuple[str, str]]:
    _require_chromium()
    if front_end == "notebook" and importlib.util.find_spec("notebook") is None:
        pytest.skip("Notebook 7 is not installed (pip install 'notebook>=7')")
    module, options, path, _ = FRONT_ENDS[front_end]
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    _write_notebook(notebooks / "panel.ipynb", cells)
    env = _write_config(tmp_path)
    port, token = _free_port(), secrets.token_hex(16)
    log_path = tmp_path / "jupyter.log"
    command = [
        sys.executable, "-m", *module, "--no-browser", "--allow-root", "--ip=127.0.0.1", f"--port={port}",
        f"--ServerApp.token={token}", f"--ServerApp.root_dir={notebooks}", "--ServerApp.port_retries=0",
        "--expose-app-in-browser", *options,
        f"--LabServerApp.user_settings_dir={env['JUPYTERLAB_SETTINGS_DIR']}",
        f"--LabServerApp.workspaces_dir={env['JUPYTERLAB_WORKSPACES_DIR']}",
    ]  # fmt: skip
    with log_path.open("wb") as log:
        server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            _wait_for_server(server, f"http://127.0.0.1:{port}/api/status?token={token}", log_path)
            yield front_end, f"http://127.0.0.1:{port}/{path}?token={token}"
        finally:
            _kill(server)


def _wait_for_server(server: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(
                f"the Jupyter server exited with {server.returncode}:\n{log.read_text()[-3000:]}", pytrace=False
            )
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail(f"the Jupyter server did not answer in {START_TIMEOUT_S} s:\n{log.read_text()[-3000:]}", pytrace=False)


def _kill(server: subprocess.Popen[bytes]) -> None:
    """Stop the server and its kernels (its whole process group, which this test created)."""
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(server.pid, signal.SIGKILL)  # kernels left behind by the server, if any
    except ProcessLookupError:
        pass
    if server.poll() is None:
        server.wait(timeout=15)


def test_panel_runs_a_trial_and_draws_it_in_the_browser(jupyter_server: tuple[str, str]) -> None:
    from playwright.sync_api import expect, sync_playwright

    front_end, url = jupyter_server
    screenshot = ARTIFACTS / FRONT_ENDS[front_end][3]

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1700})
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(url, wait_until="domcontentloaded", timeout=60_000)
            page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell", timeout=60_000)
            page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=60_000)
            page.wait_for_function(KERNEL_READY, timeout=KERNEL_TIMEOUT_MS)
            # Not awaited: the command's promise settles only when the cells have run.
            page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")

            panel = page.locator(".memlab-panel")
            run = panel.locator("button", has_text="Run")
            run.wait_for(state="visible", timeout=KERNEL_TIMEOUT_MS)
            plot = panel.locator(".js-plotly-plot")
            plot.first.wait_for(state="visible", timeout=60_000)
            expect(panel.locator(".widget-checkbox", has_text="checkpointing")).to_be_visible()
            for label in ("precision", "optimizer", "offload", "budget", "micro-batch", "accumulation"):
                expect(panel.get_by_text(label, exact=True).first).to_be_visible()

            run.click()
            expect(run).to_be_disabled(timeout=30_000)  # the kernel is running the trial
            expect(_tick_labels(plot)).to_contain_text(["plain"], timeout=RUN_TIMEOUT_MS)
            expect(run).to_be_enabled(timeout=RUN_TIMEOUT_MS)
            expect(panel.locator(".memlab-status")).to_contain_text("plain: fits")

            panel.locator(".widget-checkbox input[title=checkpointing]").check()
            run.click()
            expect(_tick_labels(plot)).to_contain_text(["plain", "ckpt"], timeout=RUN_TIMEOUT_MS)
            expect(run).to_be_enabled(timeout=RUN_TIMEOUT_MS)
            expect(panel.locator(".memlab-report")).to_contain_text("ckpt")

            # The DOM holds what the kernel measured: a stacked bar per category for both settings, and both
            # points of the memory-vs-throughput scatter with their labels.
            bars = plot.locator(".barlayer .trace.bars .point")
            assert bars.count() >= 2 * 5
            scatter_text = plot.locator(".scatterlayer .textpoint").all_text_contents()
            assert sorted(scatter_text) == ["ckpt", "plain"]
            outputs = page.locator(".jp-OutputArea").inner_text()
            assert "Traceback" not in outputs and "Error" not in outputs
            # The widget front ends were found: no plain-text fallback, no "Error displaying widget".
            assert "Panel(children=" not in outputs and "VBox(" not in outputs and "FigureWidget(" not in outputs
            assert not [e for e in errors if "memlab" in e or "plotly" in e or "widget" in e.lower()], errors
            # Drawn in its colours: every category's bar, and the settings that fit as green points.
            bar_fills = set(plot.locator(".barlayer .trace.bars .point path").evaluate_all(FILLS))
            assert {_rgb(CATEGORY_COLORS[category]) for category in CATEGORIES} <= bar_fills, bar_fills
            point_fills = plot.locator(".scatterlayer .trace .points path.point").evaluate_all(FILLS)
            assert _rgb(BEST_COLOR) in point_fills, point_fills

            panel.scroll_into_view_if_needed()
            page.screenshot(path=str(screenshot))
            if front_end == "lab":
                panel.screenshot(path=str(ARTIFACTS / "panel-widget.png"))
        finally:
            browser.close()
    assert screenshot.stat().st_size > 10_000


def _rgb(color: str) -> str:
    """``"#4C78A8"`` -> ``"rgb(76, 120, 168)"``, as the browser reports an SVG fill."""
    red, green, blue = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgb({red}, {green}, {blue})"


def _tick_labels(plot):  # type: ignore[no-untyped-def]
    """The category labels on the x axis of the peak-memory panel (the figure's second x axis)."""
    return plot.locator(".xaxislayer-above .x2tick text")


def _open_notebook(page, url: str) -> None:  # type: ignore[no-untyped-def]
    """Load JupyterLab at ``url`` and wait until the notebook's cells are there and its kernel is idle."""
    page.goto(url, wait_until="domcontentloaded", timeout=60_000)
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell", timeout=60_000)
    page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=60_000)
    page.wait_for_function(KERNEL_READY, timeout=KERNEL_TIMEOUT_MS)


def _record_bar_count(cell) -> int:  # type: ignore[no-untyped-def]
    """How many bars the record of a run draws in ``cell``, as JupyterLab shows it: where it trusts the output (the
    session that ran it) its plotly renderer draws the plotly JSON; where it does not (a reloaded notebook), that
    renderer draws the same JSON as a PNG (counted as -1 when drawn: a picture has no bars to count), and a front
    end without plotly shows the SVG."""
    plotly_bars = cell.locator(".jp-OutputArea .js-plotly-plot .barlayer .trace.bars .point").count()
    sources = cell.locator(".jp-OutputArea img").evaluate_all(
        "images => images.filter(image => image.naturalWidth > 300).map(image => decodeURIComponent(image.src))"
    )
    svg_bars = sum(source.count('class="bar"') for source in sources if source.startswith("data:image/svg+xml"))
    pictures = [source for source in sources if source.startswith("data:image/png")]
    return plotly_bars + svg_bars or (-1 if pictures else 0)


def _wait_for_record(page, cell) -> int:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + 60
    while (count := _record_bar_count(cell)) == 0 and time.monotonic() < deadline:
        page.wait_for_timeout(250)
    return count


def _saved_record_bars(notebook: Path) -> int:
    """The bars of the SVG that the saved notebook's %%memfit cell keeps (what GitHub and nbconvert show)."""
    import nbformat

    outputs = nbformat.read(notebook, as_version=4).cells[1].outputs
    return sum(output.get("data", {}).get("image/svg+xml", "").count('class="bar"') for output in outputs)


def test_what_a_run_leaves_in_the_notebook_survives_a_reload(lab_with_memfit_and_panel: tuple[str, str, Path]) -> None:
    """After a %%memfit run and a panel run, the saved notebook reloads with the figures drawn: the panel's from its
    live kernel, the %%memfit record with no kernel at all (the kernel is shut down before the second reload)."""
    from playwright.sync_api import expect, sync_playwright

    base, token, notebook = lab_with_memfit_and_panel
    url = f"{base}/lab/tree/panel.ipynb?token={token}"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 2200})
        try:
            _open_notebook(page, url)
            page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
            cells = page.locator(".jp-Notebook .jp-Cell")
            panel = page.locator(".memlab-panel")
            run = panel.locator("button", has_text="Run")
            run.wait_for(state="visible", timeout=KERNEL_TIMEOUT_MS)
            assert _wait_for_record(page, cells.nth(1)) != 0
            run.click()
            plot = panel.locator(".js-plotly-plot")
            expect(_tick_labels(plot)).to_contain_text(["plain"], timeout=RUN_TIMEOUT_MS)
            expect(run).to_be_enabled(timeout=RUN_TIMEOUT_MS)
            record_bars = _record_bar_count(cells.nth(1))
            assert record_bars >= 2 * 5, record_bars  # five categories for each of the two plans

            page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
            page.wait_for_function(NOT_DIRTY, timeout=30_000)
            kernel = page.evaluate(KERNEL_ID)

            # Reload with the kernel alive: the record is redrawn from the file, the panel from the kernel.
            page.reload(wait_until="domcontentloaded")
            _open_notebook(page, url)
            assert _saved_record_bars(notebook) == 2 * (5 + 1)  # per plan: a bar per category and its speed
            assert notebook.stat().st_size < 1_000_000  # saved as JupyterLab saves it, the panel's cell included
            assert _wait_for_record(page, cells.nth(1)) in (record_bars, -1)
            panel_bars = page.locator(".memlab-panel .js-plotly-plot .barlayer .trace.bars .point")
            expect(panel_bars.first).to_be_visible(timeout=60_000)
            assert panel_bars.count() >= 5
            expect(_tick_labels(page.locator(".memlab-panel .js-plotly-plot"))).to_contain_text(["plain"])
            page.screenshot(path=str(ARTIFACTS / "reload.png"), full_page=True)

            # Shut the kernel down and reload: what the %%memfit run left needs no kernel.
            request = urllib.request.Request(f"{base}/api/kernels/{kernel}?token={token}", method="DELETE")
            with urllib.request.urlopen(request, timeout=30) as response:
                assert response.status == 204
            page.reload(wait_until="domcontentloaded")
            page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell", timeout=60_000)
            page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=60_000)
            assert _wait_for_record(page, cells.nth(1)) in (record_bars, -1)
            outputs = cells.nth(1).locator(".jp-OutputArea").inner_text()
            assert "FigureWidget(" not in outputs and "Error displaying widget" not in outputs
            cells.nth(1).screenshot(path=str(ARTIFACTS / "reload-memfit-without-kernel.png"))
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "reload-failed.png"), full_page=True)  # to see what went wrong
            raise
        finally:
            browser.close()


OVERLAPS = """elements => {
    const boxes = elements.map(element => element.getBoundingClientRect()).filter(box => box.width && box.height);
    const overlaps = [];
    for (let i = 0; i < boxes.length; i++) {
        for (let j = i + 1; j < boxes.length; j++) {
            const a = boxes[i], b = boxes[j];
            if (a.left < b.right - 1 && b.left < a.right - 1 && a.top < b.bottom - 1 && b.top < a.bottom - 1) {
                overlaps.push([elements[i].textContent, elements[j].textContent]);
            }
        }
    }
    return overlaps;
}"""


def test_a_budget_search_of_forty_plans_is_readable_in_a_browser(tmp_path: Path) -> None:
    """Forty plans, as a budget search makes them, drawn by Chromium: the record's SVG (what a saved notebook shows)
    and the plotly figure (what a live run shows). No two texts of the SVG touch, nor two tick labels of plotly's;
    the screenshots in tests/artifacts/ are for a person to look at."""
    from playwright.sync_api import sync_playwright
    from reports import report_of

    from memlab.report.static import report_svg

    _require_chromium()
    report = report_of(40)
    page_html = tmp_path / "plotly.html"
    report.plot().write_html(page_html, include_plotlyjs=True, full_html=True)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1000, "height": 900})
            page.set_content(f"<html><body style='margin:8px'>{report_svg(report)}</body></html>")
            svg = page.locator("svg").first
            assert svg.locator('rect[class="bar"]').count() > 40
            assert svg.locator("text").evaluate_all(OVERLAPS) == []
            svg.screenshot(path=str(ARTIFACTS / "fit-40-plans.png"))

            page.goto(page_html.as_uri(), wait_until="load")
            plot = page.locator(".js-plotly-plot").first
            plot.locator(".barlayer .trace.bars .point").first.wait_for(timeout=30_000)
            for axis in ("x", "x2"):  # forty plans are numbered (every fifth shown), each panel's own axis
                ticks = plot.locator(f".xaxislayer-above .{axis}tick text")
                assert ticks.count() >= 40 // 5
                assert ticks.evaluate_all(OVERLAPS) == [], axis
            assert plot.locator(".legend text").evaluate_all(OVERLAPS) == []
            page.screenshot(path=str(ARTIFACTS / "fit-40-plans-plotly.png"), full_page=True)
        finally:
            browser.close()
