"""Starts the notebook runner (:mod:`notebook_runs`) once the session knows which notebooks it will execute, so
that they run in the background while the other tests do (the session's end stops it: ``tests/conftest.py``)."""

from __future__ import annotations

import builtins

import pytest
from notebook_runs import RUNS, missing_apis

RUN_TEST = "test_notebook_runs_top_to_bottom"


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly:
        return
    names = [
        item.callspec.params["name"]
        for item in session.items
        if getattr(item, "originalname", None) == RUN_TEST and hasattr(item, "callspec")
    ]
    RUNS.start([name for name in dict.fromkeys(names) if not missing_apis(name)])


# The browser tests' fixtures (a Jupyter server, headless Chromium), shared by every test_browser*.py module.
from browser_lab import chromium, jupyter_server, lab, lab_with_memfit_and_panel  # noqa: E402, F401


@pytest.fixture(autouse=True)
def _no_builtin_underscore():
    # What ran before a test in this process (a doctest, any plain sys.displayhook) may have set builtins._; IPython's
    # test shell then never sets _ (DisplayHook.update_user_ns), where a real kernel, which has no builtins._, would.
    builtins.__dict__.pop("_", None)


@pytest.fixture(autouse=True)
def _lab_left_as_found(request: pytest.FixtureRequest):
    # One JupyterLab serves every browser test of the worker (browser_lab.lab): what a test leaves running there (a
    # kernel its last reload started, a workspace that would reopen its notebook beside the next test's) goes with it.
    yield
    if "lab" in request.fixturenames:
        request.getfixturevalue("lab").shut_down_kernels()
