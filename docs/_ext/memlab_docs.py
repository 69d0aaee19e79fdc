"""What the site builds from the repository: the benchmark tables from the committed JSON, and the workshop
notebooks at CI's small sizes.

A page asks for a benchmark table with a fenced block ``{benchmark} NAME`` (``NAME``: a file in
``benchmarks/results/`` without ``.json``); the block is replaced, when the page is read, by the markdown that the
benchmark's own ``markdown()`` writes from that JSON, so the tables cannot drift from the results.

The notebooks are copied from ``notebooks/`` into ``docs/notebooks/`` (not committed) with the small sizes that
``tests/notebook_runs.py`` injects for CI after the ``parameters`` cell, and a first cell that says how the page was
made; myst-nb executes them during the build (:data:`ONLY` limits which, for a quick build).
"""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import nbformat

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
DOCS = ROOT / "docs"
OUT = DOCS / "notebooks"

EXECUTED = os.environ.get("MEMLAB_EXECUTED_NOTEBOOKS", "")
"""A folder of notebooks the tests executed at the same sizes (``tests/notebook_runs.py``): one there whose code is
the notebook's is shown with its outputs instead of being executed again."""

ONLY = os.environ.get("MEMLAB_DOCS_NOTEBOOKS", "")
"""Comma-separated notebook names (``02_gradient_checkpointing``) to put on the site; empty: all of them."""

PLOTLY_MIME = "application/vnd.plotly.v1+json"
SCRIPT = re.compile(r"(<script[^>]*>)(.*?)(</script>)", re.DOTALL)

BLOCK = re.compile(r"^```\{benchmark\}\s+(\S+)\s*\n```\s*$", re.MULTILINE)

NOTE = """\
```{{note}}
This page is the workshop notebook `notebooks/{name}`,
**executed on a CPU when this site was built**, at the small sizes CI uses (the cell after `parameters`). The
figures are the ones memlab draws; the numbers are that machine's, not a GPU's. Run it yourself with bigger sizes
(see [the workshop](../workshop.md)).
```
"""


def benchmark_markdown(name: str) -> str:
    """The markdown of benchmark result ``name`` (``benchmarks/results/NAME.json``), made by the benchmark's own
    ``markdown()`` from the committed JSON.

    Example:
        >>> "| run:section |" in benchmark_markdown("cuda_truth_estimates-cpu")
        True
    """
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    data = json.loads((RESULTS / f"{name}.json").read_text(encoding="utf-8"))
    if name.startswith("gpu_acceptance-"):
        return str(importlib.import_module("benchmarks.gpu_acceptance").markdown(data))
    if name.startswith("cli_timing-"):  # every run kept under its tag: the table is made from all of them
        return str(importlib.import_module("benchmarks.cli_timing").markdown(data))
    if name.startswith("estimate_vs_published-"):
        return importlib.import_module("benchmarks.estimate_vs_published").markdown(data["rows"])
    return str(data["markdown"])


def expand_benchmarks(text: str) -> str:
    """``text`` with every ``{benchmark} NAME`` block replaced by its table."""
    return BLOCK.sub(lambda match: benchmark_markdown(match.group(1)), text)


def notebook_names() -> list[str]:
    names = sorted(path.name for path in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    if ONLY:
        wanted = {name.strip().removesuffix(".ipynb") for name in ONLY.split(",")}
        names = [name for name in names if name.removesuffix(".ipynb") in wanted]
    return names


def write_notebooks() -> list[str]:
    """Copies the notebooks into ``docs/notebooks/`` with CI's small sizes and the note on top (a file is rewritten
    only when it changes, so that myst-nb's cache of executed notebooks stays valid); removes the others."""
    if str(ROOT / "tests") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests"))
    from notebook_runs import with_small_sizes

    OUT.mkdir(exist_ok=True)
    names = notebook_names()
    for name in names:
        nb = with_small_sizes(nbformat.read(ROOT / "notebooks" / name, as_version=4), name)
        nb = _executed(nb, name) or nb
        note = nbformat.v4.new_markdown_cell(NOTE.format(name=name))
        note["id"] = "built-on-cpu"
        nb.cells.insert(1, note)
        for cell in nb.cells:  # a solution folded in the notebook is folded on the page (myst-nb's tag)
            if cell.metadata.get("jupyter", {}).get("source_hidden"):
                cell.metadata["tags"] = [*cell.metadata.get("tags", []), "hide-input"]
        text = nbformat.writes(nb) + "\n"
        path = OUT / name
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
    for stale in set(OUT.glob("*.ipynb")) - {OUT / name for name in names}:
        stale.unlink()
    return names


def _code(nb: nbformat.NotebookNode) -> list[str]:
    return [cell.source for cell in nb.cells if cell.cell_type == "code"]


def _executed(nb: nbformat.NotebookNode, name: str) -> nbformat.NotebookNode | None:
    """The tests' run of ``nb`` (:data:`EXECUTED`), ready to show: plotly's figures (JSON only, as a kernel gives
    them) made HTML drawn by the site's one copy of plotly.js (:func:`write_plotlyjs`), and marked for myst-nb not
    to execute it again; None when there is none, or it ran other code."""
    path = Path(EXECUTED) / name if EXECUTED else None
    if path is None or not path.exists():
        return None
    executed = nbformat.read(path, as_version=4)
    if _code(executed) != _code(nb):
        return None
    import plotly.io

    for cell in executed.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if PLOTLY_MIME in data and "text/html" not in data:
                figure = data.pop(PLOTLY_MIME)  # myst-nb has no renderer for it: it would warn
                html = plotly.io.to_html(
                    {"data": figure.get("data", []), "layout": figure.get("layout", {})},
                    config=figure.get("config"), full_html=False, include_plotlyjs=False,
                )
                # The theme loads the site's scripts at the end of the page: draw once plotly.js is there.
                data["text/html"] = SCRIPT.sub(r'\1window.addEventListener("load", function () {\2});\3', html, count=1)

    executed.metadata["mystnb"] = {"execution_mode": "off"}
    return executed


def write_plotlyjs(folder: Path) -> str:
    """Writes plotly.js into ``folder`` (a static folder of the site) once, for every page's figures; returns its
    name. A notebook that myst-nb executes itself still carries its own copy (plotly's ``notebook`` renderer)."""
    from plotly.offline import get_plotlyjs

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "plotly.min.js"
    text = get_plotlyjs()
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")
    return path.name


def _source_read(app: Any, docname: str, source: list[str]) -> None:
    source[0] = expand_benchmarks(source[0])


def no_mathjax_from_a_cdn(app: Any, *_: Any) -> None:
    """Take out Sphinx's MathJax, which every page myst-nb builds would load from a CDN: the site has no maths, and
    makes no request outside itself (it is read offline, and behind firewalls)."""
    for listeners in app.events.listeners.values():
        for listener in list(listeners):
            if getattr(listener.handler, "__module__", "") == "sphinx.ext.mathjax":
                app.disconnect(listener.id)


CDN_SCRIPT = re.compile(r"""<script\b[^>]*\bsrc=["']https?://[^"']*["'][^>]*>\s*</script>""")
"""A script tag that loads from outside the site (plotly's ``notebook`` renderer writes MathJax's, from a CDN)."""


def no_script_from_a_cdn(app: Any, exception: Exception | None) -> None:
    """Take every script that loads from outside the site out of the pages built: a notebook that myst-nb executes
    shows plotly's figures through plotly's ``notebook`` renderer, which adds MathJax from a CDN to each (the
    figures have no maths: nothing is lost, and no request fails offline).

    Example:
        >>> CDN_SCRIPT.sub("", '<p>a</p><script src="https://cdn.example/mathjax.js"></script><script src="x.js">')
        '<p>a</p><script src="x.js">'
    """
    if exception is not None or getattr(app.builder, "format", "") != "html":
        return
    for page in Path(app.outdir).rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        kept = CDN_SCRIPT.sub("", text)
        if kept != text:
            page.write_text(kept, encoding="utf-8")


def setup(app: Any) -> dict[str, Any]:
    app.connect("source-read", _source_read)
    app.connect("builder-inited", no_mathjax_from_a_cdn)
    app.connect("build-finished", no_script_from_a_cdn)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
