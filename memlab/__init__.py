"""memlab: fit training into GPU memory, interactively, on the model already in your kernel.

Example:
    >>> import memlab, torch
    >>> model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    >>> trial = memlab.measure(model, torch.randn(4, 8), memlab.Plan(), loss_fn=lambda m, b: m(b).mean())
    >>> trial.status
    'ok'
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memlab.apply import Applied, apply
from memlab.errors import MemlabError, UnsupportedTechnique
from memlab.estimate import estimate
from memlab.plan import Plan, parse_budget
from memlab.report import Report, Trial
from memlab.search import fit
from memlab.trial import compare, measure

if TYPE_CHECKING:
    from memlab.jupyter.panel import Panel

__version__ = "0.1.0"

__all__ = [
    "Applied",
    "MemlabError",
    "Plan",
    "Report",
    "Trial",
    "UnsupportedTechnique",
    "apply",
    "compare",
    "estimate",
    "fit",
    "load_ipython_extension",
    "measure",
    "panel",
    "parse_budget",
    "unload_ipython_extension",
]


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext memlab``: registers ``%%memfit``. IPython is imported only here, never by ``import memlab``."""
    from memlab.jupyter.magic import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext memlab`` (and so ``%reload_ext memlab``)."""
    from memlab.jupyter.magic import unload_ipython_extension as unload

    unload(ipython)


def panel(model: Any, batch: Any, loss_fn: Any = None, **keywords: Any) -> Panel:
    """The widget panel on the live model: a control per technique, Run, Apply/Undo, the live figure, every run.

    ipywidgets and plotly are imported here, on first use, never by ``import memlab``.

    Example:
        >>> import memlab, torch
        >>> p = memlab.panel(torch.nn.Linear(4, 1), torch.randn(8, 4), loss_fn=lambda m, b: m(b).mean(), steps=1)
        >>> p.run_button.click(); len(p.report)
        1
    """
    from memlab.jupyter.panel import panel as make_panel

    return make_panel(model, batch, loss_fn, **keywords)
