"""Sphinx configuration of memlab's site: ``python -m sphinx -W --keep-going -b html docs docs/_build/html``.

MyST markdown pages (every ``docs/*.md`` joins the site by itself), the API reference from the docstrings
(autodoc), the benchmark tables from the committed JSON and the workshop notebooks executed on the CPU at CI's small
sizes (``docs/_ext/memlab_docs.py``). ``MEMLAB_DOCS_NOTEBOOKS=02_gradient_checkpointing`` builds with that notebook
alone, for a quick look.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path[:0] = [str(ROOT), str(DOCS / "_ext")]

# The notebooks' kernels inherit this environment: the checkout's memlab, one torch thread (the small models run
# as fast on one, and threads that wait for a busy core are many times slower), plotly's figures with plotly.js
# inside the page (the site must draw them with no network).
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("PLOTLY_RENDERER", "notebook")

import memlab_docs  # noqa: E402

memlab_docs.write_notebooks()

project = "memlab"
author = "the memlab authors"
copyright = "2026, the memlab authors"
release = "0.1.0"

extensions = ["myst_nb", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.viewcode", "memlab_docs"]
exclude_patterns = ["_build", "_ext", "**.ipynb_checkpoints"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# Executed once and kept in docs/_build/.jupyter_cache: a later build runs only the notebooks that changed.
nb_execution_mode = os.environ.get("MEMLAB_DOCS_EXECUTE", "cache")
nb_execution_cache_path = str(DOCS / "_build" / ".jupyter_cache")
nb_execution_timeout = 300
nb_execution_raise_on_error = True
nb_execution_in_temp = True
nb_merge_streams = True
# No request outside the site: myst-nb's widget manager and its require.js come from CDNs (the pages keep each
# widget's static record, which needs neither); MathJax is taken out, Sphinx's and the one plotly's notebook
# renderer adds to each figure (memlab_docs.no_mathjax_from_a_cdn, no_script_from_a_cdn).
nb_ipywidgets_js: dict[str, dict[str, str]] = {}

autodoc_member_order = "bysource"
autodoc_typehints = "description"
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "furo"
html_title = "memlab"
# One copy of plotly.js for the whole site, which the browser keeps after the first page with a figure. It loads
# first: after require.js (which myst-nb adds for widgets) it would register as a module and leave no `Plotly`.
html_static_path = [str(DOCS / "_build" / "_static_generated")]
html_js_files = [(memlab_docs.write_plotlyjs(DOCS / "_build" / "_static_generated"), {"priority": 1})]
