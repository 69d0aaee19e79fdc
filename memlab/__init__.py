"""memlab: fit training into GPU memory, interactively, on the model already in your kernel.

Example:
    >>> import memlab, torch
    >>> model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    >>> trial = memlab.measure(model, torch.randn(4, 8), memlab.Plan(), loss_fn=lambda m, b: m(b).mean())
    >>> trial.status
    'ok'
"""

from __future__ import annotations

from typing import Any

from memlab.apply import Applied, apply
from memlab.errors import MemlabError, UnsupportedTechnique
from memlab.estimate import estimate
from memlab.plan import Plan, parse_budget
from memlab.report import Report, Trial
from memlab.trial import compare, measure

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
    "load_ipython_extension",
    "measure",
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
