"""The examples in the public docstrings run and print what they say, and every module listed has some."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "memlab",
    "memlab.plan",
    "memlab.batch",
    "memlab.apply",
    "memlab.step",
    "memlab.trial",
    "memlab.report",
    "memlab.export",
    "memlab.errors",
    "memlab.techniques.accumulation",
    "memlab.techniques.checkpointing",
    "memlab.techniques.precision",
    "memlab.techniques.optimizer",
    "memlab.techniques.offload",
    "memlab.measure.tracker",
    "memlab.measure.oom",
    "memlab.estimate",
    "memlab.estimate_cli",
    "memlab.jupyter.panel",
    "memlab.jupyter.live",
    "memlab.search",
    "memlab.cli",
    "memlab.events",
    "memlab.demo",
    "memlab.jupyter.magic",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0, f"{name} has no docstring examples"
    assert result.failed == 0
