"""``pip install memlab`` goes into the Jupyter a person already has: it must not pull or upgrade a Jupyter server.

The core's dependencies are walked through the installed distributions' metadata (what pip would install, with
the markers of this environment); JupyterLab and a kernel come only with the ``lab`` extra, which ``test`` includes.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import NormalizedName, canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
JUPYTER_SERVERS = {"jupyterlab", "jupyter-server", "notebook", "jupyterlab-server"}
STALE = 'the installed metadata is stale: run pip install -e ".[test]" again'

Node = tuple[NormalizedName, frozenset[str]]


def wanted(requirement: Requirement, extras: frozenset[str]) -> bool:
    """Whether pip installs ``requirement`` for a distribution installed with ``extras``, in this environment."""
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate({"extra": extra}) for extra in {"", *extras})


def closure(requirements: Iterable[Requirement]) -> set[NormalizedName]:
    """Every distribution reachable from ``requirements`` through the installed distributions' metadata."""
    pending: list[Node] = [(canonicalize_name(r.name), frozenset(r.extras)) for r in requirements]
    seen: set[Node] = set()
    while pending:
        node = pending.pop()
        if node in seen:
            continue
        seen.add(node)
        name, extras = node
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue  # required where this environment's markers do not hold (so not installed): nothing to walk
        for requirement in map(Requirement, requires):
            if wanted(requirement, extras):
                pending.append((canonicalize_name(requirement.name), frozenset(requirement.extras)))
    return {name for name, _ in seen}


def memlab_requirements(*extras: str) -> list[Requirement]:
    """memlab's own requirements for an install with ``extras`` (none: ``pip install memlab``)."""
    everything = [Requirement(text) for text in metadata.requires("memlab") or []]
    return [requirement for requirement in everything if wanted(requirement, frozenset(extras))]


def test_the_core_install_reaches_no_jupyter_server() -> None:
    core = memlab_requirements()
    assert {canonicalize_name(r.name) for r in core} >= {"torch", "ipywidgets", "anywidget", "plotly"}, STALE
    reachable = closure(core)
    assert {"ipywidgets", "ipython", "plotly", "torch"} <= reachable  # the walk does go through the metadata
    assert not reachable & JUPYTER_SERVERS, f"pip install memlab would pull {sorted(reachable & JUPYTER_SERVERS)}"


@pytest.mark.parametrize("extra", ["lab", "test"])
def test_the_lab_and_test_extras_bring_jupyterlab_and_a_kernel(extra: str) -> None:
    reachable = closure(memlab_requirements(extra))
    assert {"jupyterlab", "jupyter-server", "ipykernel"} <= reachable, STALE


def test_the_test_extra_has_what_the_notebook_and_browser_tests_need() -> None:
    reachable = closure(memlab_requirements("test"))
    assert {"notebook", "nbclient", "nbformat", "playwright", "pytest"} <= reachable, STALE


def test_the_installed_metadata_is_what_pyproject_says() -> None:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    installed = {str(r) for r in memlab_requirements()}
    assert installed == {str(Requirement(text)) for text in project["dependencies"]}, STALE
    assert set(project["optional-dependencies"]) >= {"lab", "test"}
