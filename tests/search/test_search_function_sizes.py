"""No function in ``memlab/search/`` is over 80 lines of code (issue 87: ``fit``'s 155-line ``_fit_module_here`` was
cut into steps, ``memlab/search/fitting/``). A line of code is one that is neither blank, nor a comment, nor part of
the function's docstring; a nested function counts in the function that holds it. Every module counts:
``limits_trainer.py`` too, since GRPO's arithmetic moved to its kind's facet (``memlab/kinds/grpo/sizes.py``)."""

from __future__ import annotations

import ast
from pathlib import Path

import memlab

SEARCH = Path(memlab.__file__).parent / "search"
MOST = 80


def code_lines(source: str, function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """The lines of code of ``function`` in ``source``: neither blank, nor a comment, nor its docstring's."""
    lines = source.splitlines()
    first = function.body[0]
    docstring: range = range(0)
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        docstring = range(first.lineno, (first.end_lineno or first.lineno) + 1)
    numbers = range(function.lineno, (function.end_lineno or function.lineno) + 1)
    code = [lines[number - 1].strip() for number in numbers if number not in docstring]
    return sum(1 for line in code if line and not line.startswith("#"))


def long_functions(folder: Path = SEARCH, most: int = MOST) -> dict[str, int]:
    """Every function of ``folder``'s modules over ``most`` lines of code, as
    ``"module.py:name"`` to its lines."""
    found = {}
    for path in sorted(folder.rglob("*.py")):
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and code_lines(source, node) > most:
                found[f"{path.relative_to(folder).as_posix()}:{node.name}"] = code_lines(source, node)
    return found


def test_no_function_in_search_is_over_80_lines_of_code() -> None:
    assert long_functions() == {}


def test_the_count_finds_a_long_function(tmp_path: Path) -> None:
    body = "\n".join(f"    x{number} = {number}  # a line" for number in range(81))
    (tmp_path / "long.py").write_text(f'def long():\n    """Doc."""\n    # a comment\n\n{body}\n')
    (tmp_path / "short.py").write_text("def short():\n    return 1\n")
    assert long_functions(tmp_path) == {"long.py:long": 82}
