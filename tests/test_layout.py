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


def _imports(tree: ast.Module, *, runtime: bool = False) -> list[tuple[str, str]]:
    """``(module, name)`` for every ``from memlab... import name`` anywhere in the file (lazy imports too); with
    ``runtime``, those that run: not the ones under ``if TYPE_CHECKING:`` (names for annotations only)."""
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if runtime and isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
        for inner in ast.walk(node)
    }
    found = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
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


# --- The shape of the package: what CONTRIBUTING.md's map shows is what the code is. ---

MAX_MODULE_LINES = 900  # high enough that no concept is cut to fit it (a lever whole in its module: issue 72)
MAX_TOP_LEVEL_MODULES = 6  # besides __init__ and __main__: errors, events, options, plan, seams, sizes


def _owner(module: str, known: set[str]) -> str:
    """The module an import of ``module`` lands in (``from memlab.a import b`` is memlab.a.b when b is a module)."""
    while module and module not in known:
        module = module.rpartition(".")[0]
    return module


def _landings(target: str, module: str, known: set[str]) -> list[str]:
    """The modules an import of ``target`` made by ``module`` runs: ``target`` and every package above it (their
    ``__init__`` files run first), but memlab itself and the packages ``module`` is in (already running)."""
    parts = target.split(".")
    ancestors = [".".join(parts[:end]) for end in range(2, len(parts) + 1)]
    return [name for name in ancestors if name in known and name != module and not module.startswith(name + ".")]


def import_graph() -> dict[str, set[str]]:
    """``{module: modules it imports}`` over memlab, function-level imports included (imports for type checking
    only are not: they never run), packages' ``__init__`` as the package's own node, and an import of a module
    counted as one of every package above it too (``from memlab.report.data import Trial`` runs
    ``memlab/report/__init__.py`` first: issue 87)."""
    trees = _modules()
    known = set(trees)
    graph: dict[str, set[str]] = {name: set() for name in known}
    for module, tree in trees.items():
        for source, name in _imports(tree, runtime=True):
            target = _owner(f"{source}.{name}" if f"{source}.{name}" in known else source, known)
            if target and target != "memlab":
                graph[module].update(_landings(target, module, known))
    return graph


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def test_circles_finds_a_circle_and_leaves_a_chain_alone() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_import_circle_at_all() -> None:
    """Every import counted, function-level ones included (issue 72), and the packages' ``__init__`` files an import
    runs (issue 87): the report's data and its views, the request and its routes, the adapters and their
    declarations, the command and its parts, the trainer's entry and the GRPO step, the Plan and its exports each
    import one way."""
    assert [sorted(found) for found in circles(import_graph())] == []


def test_the_import_graph_counts_the_packages_an_import_runs() -> None:
    known = set(_modules())
    assert _landings("memlab.report.views.tables", "memlab.runner.core", known) == [
        "memlab.report", "memlab.report.views", "memlab.report.views.tables"]
    # the packages the importer is in run already
    assert _landings("memlab.estimation.dryrun.fake", "memlab.estimation.dryrun.single_gpu", known) == [
        "memlab.estimation.dryrun.fake"]
    assert "memlab.report" not in import_graph()["memlab.report.data"]


def test_the_plan_imports_neither_the_exports_nor_the_trainer() -> None:
    """The Plan is data (issue 72): its ``to_*``/``from_*`` ask the seam ``"plan exports"`` (memlab/seams.py), which
    the package provides, instead of importing ``export/`` or ``trainer/``, at module level or inside a function."""
    graph = import_graph()
    assert {m for m in graph["memlab.plan"] if m.startswith(("memlab.export", "memlab.trainer"))} == set()
    assert "memlab.plan" in graph["memlab.export.engines"]


def _seams_declared(trees: dict[str, ast.Module]) -> dict[str, tuple[str, str, str]]:
    """``{seam: (module, variable, type)}`` for each ``NAME: Seam[T] = Seam("seam")`` in memlab (the layer that asks
    declares it)."""
    found = {}
    for module, tree in trees.items():
        for node in ast.walk(tree):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(node.annotation, ast.Subscript) and ast.unparse(node.annotation.value) == "Seam"
                    and isinstance(node.value, ast.Call) and isinstance(node.value.args[0], ast.Constant)):
                found[node.value.args[0].value] = (module, node.target.id, ast.unparse(node.annotation.slice))
    return found


def _provisions(tree: ast.Module) -> dict[str, str]:
    """``{seam: the loader's return annotation}`` for each ``provide("seam", loader)`` in ``tree`` (the package's)."""
    returns = {node.name: ast.unparse(node.returns) if node.returns else "" for node in tree.body
               if isinstance(node, ast.FunctionDef)}
    return {
        node.args[0].value: returns.get(ast.unparse(node.args[1]), "")
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "provide"
        and isinstance(node.args[0], ast.Constant)
    }


def _asked(tree: ast.Module) -> list[str]:
    """The argument of each ``provided(...)`` call in ``tree``, as written."""
    return [ast.unparse(node.args[0]) for node in ast.walk(tree)
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "provided" and node.args]


def test_every_seam_is_typed_and_provided_by_a_loader_of_its_type() -> None:
    """Each seam is declared typed by the layer that asks (``PLAN_EXPORTS: Seam[PlanExports]``), provided once by
    ``memlab/__init__.py`` through a loader annotated with that type (so that mypy holds what the loader returns,
    the module ``memlab.export`` itself, to the protocol the Plan calls), and asked for by its declaration, never by
    a string (issue 87)."""
    trees = _modules()
    declared = _seams_declared(trees)
    assert {"plan exports", "trainer kinds"} <= set(declared)
    assert _provisions(trees["memlab"]) == {seam: typed for seam, (_, _, typed) in declared.items()}
    variables = {variable for _, variable, _ in declared.values()}
    asked = {(module, argument) for module, tree in trees.items() if module != "memlab.seams"
             for argument in _asked(tree)}
    assert asked and {(module, argument) for module, argument in asked if argument not in variables} == set()
    assert ("memlab.plan", "PLAN_EXPORTS") in asked and declared["plan exports"][:2] == ("memlab.plan", "PLAN_EXPORTS")


def test_every_view_asked_for_is_registered() -> None:
    """Each ``view("...")`` in memlab (the report's data asking for what draws it) names a view that a module of
    ``memlab/report/views/`` registers as :mod:`memlab.report` imports it (issue 87: a misspelt name failed only when
    that view was drawn)."""
    import memlab.report  # noqa: F401  (registers every view)
    from memlab.report.views import view

    def registered(name: str) -> bool:
        try:
            return callable(view(name))
        except RuntimeError:
            return False

    asked = {
        (module, node.args[0].value)
        for module, tree in _modules().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "view" and node.args
        and isinstance(node.args[0], ast.Constant) and module != "memlab.report.views"
    }
    assert len(asked) >= 6
    assert {(module, name) for module, name in asked if not registered(name)} == set()
    names = [ast.unparse(node.args[0]) for tree in _modules().values() for node in ast.walk(tree)
             if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "view" and node.args
             and not isinstance(node.args[0], ast.Constant)]
    assert names == []  # every view is asked for by its name written out, which this test reads


ESTIMATION = "memlab.estimation"
# The estimation's subpackages, each importing only those after it (issue 62): the sharded estimates build on the
# one-device dry run, which builds on depth carrying, which builds on the CUDA emulation.
ESTIMATION_ORDER = ("memlab.estimation.sharded", "memlab.estimation.dryrun", "memlab.estimation.depth",
                    "memlab.estimation.cuda")


def _estimation_part(module: str) -> str:
    """The node of a module inside ``memlab/estimation/``: its subpackage (``memlab.estimation.dryrun``) or, for a
    module sitting directly in the folder, the module itself (``memlab.estimation.request``)."""
    return ".".join(module.split(".")[:3])


def layer_graph(trees: dict[str, ast.Module] | None = None) -> dict[str, set[str]]:
    """``{node: nodes it imports}`` where a node is one of memlab's packages (``memlab.report``: every module under
    ``memlab/report/``) or one of its top modules (``memlab.plan``), plus each module of ``memlab/report/`` as a node
    of its own (``memlab.report.data``), for the report's data model and its views, plus each subpackage of
    ``memlab/estimation/`` (``memlab.estimation.cuda``) and each module directly in it (``memlab.estimation.configs``)
    as a node of its own, for the estimation's parts. ``trees``: the modules read (default: memlab's own).

    Edges are every import a module makes: at module level, inside a function (a lazy import runs too, later), and
    for type checking (what the module needs to be type-checked); an import of a module inside a package runs the
    package's ``__init__`` too, which is the package's node. A layer that offers work done above it asks a seam
    (:mod:`memlab.seams`) or a registry (:mod:`memlab.report.views`) instead of importing it (issue 87: four lazy
    imports closed a circle of eight packages: export, report, trainer and runner imported back up)."""
    trees = _modules() if trees is None else trees
    known = set(trees)
    graph: dict[str, set[str]] = {}

    def layer(module: str) -> str:
        return ".".join(module.split(".")[:2])

    for module, tree in trees.items():
        if module == "memlab":
            continue
        graph.setdefault(layer(module), set())
        if module.startswith("memlab.report."):
            graph.setdefault(module, set())
        if module.startswith(ESTIMATION + "."):
            graph.setdefault(_estimation_part(module), set())
        for source, name in _imports(tree):
            target = _owner(f"{source}.{name}" if f"{source}.{name}" in known else source, known)
            if not target or target == "memlab":
                continue
            if layer(target) != layer(module):
                graph[layer(module)].add(layer(target))
                graph.setdefault(layer(target), set())
            elif module.startswith("memlab.report.") and target.startswith("memlab.report.") and target != module:
                graph[module].add(target)
                graph.setdefault(target, set())
            elif (module.startswith(ESTIMATION + ".") and target.startswith(ESTIMATION + ".")
                  and _estimation_part(target) != _estimation_part(module)):
                graph[_estimation_part(module)].add(_estimation_part(target))
                graph.setdefault(_estimation_part(target), set())
    return graph


def test_no_import_circle_between_memlab_layers() -> None:
    """No circle among memlab's packages and top modules, nor among the report's modules, nor among the estimation's
    subpackages and top modules (issue 62), every import counted: module level, inside functions, for type checking,
    and the packages' ``__init__`` files (issue 87): the Plan does not name the exports or the techniques that build
    on it, the report's views import its data model and never the reverse, the CUDA emulation never imports the dry
    runs built on it, and no layer reaches back up through a lazy import (what two layers need sits below both, in
    ``live/``, or beside the Plan)."""
    assert [sorted(c) for c in circles(layer_graph())] == []


def test_the_layer_graph_finds_a_circle_closed_by_a_lazy_import() -> None:
    """An import inside a function of the exports back up to the runner (as ``export/engines.py`` once took its
    quiet block from ``runner/quiet.py``) closes a circle: the runner applies plans to trainers, which read the
    exports."""
    trees = _modules()
    trees["memlab.export.bad"] = ast.parse("def f():\n    from memlab.runner.core import Runner\n")
    found = [sorted(c) for c in circles(layer_graph(trees))]
    assert any({"memlab.export", "memlab.runner"} <= set(c) for c in found), found


def test_the_layer_graph_sees_a_type_checking_import_and_the_report_modules() -> None:
    graph = layer_graph()
    assert {"memlab.plan", "memlab.techniques", "memlab.export", "memlab.report", "memlab.errors"} <= set(graph)
    assert "memlab.techniques" in graph["memlab.plan"] and "memlab.plan" in graph["memlab.export"]
    assert "memlab.report.data" in graph["memlab.report.views.figure"]
    assert "memlab.report.noise" in graph["memlab.report.data"]
    trees = _modules()
    trees["memlab.events.bad"] = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                           "    from memlab.plan import Plan\ndef f():\n"
                                           "    from memlab.export import pytorch_code\n")
    assert {"memlab.plan", "memlab.export"} <= layer_graph(trees)["memlab.events"]


def test_the_reports_data_never_imports_a_view() -> None:
    """The report's data (``memlab/report/`` outside ``views/``) asks the views' registry
    (``memlab/report/views/__init__.py``) for what draws it and imports no view module, at module level or inside a
    function; ``memlab/report/__init__.py`` imports the views, which registers them (issue 72)."""
    graph = import_graph()
    data = [m for m in graph if m.startswith("memlab.report.") and not m.startswith("memlab.report.views")]
    assert "memlab.report.data" in data
    drawn = {m: sorted(t for t in graph[m] if t.startswith("memlab.report.views.")) for m in data}
    assert {m: views for m, views in drawn.items() if views} == {}


def test_the_estimation_parts_import_one_way() -> None:
    """Each subpackage of ``memlab/estimation/`` imports only those below it in :data:`ESTIMATION_ORDER` (what
    CONTRIBUTING.md writes), and every subpackage is in that order."""
    graph = layer_graph()
    parts = {node for node in graph if node.startswith(ESTIMATION + ".") and (
        Path(memlab.__file__).parent / "estimation" / node.split(".")[2]).is_dir()}
    assert parts == set(ESTIMATION_ORDER)
    upward = [f"{part} imports {other}" for i, part in enumerate(ESTIMATION_ORDER)
              for other in sorted(graph[part]) if other in ESTIMATION_ORDER[:i]]
    assert upward == []
    assert "memlab.estimation.cuda" in graph["memlab.estimation.dryrun"]
    assert "memlab.estimation.dryrun" in graph["memlab.estimation.sharded"]


def test_the_layer_graph_finds_a_circle_between_estimation_parts() -> None:
    """An import of the dry run from the CUDA emulation (as ``cuda_kernels.py`` once took the target device from
    ``fake.py``) is a circle the layout test names."""
    trees = _modules()
    trees["memlab.estimation.cuda.bad"] = ast.parse("from memlab.estimation.dryrun.fake import FakeMode\n")
    found = [sorted(c) for c in circles(layer_graph(trees))]
    assert any({"memlab.estimation.cuda", "memlab.estimation.dryrun"} <= set(c) for c in found), found
    assert not any(node.startswith("memlab.estimation.") for c in circles(layer_graph()) for node in c)


def test_no_import_circle_among_the_benchmarks() -> None:
    """The benchmark modules (the GPU sections above all) import one way: every import counts here, those inside
    functions too, since a section's lazy import of another is no delegation (issue 62)."""
    folder = PACKAGE.parent / "benchmarks"
    graph: dict[str, set[str]] = {path.stem: set() for path in folder.glob("*.py")}
    for path in folder.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.module == "benchmarks":
                graph[path.stem] |= {alias.name for alias in node.names if alias.name in graph}
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("benchmarks."):
                graph[path.stem].add(node.module.split(".")[1])
        graph[path.stem].discard(path.stem)
    assert [sorted(c) for c in circles(graph)] == []


def test_the_measure_layer_never_imports_the_report_layer() -> None:
    graph = import_graph()
    offenders = [
        f"{module} imports {target}"
        for module, targets in graph.items()
        if module.startswith("memlab.measure")
        for target in targets
        if target.startswith("memlab.report")
    ]
    assert offenders == []


def _imports_into(graph: dict[str, set[str]], layer: str, below: tuple[str, ...]) -> list[str]:
    """``"module imports target"`` for each module of ``layer`` that imports a module of a layer in ``below``."""
    return [
        f"{module} imports {target}"
        for module, targets in graph.items()
        if module == layer or module.startswith(layer + ".")
        for target in sorted(targets)
        if any(target == other or target.startswith(other + ".") for other in below)
    ]


def test_the_techniques_never_import_the_runner_or_the_measure_layer() -> None:
    """Techniques read what they need of the user's objects from ``memlab.live``, below them, never from above."""
    assert _imports_into(import_graph(), "memlab.techniques", ("memlab.runner", "memlab.measure")) == []


def test_live_imports_nothing_of_memlab_but_errors_and_seams() -> None:
    """``memlab/live/`` stands below every layer that reads the user's objects (CONTRIBUTING.md): what two layers
    need sits there (issue 87: the quiet block, the model's values, the fake copies), and it reaches up to none."""
    graph = import_graph()
    layers = {".".join(module.split(".")[:2]) for module in graph if module != "memlab"}
    others = tuple(sorted(layers - {"memlab.live", "memlab.errors", "memlab.seams"}))
    assert "memlab.runner" in others and _imports_into(graph, "memlab.live", others) == []


def test_the_exports_never_import_estimation() -> None:
    """An export reads the plan and the sharding facts (``memlab.live.sharding``), never the dry-run machinery."""
    assert _imports_into(import_graph(), "memlab.export", ("memlab.estimation",)) == []


def test_no_module_is_over_the_cap() -> None:
    long = {
        str(path.relative_to(PACKAGE)): n
        for path in PACKAGE.rglob("*.py")
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_few_modules_sit_directly_in_the_package() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top


PREFIX_FAMILY = 3
"""Modules of one folder sharing a name's first word (``magic_parse``, ``magic_run``, ``magic_usage``) that make a
family: a family this large gets a folder of its own (issue 72: folders by concept, not by the size cap)."""


def prefix_families(names: list[str]) -> dict[str, list[str]]:
    """The families among the module ``names`` of one folder: each first word (before ``_``) that PREFIX_FAMILY or
    more of them share, the module of that very name counted in.

    Example:
        >>> prefix_families(["svg", "svg_layout", "svg_panels", "static", "timeline", "timeline_figure"])
        {'svg': ['svg', 'svg_layout', 'svg_panels']}
    """
    by_word: dict[str, list[str]] = {}
    for name in sorted(names):
        by_word.setdefault(name.split("_")[0], []).append(name)
    return {word: members for word, members in by_word.items() if len(members) >= PREFIX_FAMILY}


def test_prefix_families_find_three_of_a_name_and_leave_two_alone() -> None:
    assert prefix_families(["grpo", "grpo_kind", "grpo_vllm", "kinds"]) == {"grpo": ["grpo", "grpo_kind", "grpo_vllm"]}
    assert prefix_families(["timeline", "timeline_figure", "plan_axis"]) == {}


def test_no_prefix_family_outside_its_own_folder() -> None:
    found = {}
    for folder in [PACKAGE, *(p for p in PACKAGE.rglob("*") if p.is_dir() and p.name != "__pycache__")]:
        names = [p.stem for p in folder.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
        for word, members in prefix_families(names).items():
            found[f"{folder.relative_to(PACKAGE.parent).as_posix()}/{word}*"] = members
    assert found == {}


def _code_map() -> set[str]:
    """Every module and package of memlab, as the map writes them: ``plan.py``, ``runner/``, ``runner/step.py``."""
    entries = set()
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE)
        if relative.name in ("__init__.py", "__main__.py"):
            if relative.parent != Path("."):
                entries.add(f"{relative.parent.as_posix()}/")
            continue
        entries.add(relative.as_posix())
    return entries


def _contributing_map() -> set[str]:
    text = (PACKAGE.parent / "CONTRIBUTING.md").read_text()
    block = text.split("```\nmemlab/\n", 1)[1].split("```", 1)[0]
    entries = set()
    folders: list[tuple[int, str]] = []  # the open folders: (indent, name)
    for line in block.splitlines():
        words = line.split()
        if not words or not (words[0].endswith(".py") or words[0].endswith("/")):
            continue  # a blank line, or the description of the entry above carried on
        indent = len(line) - len(line.lstrip())
        while folders and folders[-1][0] >= indent:
            folders.pop()
        path = "".join(name for _, name in folders) + words[0]
        entries.add(path)
        if words[0].endswith("/"):
            folders.append((indent, words[0]))
    return entries


def test_the_contributing_map_is_the_code() -> None:
    code, written = _code_map(), _contributing_map()
    assert {"missing from CONTRIBUTING.md": sorted(code - written), "not in the code": sorted(written - code)} == {
        "missing from CONTRIBUTING.md": [],
        "not in the code": [],
    }


def test_every_estimate_route_takes_the_one_request() -> None:
    """memlab.estimate builds one EstimateRequest and every route takes it and nothing else (issue 47 item 5), so
    that a setting added to the request (the user's load=) reaches every route."""
    import importlib
    import inspect
    import typing

    from memlab.estimation.request import EstimateRequest
    from memlab.estimation.routes import ROUTES, route

    assert set(ROUTES) == {"one_gpu", "sharded", "inference", "trainer"}
    for name, function in {**ROUTES, "route": route}.items():
        parameters = list(inspect.signature(function).parameters)
        hints = typing.get_type_hints(function)
        assert parameters == ["request"] and hints["request"] is EstimateRequest, name
    estimate_module = importlib.import_module("memlab.estimation.estimate")
    body = ast.parse(inspect.getsource(estimate_module.estimate))
    called = {node.func.id for node in ast.walk(body) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    assert {"EstimateRequest", "route"} <= called and not called & {"estimate_plans", "sharded_estimate",
                                                                    "estimate_inference"}
    keywords = set(inspect.signature(estimate_module.estimate).parameters) - {"model_or_config"}
    assert keywords <= {f.name for f in dataclasses.fields(EstimateRequest)} | {"model_or_config"}


KINDS_WING = "memlab.kinds"
ABOVE_THE_KINDS = ("memlab.frontends",)
"""What may import the trainer kinds (issue 72): the front ends, and the package itself (``memlab/__init__.py``,
which provides them as the seam ``"trainer kinds"``). Every other layer (the trainer, the runner, the estimation,
the search...) stands below them and asks a trainer's kind (:func:`memlab.live.trainer_kinds.kind_of`)."""


def test_nothing_below_the_kinds_imports_them() -> None:
    """No module of ``trainer/``, ``runner/``, ``estimation/``, ``search/`` (nor any other layer but the front ends)
    imports ``memlab.kinds``, at module level or inside a function; the package provides the kinds through a seam."""
    below = [
        f"{module} imports {target}"
        for module, targets in import_graph().items()
        if module != "memlab" and not module.startswith((KINDS_WING, *ABOVE_THE_KINDS))
        for target in sorted(targets)
        if target == KINDS_WING or target.startswith(KINDS_WING + ".")
    ]
    assert below == []
    trees = _modules()
    assert "trainer kinds" in _provisions(trees["memlab"])
    assert _seams_declared(trees)["trainer kinds"][0] == "memlab.live.trainer_kinds"
    assert "TRAINER_KINDS" in _asked(trees["memlab.live.trainer_kinds"])


def _declares_a_kind(tree: ast.Module) -> bool:
    return any(isinstance(node, ast.Call) and getattr(node.func, "id", None) == "TrainerKind"
               for node in ast.walk(tree))


def test_each_kind_has_its_folder_and_the_trainer_package_none() -> None:
    """The kinds are declared in ``kinds/``, one folder a kind (each ``__init__`` declaring one, :data:`KINDS` listing
    them all), and nowhere else: ``trainer/`` keeps only what every kind uses, no kind's module or folder."""
    from memlab.kinds import KINDS

    trees = _modules()
    declaring = sorted(name for name, tree in trees.items() if _declares_a_kind(tree))
    folders = sorted(p.name for p in (PACKAGE / "kinds").iterdir() if (p / "__init__.py").is_file())
    assert declaring == [f"{KINDS_WING}.{folder}" for folder in folders]
    assert len(KINDS) == len(folders) and len({kind.name for kind in KINDS}) == len(KINDS)
    trainer = PACKAGE / "trainer"
    kind_named = [p.name for p in trainer.iterdir() if p.stem in folders and p.stem != "trainer"]
    assert [p.name for p in trainer.iterdir() if p.is_dir() and p.name != "__pycache__"] == [] and kind_named == []


# Where a test file may sit (CONTRIBUTING.md, "The tests mirror the package"): tests/<package>/test_<module>.py for
# memlab/<package>/<module>.py (a lever's tests in tests/techniques/test_<lever>.py), a facet of one after its name
# (test_<module>_<facet>.py). The cross-cutting flows, named for what they test: the folders and top-level names
# below. tests/gpu is the GPU-only suite the GPU run executes.
TESTS = PACKAGE.parent / "tests"
_CROSS_CUTTING_FOLDERS = {("docs",): None, ("frontends", "jupyter", "browser"): "browser", ("gpu",): None}
_CROSS_CUTTING_FILES = {"binder", "install", "layout", "docstring_examples", "notebooks", "benchmarks", "zoo"}


def _test_file_misplaced(relative: Path, package: Path = PACKAGE) -> str | None:
    """Why a test file (``relative`` to ``tests/``) does not mirror the package, or None where it does.

    Example:
        >>> _test_file_misplaced(Path("techniques/test_offload.py")) is None
        True
        >>> _test_file_misplaced(Path("integration/test_offload.py"))
        'integration/ is no folder of memlab/'
    """
    folder, stem = relative.parent.parts, relative.stem.removeprefix("test_")
    if any(word.startswith("issue") for word in stem.split("_")):
        return f"{relative.name} is named after an issue"
    if folder in _CROSS_CUTTING_FOLDERS:
        prefix = _CROSS_CUTTING_FOLDERS[folder]
        return None if prefix is None or stem.split("_")[0] == prefix else f"{relative.name} does not start {prefix}"
    where = package.joinpath(*folder)
    if not where.is_dir():
        return f"{'/'.join(folder)}/ is no folder of memlab/"
    names = {path.stem for path in where.rglob("*.py") if path.stem != "__init__"}
    names |= {path.name for path in where.rglob("*") if path.is_dir() and path.name != "__pycache__"}
    names |= set(folder[-1:]) | (_CROSS_CUTTING_FILES if not folder else set())
    if not any(stem == name or stem.startswith(f"{name}_") for name in names):
        return f"{relative.as_posix()} names no module of memlab/{'/'.join(folder)}"
    return None


def test_every_test_file_mirrors_the_package() -> None:
    files = sorted(path.relative_to(TESTS) for path in TESTS.rglob("test_*.py"))
    assert len(files) > 100
    assert {relative: why for relative in files if (why := _test_file_misplaced(relative))} == {}
    # pytest imports a test module by its file name (rootdir conftest, no __init__.py): one name, one file
    names = [relative.name for relative in files]
    assert sorted({name for name in names if names.count(name) > 1}) == []


def test_the_test_layout_refuses_an_issue_name_a_flat_pile_and_a_module_memlab_lacks() -> None:
    assert _test_file_misplaced(Path("search/test_fit_issue4.py")) == "test_fit_issue4.py is named after an issue"
    assert _test_file_misplaced(Path("unit/test_plan.py")) == "unit/ is no folder of memlab/"
    assert _test_file_misplaced(Path("report/test_nothing.py")) == (
        "report/test_nothing.py names no module of memlab/report")
    assert _test_file_misplaced(Path("frontends/jupyter/browser/test_panel.py")) == (
        "test_panel.py does not start browser")
    assert _test_file_misplaced(Path("test_plan.py")) is None and _test_file_misplaced(Path("test_zoo_vlm.py")) is None


def _kind_test_misplaced(relative: Path, kinds: list[str]) -> str | None:
    """Why a test file (``relative`` to ``tests/``) named for a trainer kind (one of ``kinds``, the folders of
    ``memlab/kinds/``, as one of the words of its name) sits outside that kind's test folder, ``tests/kinds/<kind>/``;
    None where it sits there or names no kind."""
    words = relative.stem.removeprefix("test_").split("_")
    for kind in kinds:
        if kind in words and relative.parent.parts[:2] != ("kinds", kind):
            return f"{relative.as_posix()} is named for the {kind} kind: its place is tests/kinds/{kind}/"
    return None


def test_each_kind_s_tests_live_in_its_folder() -> None:
    """A kind's code is its folder of ``memlab/kinds/`` and its tests are ``tests/kinds/<kind>/`` (issue 87): a test
    file whose name says a kind (``test_trainer_grpo_step.py``) anywhere else fails. transformers' Trainer is every
    kind's base and its folder's name is also ``memlab/trainer/``'s, so its name says no kind; the cross-cutting
    folders (the docs, the GPU suite, the browser) are named for what they test."""
    kinds = sorted(p.name for p in (PACKAGE / "kinds").iterdir()
                   if (p / "__init__.py").is_file() and p.name != "trainer")
    assert {"sft", "dpo", "grpo"} <= set(kinds)
    files = [path.relative_to(TESTS) for path in TESTS.rglob("test_*.py")]
    files = [relative for relative in files if not any(relative.parts[:len(folder)] == folder
                                                        for folder in _CROSS_CUTTING_FOLDERS)]
    assert {relative: why for relative in files if (why := _kind_test_misplaced(relative, kinds))} == {}
    assert _kind_test_misplaced(Path("trainer/test_trainer_grpo_step.py"), kinds) == (
        "trainer/test_trainer_grpo_step.py is named for the grpo kind: its place is tests/kinds/grpo/")
    assert _kind_test_misplaced(Path("kinds/dpo/test_grpo_fit.py"), kinds) is not None  # another kind's folder
    assert _kind_test_misplaced(Path("kinds/grpo/test_grpo_step.py"), kinds) is None
    assert _kind_test_misplaced(Path("search/test_limits_trainer.py"), kinds) is None  # the Trainer says no kind
