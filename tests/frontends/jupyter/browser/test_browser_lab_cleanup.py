"""The shared JupyterLab's clean-up between browser tests (tests/browser_lab.py) outlasts the server's own races."""

from __future__ import annotations

import io
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import browser_lab
import pytest


def _http_error(url: str, code: int) -> urllib.error.HTTPError:
    return urllib.error.HTTPError(url, code, "from the fake server", None, io.BytesIO())  # type: ignore[arg-type]


class _FakeServer:
    """Answers the kernels API: ``listing_500s`` listings with 500 first, then the kernels; DELETE of ``gone`` 404."""

    def __init__(self, kernels: list[str], listing_500s: int, gone: set[str]) -> None:
        self.kernels, self.listing_500s, self.gone = kernels, listing_500s, gone
        self.deleted: list[str] = []

    def urlopen(self, request: Any, timeout: float) -> Any:
        if isinstance(request, urllib.request.Request) and request.get_method() == "DELETE":
            kernel = request.full_url.split("/api/kernels/")[1].split("?")[0]
            if kernel in self.gone:
                raise _http_error(request.full_url, 404)
            self.deleted.append(kernel)
            response = io.BytesIO(b"")
            response.status = 204  # type: ignore[attr-defined]
            return response
        if self.listing_500s:
            self.listing_500s -= 1
            raise _http_error(str(request), 500)
        return io.BytesIO(json.dumps([{"id": kernel} for kernel in self.kernels]).encode())


@pytest.fixture
def server(tmp_path: Path) -> browser_lab.Server:
    (tmp_path / "root").mkdir()
    return browser_lab.Server("lab", "http://127.0.0.1:1", "token", tmp_path / "root")


def test_a_listing_that_meets_a_starting_kernel_is_asked_again(server, monkeypatch):
    fake = _FakeServer(["a", "b"], listing_500s=2, gone={"b"})
    monkeypatch.setattr(urllib.request, "urlopen", fake.urlopen)
    monkeypatch.setattr(browser_lab.time, "sleep", lambda seconds: None)
    server.shut_down_kernels()
    assert fake.deleted == ["a"]  # b ended on its own between the listing and its DELETE


def test_a_server_that_keeps_failing_fails_the_clean_up(server, monkeypatch):
    fake = _FakeServer(["a"], listing_500s=99, gone=set())
    monkeypatch.setattr(urllib.request, "urlopen", fake.urlopen)
    monkeypatch.setattr(browser_lab.time, "sleep", lambda seconds: None)
    with pytest.raises(urllib.error.HTTPError, match="500"):
        server.shut_down_kernels()
    assert fake.deleted == []
