"""What every Jupyter-face test (the magic's, the panel's, the browser's) starts from: no ``builtins._`` left by an
earlier test, and no kernel or workspace a browser test left in the shared JupyterLab."""

from __future__ import annotations

import builtins

import pytest


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
