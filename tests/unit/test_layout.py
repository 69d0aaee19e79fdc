"""The layout's rules (CONTRIBUTING.md), checked on the source: modules meet at public seams, the core stays free of
the Jupyter layer, and run options are declared once."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import memlab
from memlab.options import RunKeywords, RunOptions, TrialKeywords

PACKAGE = Path(memlab.__file__).parent


def _modules() -> dict[str, ast.Module]:
    trees = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = ".".join(("memlab", *path.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(".__init__")
        trees[name] = ast.parse(path.read_text(), filename=str(path))
    return trees


def _imports(tree: ast.Module) -> list[tuple[str, str]]:
    """``(module, name)`` for every ``from memlab... import name`` anywhere in the file (lazy imports too)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("memlab"):
            found += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, "") for alias in node.names if alias.name.startswith("memlab")]
    return found


def test_no_module_imports_another_modules_private_names() -> None:
    offenders = [
        f"{module} imports {name} from {source}"
        for module, tree in _modules().items()
        for source, name in _imports(tree)
        if name.startswith("_") and not name.endswith("__") and source != module
    ]
    assert offenders == []


def test_the_core_never_imports_the_jupyter_layer() -> None:
    offenders = [
        f"{module} imports {source}"
        for module, tree in _modules().items()
        if not module.startswith("memlab.frontends.jupyter") and module != "memlab"
        for source, _ in _imports(tree)
        if source.startswith("memlab.frontends.jupyter")
    ]
    assert offenders == []


def test_the_run_keywords_are_the_run_options() -> None:
    fields = [field.name for field in dataclasses.fields(RunOptions)]
    assert sorted(RunKeywords.__annotations__) == sorted(fields)
    assert sorted(TrialKeywords.__annotations__) == sorted(set(fields) - {"loss_fn"})
    defaults = RunOptions()
    assert RunOptions.from_keywords(defaults.keywords()) == defaults
