"""Writes the workshop notebooks (``NN_name.ipynb``) from their sources in ``src/`` (jupytext percent format).

Edit ``notebooks/src/NN_name.py``, then run ``python notebooks/sync.py``. ``--check`` writes nothing and names the
notebooks that differ from their sources, and the sources whose shared cells differ from ``src/_template.py`` (the
tests run it too).

What the written notebooks guarantee: no outputs, deterministic cell ids (``nbNN-II``), the cell tags and the
``jupyter`` metadata of the sources (the ``parameters`` tag, folded solutions), and the same kernelspec.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jupytext
import nbformat
from nbformat import NotebookNode

HERE = Path(__file__).resolve().parent
SOURCES = HERE / "src"
TEMPLATE = SOURCES / "_template.py"

KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
KEPT_METADATA = ("tags", "jupyter")
LANGUAGE_INFO = {
    "codemirror_mode": {"name": "ipython", "version": 3}, "file_extension": ".py", "mimetype": "text/x-python",
    "name": "python", "nbconvert_exporter": "python", "pygments_lexer": "ipython3",
}
"""What ipykernel tells JupyterLab about the language, which JupyterLab writes into the notebook on every save: all
of it but ``version`` (the kernel's Python, 3.11.7 on one machine and 3.12.1 on the next), so that a notebook run,
cleared and saved differs from the committed file by that one line alone
(tests/frontends/jupyter/browser/test_browser_save.py)."""


def sources() -> list[Path]:
    """The notebook sources, in order (``_template.py`` is not a notebook)."""
    return sorted(path for path in SOURCES.glob("[0-9][0-9]_*.py"))


def build(source: Path) -> NotebookNode:
    """The notebook written from ``source``: nbformat v4, deterministic cell ids, no outputs."""
    stem = source.name.split("_", 1)[0]
    text = jupytext.reads(source.read_text(encoding="utf-8"), fmt="py:percent")
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nb.metadata["language_info"] = {key: (dict(value) if isinstance(value, dict) else value)
                                    for key, value in LANGUAGE_INFO.items()}
    for index, read in enumerate(text.cells):
        if read.cell_type == "markdown":
            cell = nbformat.v4.new_markdown_cell(read.source)
        else:
            cell = nbformat.v4.new_code_cell(read.source)
        cell.metadata.update({key: read.metadata[key] for key in KEPT_METADATA if key in read.metadata})
        cell["id"] = f"nb{stem}-{index:02d}"
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


def render(nb: NotebookNode) -> str:
    return nbformat.writes(nb) + "\n"


def _code_cells(path: Path) -> list[str]:
    nb = jupytext.reads(path.read_text(encoding="utf-8"), fmt="py:percent")
    return [cell.source for cell in nb.cells if cell.cell_type == "code"]


def _is_import(line: str) -> bool:
    return line.startswith(("import ", "from "))


def template_drift(source: Path) -> list[str]:
    """How the shared cells of ``source`` differ from the template's, in words (empty: they agree).

    The shared cells are the template's first three code cells: the setup cell (a notebook may add import lines),
    the parameters cell (a notebook may add lines after the shared ones) and the device cell (as it is). The setup
    cell is a notebook's first code cell; the others are found by their first line. The template's later cells (the
    model, the exercise) are a starting point that notebooks change.
    """
    setup, parameters, *exact = _code_cells(TEMPLATE)[:3]
    cells = _code_cells(source)
    problems = []
    own = [line for line in cells[0].splitlines() if not (_is_import(line) and line not in setup.splitlines())]
    if own != setup.splitlines():
        problems.append("the setup cell (other than its own import lines)")
    firsts = {cell.splitlines()[0]: cell for cell in cells if cell}
    first = parameters.splitlines()[0]
    if first in firsts and not firsts[first].startswith(parameters):
        problems.append("the parameters cell's shared lines")
    for shared in exact:
        first = shared.splitlines()[0]
        if first in firsts and firsts[first] != shared:
            problems.append(f"the cell starting {first!r}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; name the notebooks out of date")
    args = parser.parse_args(argv)
    stale, drifted = [], []
    for source in sources():
        drift = template_drift(source)
        if drift:
            drifted.append(f"{source.name}: {', '.join(drift)} differ from src/_template.py")
        path = HERE / f"{source.stem}.ipynb"
        text = render(build(source))
        if path.exists() and path.read_text(encoding="utf-8") == text:
            continue
        stale.append(path.name)
        if not args.check:
            path.write_text(text, encoding="utf-8")
    orphans = sorted({path.stem for path in HERE.glob("*.ipynb")} - {source.stem for source in sources()})
    for line in drifted:
        print(line)
    if orphans:
        print("notebooks without a source in src/:", ", ".join(orphans))
    if args.check and stale:
        print("out of date (run python notebooks/sync.py):", ", ".join(stale))
    elif not args.check:
        print(f"wrote {len(stale)} of {len(sources())} notebooks" if stale else "all notebooks up to date")
    return 1 if drifted or orphans or (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
