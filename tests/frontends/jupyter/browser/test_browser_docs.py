"""Issue 49: the documentation site, opened in headless Chromium: the home page with memlab's figure, a workshop
notebook rendered with its outputs and its figure, an API page made from the docstrings, and the search.

The site is built here as CI builds it (``python -m sphinx -W --keep-going``: a warning fails), but reduced: one
notebook (02, among the quickest) instead of fourteen, so that the build takes about a minute rather than several
(``.ci/run`` builds the whole site after the tests). Screenshots go to ``tests/artifacts/docs-*.png``.
"""

from __future__ import annotations

import functools
import http.server
import os
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
from browser_lab import ARTIFACTS, REPO

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]

NOTEBOOK = "02_gradient_checkpointing"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The reduced site, built with warnings as errors and served over HTTP; yields its address."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "MEMLAB_DOCS_NOTEBOOKS": NOTEBOOK, "PYTHONPATH": str(REPO)}
    build = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", "docs", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=540,
    )
    assert build.returncode == 0, (build.stdout + build.stderr)[-4000:]
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(out))
    handler.log_message = lambda *args: None  # type: ignore[method-assign]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def page(chromium):  # type: ignore[no-untyped-def]
    page = chromium.new_page(viewport={"width": 1300, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    # Issue 61 item 9: every request stays on the site (require.js, the widget manager and MathJax came from CDNs:
    # 3 to 5 failed requests a page offline).
    outside: list[str] = []
    page.on("request", lambda request: outside.append(request.url)
            if not request.url.startswith(("http://127.0.0.1", "data:", "blob:", "about:")) else None)
    yield page
    page.close()
    assert not errors, errors
    assert not outside, outside


def _shot(page, name: str) -> None:  # type: ignore[no-untyped-def]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"docs-{name}.png"), full_page=False)


def test_home_shows_memlab_s_figure_and_every_page_of_docs(site: str, page) -> None:  # type: ignore[no-untyped-def]
    page.goto(f"{site}/index.html")
    figure = page.locator("article img[src*='quickstart']")
    assert figure.evaluate("img => img.complete && img.naturalWidth") > 300, "the figure did not load"
    links = set(page.locator(".sidebar-tree a").evaluate_all("links => links.map(a => a.getAttribute('href'))"))
    for source in sorted((REPO / "docs").glob("*.md")):
        if source.stem != "index":
            assert f"{source.stem}.html" in links, f"docs/{source.name} is not in the site's navigation: {links}"
    _shot(page, "home")


def test_a_notebook_page_has_its_outputs_and_its_figure(site: str, page) -> None:  # type: ignore[no-untyped-def]
    page.goto(f"{site}/notebooks/{NOTEBOOK}.html")
    article = page.locator("article")
    assert "executed on a CPU when this site was built" in article.inner_text()
    assert page.locator(".cell_output").count() >= 3, "the notebook's outputs are missing"
    plot = page.locator(".js-plotly-plot .main-svg").first
    plot.wait_for(timeout=30_000)
    box = plot.bounding_box()
    assert box is not None and box["width"] > 300 and box["height"] > 200, box
    assert page.locator(".js-plotly-plot .bars path, .js-plotly-plot .trace").count() > 0, "an empty figure"
    plot.scroll_into_view_if_needed()
    _shot(page, "notebook")


def test_the_api_page_is_made_from_the_docstrings(site: str, page) -> None:  # type: ignore[no-untyped-def]
    page.goto(f"{site}/api.html")
    fit = page.locator("[id='memlab.fit']")
    assert fit.count() == 1, "memlab.fit has no entry"
    text = fit.locator("xpath=..").inner_text()
    assert "budget" in text and ">>>" in text, text[:500]  # the signature, and the docstring's example
    for name in ("memlab.Plan", "memlab.measure", "memlab.compare", "memlab.apply", "memlab.estimate"):
        assert page.locator(f"[id='{name}']").count() == 1, name
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    fit.locator("xpath=..").screenshot(path=str(ARTIFACTS / "docs-api.png"))  # memlab.fit's entry


def test_search_finds_the_page_about_a_lever(site: str, page) -> None:  # type: ignore[no-untyped-def]
    page.goto(f"{site}/search.html?q=checkpointing")
    results = page.locator("#search-results li")
    # Sphinx adds results page by page and then its summary: read them once the search has finished.
    page.locator("#search-results .search-summary").wait_for(timeout=30_000)
    found = " ".join(results.evaluate_all("items => items.map(li => li.innerText + ' ' + li.innerHTML)"))
    assert results.count() >= 3 and "levers.html" in found, found[:500]
    _shot(page, "search")
