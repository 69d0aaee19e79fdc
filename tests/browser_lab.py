"""What the browser tests share: a Jupyter server (JupyterLab or Notebook 7) in a temporary directory, headless
Chromium through Playwright, and the page helpers. The fixtures are registered in ``conftest.py`` beside this file,
so that every browser test module (``test_browser*.py``) gets the same server and browser."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

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


REPO = Path(__file__).resolve().parents[1]


ARTIFACTS = REPO / "tests" / "artifacts"


START_TIMEOUT_S = 90


KERNEL_TIMEOUT_MS = 150_000


RUN_TIMEOUT_MS = 120_000


DRAW_TIMEOUT_MS = 150_000
"""How long a figure may take to be drawn once its cell ran: plotly lays a figure out in the page's one thread, which
a loaded machine (the suite beside it, another process on the second core) slows many times over."""
CHECKPOINTING_BOX = ".widget-dropdown:has(label:text-is('checkpointing')) select"
"""The panel's checkpointing drop-down (off, every block or k of the model's blocks): the select labelled
checkpointing."""


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


# Texts shown cut short (an ellipsis, or clipped), and tables that reach past the right edge of their output area.
CONTROL_NAMES = ".widget-label, .widget-label-basic, .widget-label-basic span"


CUT_SHORT = """elements => elements.filter(element => element.offsetWidth > 0 && element.textContent.trim()
    && element.scrollWidth > element.clientWidth + 1).map(element => element.textContent)"""


TABLES_OUTSIDE = """areas => areas.flatMap(area => {
    const box = area.getBoundingClientRect();
    const input = area.closest(".jp-Cell")?.querySelector(".jp-InputArea");
    const cell = JSON.stringify((input ? input.textContent : "").trim().slice(0, 60));
    return [...area.querySelectorAll("table")].map(table => table.getBoundingClientRect())
        .filter(table => table.width > 0 && table.right > box.right + 1)
        .map(table => `a table at ${Math.round(table.left)}-${Math.round(table.right)} px in an output area at `
             + `${Math.round(box.left)}-${Math.round(box.right)} px `
             + `under the cell starting ${cell}`);
})"""


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


def _write_notebook(path: Path, cells: tuple[str, ...] | list[Any] = (CELL,)) -> None:
    import nbformat

    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(cell) if isinstance(cell, str) else cell for cell in cells]
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
    # No "Select Kernel" dialog; every cell drawn, also below the fold (the test measures them all).
    tracker.write_text(json.dumps({"autoStartDefaultKernel": True, "windowingMode": "none"}))
    env = dict(os.environ)
    env.update(
        JUPYTER_CONFIG_DIR=str(config),
        JUPYTER_RUNTIME_DIR=str(root / "runtime"),
        JUPYTERLAB_SETTINGS_DIR=str(settings),
        JUPYTERLAB_WORKSPACES_DIR=str(root / "workspaces"),
        PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        TOKENIZERS_PARALLELISM="false",
        OMP_NUM_THREADS="1",  # the kernels: steadier on a shared 2-core machine, and tiny models gain nothing
    )
    return env


FRONT_ENDS = {
    # name: (command after ``python -m``, options of that front end, where a notebook's page is, screenshot)
    "lab": (
        ["jupyter", "lab"],
        ["--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        "lab/tree",
        "panel.png",
    ),
    "notebook": (["notebook"], [], "notebooks", "panel-notebook7.png"),
}


@dataclasses.dataclass
class Server:
    """A Jupyter server on localhost: its front end, base URL, token, and the folder it serves."""

    front_end: str
    base: str
    token: str
    root: Path

    def open(self, name: str, cells: tuple[str, ...]) -> tuple[str, Path]:
        """Write a notebook of ``cells`` as ``name``; its page's URL and its file."""
        path = self.root / name
        _write_notebook(path, cells)
        return f"{self.base}/{FRONT_ENDS[self.front_end][2]}/{name}?token={self.token}", path

    def shut_down_kernels(self) -> None:
        """Shut every kernel down, and forget the workspace (JupyterLab would reopen this test's notebook beside
        the next test's)."""
        for workspace in (self.root.parent / "workspaces").glob("*.jupyterlab-workspace"):
            workspace.unlink()
        for kernel in self._kernels():
            url = f"{self.base}/api/kernels/{kernel['id']}?token={self.token}"
            try:
                with urllib.request.urlopen(urllib.request.Request(url, method="DELETE"), timeout=30) as response:
                    assert response.status == 204
            except urllib.error.HTTPError as error:
                if error.code != 404:  # 404: it ended between the listing and now
                    raise

    def _kernels(self, tries: int = 5) -> list[dict[str, Any]]:
        """The running kernels' models. A listing that meets a kernel in the middle of its start answers 500
        (jupyter_server 2.21 puts a starting kernel in its table an event-loop turn before it gives it the
        ``last_activity`` that the listing reads; a CI run met it as a reload's kernel started): ask again."""
        for attempt in range(tries):
            try:
                with urllib.request.urlopen(f"{self.base}/api/kernels?token={self.token}", timeout=30) as response:
                    return list(json.load(response))
            except urllib.error.HTTPError as error:
                if error.code != 500 or attempt == tries - 1:
                    raise
                time.sleep(0.5)
        raise AssertionError("unreachable")


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One JupyterLab for every browser test of the process (a server starts in 5 to 20 s, and its first notebook
    page builds JupyterLab's assets; the browser tests run in one pytest-xdist worker: tests/conftest.py)."""
    with _serve("lab", tmp_path_factory.mktemp("lab")) as server:
        yield server


@pytest.fixture(scope="session")
def chromium() -> Iterator[Any]:
    """One headless Chromium for every browser test of the process; each test opens its own page."""
    from playwright.sync_api import sync_playwright

    _require_chromium()
    playwright = sync_playwright().start()
    browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
    try:
        yield browser
    finally:
        browser.close()
        playwright.stop()


@pytest.fixture(params=sorted(FRONT_ENDS))
def jupyter_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A Jupyter server serving the panel notebook; yields (front end, the notebook's URL)."""
    front_end: str = request.param
    if front_end == "lab":
        lab: Server = request.getfixturevalue("lab")
        yield front_end, lab.open("panel.ipynb", (CELL,))[0]
        lab.shut_down_kernels()
        return
    with _serve(front_end, tmp_path) as server:
        yield front_end, server.open("panel.ipynb", (CELL,))[0]


@pytest.fixture
def lab_with_memfit_and_panel(lab: Server) -> Iterator[tuple[str, str, Path]]:
    """JupyterLab serving a notebook with a ``%%memfit`` cell and a panel cell; yields (base URL, token, its file)."""
    _, path = lab.open("reload.ipynb", RELOAD_CELLS)
    yield lab.base, lab.token, path
    lab.shut_down_kernels()


@contextlib.contextmanager
def _serve(front_end: str, tmp_path: Path) -> Iterator[Server]:
    _require_chromium()
    if front_end == "notebook" and importlib.util.find_spec("notebook") is None:
        pytest.skip("Notebook 7 is not installed (pip install 'notebook>=7')")
    module, options, _, _ = FRONT_ENDS[front_end]
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
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
            yield Server(front_end, f"http://127.0.0.1:{port}", token, notebooks)
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
        # pictures larger than an icon, and SVG records (which have no size of their own: they take their cell's width)
        "images => images.filter(image => image.naturalWidth > 300 || image.src.startsWith('data:image/svg+xml'))"
        ".map(image => decodeURIComponent(image.src))"
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


NOTEBOOK_06 = REPO / "notebooks" / "06_memfit_and_panel.ipynb"


SMALL_06 = "hidden, layers, vocab, rows, seq_len, steps, noise = 32, 2, 128, 4, 16, 1, 0  # small sizes for the test"


TRY_24 = (
    "%%memfit model batch --try micro_batch=1,2,4 checkpointing=off,on precision=fp32,bf16 loss=full,chunked "
    "--steps 1 --noise 0"
)


ALL_RAN = """upTo => {
    const notebook = window.jupyterapp.shell.currentWidget;
    const cells = notebook.content.widgets.slice(0, upTo).filter(cell => cell.model.type === "code");
    const kernel = notebook.sessionContext.session && notebook.sessionContext.session.kernel;
    return Boolean(kernel && kernel.status === "idle") && cells.every(cell => cell.model.executionCount !== null);
}"""


SOURCES = """() => window.jupyterapp.shell.currentWidget.content.widgets.map(
    cell => cell.model.type === "code" ? cell.model.sharedModel.getSource() : "")"""


# The figures of a cell's outputs as drawn (SVG records and plotly's pictures are <img>s, live plotly figures
# plots; hidden ones left out), and the size of each.
FIGURES = """area => [...area.querySelectorAll("img, .js-plotly-plot")].filter(
    element => element.getClientRects().length && (element.tagName !== "IMG" || element.getAttribute("src"))
).map(element => {
    const box = element.getBoundingClientRect();
    return {kind: element.tagName === "IMG" ? element.src.slice(0, 20) : "plotly",
            width: Math.round(box.width), height: Math.round(box.height)};
})"""


# Pairs of texts whose glyphs overlap: a box per character (a rotated label's bounding box would cover its
# neighbours' empty corners), compared between different texts.
GLYPHS_OVERLAP = """elements => {
    const boxes = [];
    elements.forEach((element, owner) => {
        const walker = document.createTreeWalker(element, NodeFilter.SHOW_TEXT);
        for (let node = walker.nextNode(); node; node = walker.nextNode()) {
            for (let i = 0; i < node.length; i++) {
                if (!node.data[i].trim()) continue;
                const range = document.createRange();
                range.setStart(node, i);
                range.setEnd(node, i + 1);
                const box = range.getBoundingClientRect();
                if (box.width && box.height) boxes.push([owner, box]);
            }
        }
    });
    const pairs = new Set();
    for (let i = 0; i < boxes.length; i++) {
        for (let j = i + 1; j < boxes.length; j++) {
            const [p, a] = boxes[i], [q, b] = boxes[j];
            const touch = a.left < b.right - 1 && b.left < a.right - 1 && a.top < b.bottom - 1 && b.top < a.bottom - 1;
            if (p !== q && touch) {
                pairs.add(JSON.stringify([elements[p].textContent, elements[q].textContent]));
            }
        }
    }
    return [...pairs].map(pair => JSON.parse(pair));
}"""


# Texts of a plotly figure that a person reads: titles, axis titles, tick labels, legends and the points' names.
PLOTLY_TEXTS = ".annotation-text, .g-xtitle text, .g-ytitle text, .xtick text, .ytick text, .legendtext, .textpoint"


# After notebook 06 and a click on its panel's Run (the plain plan, the controls as they start): the plain peak that
# the first %%memfit cell measured (the first Report in Out) and the panel's, on one line.
PEAKS_06 = """memfit_report = next(value for _, value in sorted(Out.items()) if isinstance(value, memlab.Report))
memfit_plain = next(trial for trial in memfit_report if trial.label == "plain")
panel_plain = board.report.trials[-1]
print("PEAKS", memfit_plain.peak_bytes, panel_plain.peak_bytes, panel_plain.label, panel_plain.preexisting_bytes)"""


def _notebook_06_cells() -> list[Any]:
    """Notebook 06 with small sizes after its parameters cell, the cell that reads the plain peaks (after the
    panel's Run is clicked) and the 24-plan cell at its end."""
    import nbformat

    cells = list(nbformat.read(NOTEBOOK_06, as_version=4).cells)
    at = next(i for i, cell in enumerate(cells) if "parameters" in cell.metadata.get("tags", []))
    return [*cells[: at + 1], nbformat.v4.new_code_cell(SMALL_06), *cells[at + 1 :],
            nbformat.v4.new_code_cell(PEAKS_06), nbformat.v4.new_code_cell(TRY_24)]


def _panel_plain_against_memfit(page, cells, check: int) -> tuple[int, int, str, int]:  # type: ignore[no-untyped-def]
    """Click the panel's Run (in the browser, as a person does), wait for its result, run the ``check`` cell
    (:data:`PEAKS_06`) and read what it printed: %%memfit's plain peak, the panel's, its label, the bytes held."""
    panel = page.locator(".memlab-panel").first
    panel.locator("button", has_text="Run").first.click()
    page.wait_for_function(
        """() => [...document.querySelectorAll('.memlab-panel .memlab-status')].some(
            status => /plain: (fits|does not fit|error|peak)/.test(status.textContent))""",
        timeout=120_000, polling=500,
    )
    cells.nth(check).click()
    _run_until_done(page, "notebook:run-cell", check + 1, 60)
    text = cells.nth(check).locator(".jp-OutputArea").inner_text()
    words = next(line for line in text.splitlines() if line.startswith("PEAKS ")).split()
    return int(words[1]), int(words[2]), words[3], int(words[4])


def busy_elsewhere() -> str:
    """What keeps another core busy while a browser test runs: another pytest-xdist worker of the suite where the
    workers fill every core (on a 2-core machine, the other worker runs the rest of the suite meanwhile), else a
    process spinning (:func:`_spinning_core`)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return "the suite's other worker" if workers >= len(os.sched_getaffinity(0)) else "a process spinning"


@contextlib.contextmanager
def _spinning_core() -> Iterator[None]:
    """Another process busy on a core, as on a laptop that builds something or a shared Binder. Where the suite's
    other workers already fill the machine's other cores (:func:`busy_elsewhere`), a spinner would only take a core
    from them: nothing more is started."""
    if busy_elsewhere() != "a process spinning":
        yield
        return
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        spinner.kill()
        spinner.wait(timeout=15)


def _save(page) -> None:  # type: ignore[no-untyped-def]
    page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
    page.wait_for_function(NOT_DIRTY, timeout=30_000)


def _run_until_done(page, command: str, up_to: int, timeout_s: float) -> float:  # type: ignore[no-untyped-def]
    """Run a notebook command (not awaited: it settles only when the cells have run); seconds until the code cells
    before ``up_to`` have all run."""
    started = time.monotonic()
    page.evaluate(f"() => {{ window.jupyterapp.commands.execute('{command}'); }}")
    page.wait_for_timeout(1000)
    page.wait_for_function(ALL_RAN, arg=up_to, timeout=timeout_s * 1000, polling=500)
    return time.monotonic() - started


def _memlab_outputs(page) -> dict[int, str]:  # type: ignore[no-untyped-def]
    """The cells whose source runs memlab and shows something (index: source's first line)."""
    sources = page.evaluate(SOURCES)
    calls = ("%%memfit", "memlab.fit(", "memlab.panel(", ".plot()")
    return {index: source.splitlines()[0] for index, source in enumerate(sources) if any(c in source for c in calls)}


def _check_figures_and_tables(page, cells, memlab_cells: dict[int, str], live_list: int | None = None
                              ) -> None:  # type: ignore[no-untyped-def]
    """Every memlab cell shows its figure drawn (non-zero size) or its table, no widget error and no traceback;
    no table reaches past its output area. ``live_list``: a %%memfit cell saved while its timeline list was still open
    (no cell ran after it), whose list, a widget like the panel, needs its kernel: one widget error allowed there."""
    for index, first_line in memlab_cells.items():
        area = cells.nth(index).locator(".jp-OutputArea")
        text = area.inner_text()
        if index == live_list:
            text = text.replace("Error displaying widget: model not found", "", 1)
        assert "Error displaying widget" not in text and "Traceback" not in text, (first_line, text[:300])
        if "%%memfit" in first_line and "--quiet" not in first_line or ".plot()" in first_line:
            figures = area.evaluate(FIGURES)
            assert figures and all(f["width"] > 300 and f["height"] > 200 for f in figures), (first_line, figures)
    # Each cell is looked at as a reader sees it, scrolled into view: JupyterLab lays out off-screen cells lazily
    # (content-visibility), so their boxes are not where they will be drawn.
    outside = []
    for index in range(cells.count()):
        cell = cells.nth(index)
        if cell.locator(".jp-OutputArea table").count():
            cell.scroll_into_view_if_needed()
            page.wait_for_timeout(200)
            found = cell.locator(".jp-OutputArea").evaluate_all(TABLES_OUTSIDE)
            if found:
                cell.screenshot(path=str(ARTIFACTS / f"table-outside-{index}.png"))
            outside += found
    assert outside == [], outside


def _readme_size_kb(what: str) -> float:
    """The size the docs state (``at most N kB``, in ``docs/jupyter.md``, moved there from the README) on its line
    about the saved notebook after ``what``."""
    import re

    text = (REPO / "docs" / "jupyter.md").read_text()
    found = re.search(rf"{re.escape(what)}[^.]*?at most (\d+) kB", text)
    assert found, f"docs/jupyter.md states no size for {what!r} ('... {what} ... at most N kB')"
    return float(found.group(1))

