"""The GPU kind is resolved once, where a name comes in (issue 87: the name was resolved again at 31 call sites in 18
files, and 25 signatures took ``GpuKind | str | None``): :func:`memlab.estimation.cuda.gpus.gpu_kind` is called only
by the entry points listed here, and below them every signature takes a :class:`GpuKind` (or None where none was
named, read through :func:`~memlab.estimation.cuda.gpus.kind_or_default`)."""

from __future__ import annotations

import ast
from pathlib import Path

import memlab
from memlab.estimation.cuda.gpus import GPUS, capped, kind_or_default

PACKAGE = Path(memlab.__file__).parent

ENTRIES = {
    "estimation/cuda/gpus.py": "gpu_kind itself (and the kinds it describes)",
    "estimation/estimate.py": "memlab.estimate",
    "search/fit.py": "memlab.fit",
    "search/limits.py": "memlab.limits",
    "frontends/cli/gpu.py": "the command line's --gpu, --gpu-memory and --gpu-capability",
    "frontends/jupyter/magic/run.py": "the magic's --gpu",
}
"""The modules that may resolve a GPU's name, each with the entry it is."""


def _is_entry(relative: str) -> bool:
    return relative in ENTRIES


def gpu_kind_calls(package: Path = PACKAGE) -> dict[str, list[int]]:
    """Where ``gpu_kind(...)`` is called in ``package``'s code (docstrings' examples aside): module to lines."""
    found: dict[str, list[int]] = {}
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
                if name == "gpu_kind":
                    found.setdefault(path.relative_to(package).as_posix(), []).append(node.lineno)
    return found


def name_or_kind_signatures(package: Path = PACKAGE) -> dict[str, list[str]]:
    """The parameters and fields of ``package`` annotated to take a GPU's name or its kind (an annotation naming
    both ``GpuKind`` and ``str``), outside :data:`ENTRIES`: module to ``function.parameter`` (or ``Class.field``)."""
    found: dict[str, list[str]] = {}
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        if _is_entry(relative):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            annotated: list[tuple[str, ast.expr | None]] = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                arguments = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
                annotated = [(f"{node.name}.{argument.arg}", argument.annotation) for argument in arguments]
            elif isinstance(node, ast.ClassDef):
                annotated = [(f"{node.name}.{item.target.id}", item.annotation) for item in node.body
                             if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)]
            for where, annotation in annotated:
                shown = ast.unparse(annotation) if annotation is not None else ""
                words = set(shown.replace("|", " ").replace(",", " ").split())
                if "GpuKind" in words and "str" in words:
                    found.setdefault(relative, []).append(where)
    return found


def test_gpu_kind_is_called_at_the_entries_only() -> None:
    assert {module: lines for module, lines in gpu_kind_calls().items() if not _is_entry(module)} == {}
    assert set(gpu_kind_calls()) <= set(ENTRIES)
    assert all((PACKAGE / module).exists() for module in ENTRIES)


def test_below_the_entries_a_signature_takes_the_kind_not_its_name() -> None:
    assert name_or_kind_signatures() == {}


def test_the_checks_find_a_call_and_a_signature_outside_the_entries(tmp_path: Path) -> None:
    (tmp_path / "below.py").write_text(
        "def card(gpu: GpuKind | str | None = None) -> int:\n"
        '    """gpu_kind(gpu) in a docstring is no call."""\n'
        "    return gpu_kind(gpu).memory_bytes\n")
    assert gpu_kind_calls(tmp_path) == {"below.py": [3]}
    assert name_or_kind_signatures(tmp_path) == {"below.py": ["card.gpu"]}


def test_below_the_entries_none_is_the_default_kind_and_a_kind_is_kept() -> None:
    assert kind_or_default(None) is GPUS["H100-80GB"]
    assert kind_or_default(GPUS["T4-16GB"]) is GPUS["T4-16GB"]
    assert capped(None, 10**13) is GPUS["H100-80GB"]
    assert capped(GPUS["T4-16GB"], 2**30).memory_bytes == 2**30
