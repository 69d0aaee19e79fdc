"""Starts the Binder-like venv build (:mod:`binder_venv`) in the background as soon as the session has collected the
test that checks it, so that its two minutes of pip pass while the other tests run (the session's end removes it:
``tests/conftest.py``)."""

from __future__ import annotations

import pytest
from binder_venv import BUILD

VENV_TEST = "test_a_venv_built_as_binder_builds_it_imports_every_notebooks_imports"


def pytest_collection_finish(session: pytest.Session) -> None:
    if not session.config.option.collectonly and any(item.name == VENV_TEST for item in session.items):
        BUILD.start()
