"""The examples in the docstrings of every memlab module run and print what they say.

Modules are found by walking the package, so a new module is covered without an edit here; every module with
public functions or classes must have at least one example (the few without are listed with the reason).
"""

from __future__ import annotations

import doctest
import importlib
import inspect
import pkgutil

import pytest

import memlab

# Modules that define nothing public of their own to show (entry points, re-exporting packages), and
# memlab.measure.cuda, whose examples need a GPU and are marked +SKIP (tests/gpu runs the same code there).
NO_EXAMPLES_NEEDED = {
    "memlab.__main__",
    "memlab.frontends",
    "memlab.frontends.jupyter",
    "memlab.runner",
    "memlab.techniques",
    "memlab.measure",
    "memlab.measure.cuda",
}


def _module_names() -> list[str]:
    names = ["memlab"]
    for info in pkgutil.walk_packages(memlab.__path__, prefix="memlab."):
        names.append(info.name)
    return sorted(names)


def _defines_public_api(module: object) -> bool:
    return any(
        (inspect.isfunction(value) or inspect.isclass(value))
        and getattr(value, "__module__", None) == module.__name__  # type: ignore[attr-defined]
        and not name.startswith("_")
        for name, value in vars(module).items()
    )


@pytest.mark.parametrize("name", _module_names())
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
    if name not in NO_EXAMPLES_NEEDED and _defines_public_api(module):
        assert result.attempted > 0, f"{name} has public functions or classes but no docstring examples"
