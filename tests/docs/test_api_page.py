"""Issue 61 item 2: the API page shows each public dataclass as it is called. The classes ``docs/api.md`` names are
built by Sphinx as the site builds them (autodoc, napoleon, ``autodoc_typehints = "description"``: the conf's own
settings), into a page of their own: each signature names the fields (never ``*args, **kwargs``), and each field is
in the page's parameter list with its type."""

from __future__ import annotations

import dataclasses
import html
import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _api_classes() -> list[str]:
    """The dataclasses docs/api.md documents with ``autoclass``."""
    names = re.findall(r"^\.\. autoclass:: (memlab\.\w+)", (REPO / "docs" / "api.md").read_text(), re.MULTILINE)
    found = []
    for name in names:
        module, _, attribute = name.rpartition(".")
        if dataclasses.is_dataclass(getattr(importlib.import_module(module), attribute)):
            found.append(name)
    return found


@pytest.fixture(scope="module")
def api_page(tmp_path_factory: pytest.TempPathFactory) -> str:
    from sphinx.cmd.build import build_main

    source = tmp_path_factory.mktemp("api")
    conf = (REPO / "docs" / "conf.py").read_text()
    settings = "\n".join(line for line in conf.splitlines() if line.startswith(("autodoc_", "napoleon_")))
    (source / "conf.py").write_text(
        'extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]\n' + settings + "\n")
    (source / "index.rst").write_text("API\n===\n\n" + "".join(f".. autoclass:: {name}\n\n" for name in _api_classes()))
    out = source / "_build"
    assert build_main(["-q", "-b", "html", str(source), str(out)]) == 0
    return (out / "index.html").read_text()


def _section(page: str, name: str) -> str:
    start = page.index(f'id="{name}"')
    end = page.find('<dl class="py class">', start)
    return page[start:end if end > 0 else len(page)]


def _text(markup: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", markup)).split())


@pytest.mark.parametrize("name", _api_classes())
def test_every_field_of_a_public_dataclass_is_on_its_api_page_with_its_type(api_page: str, name: str) -> None:
    module, _, attribute = name.rpartition(".")
    cls = getattr(importlib.import_module(module), attribute)
    section = _section(api_page, name)
    signature = _text(section[: section.index("</dt>")])
    assert "*args" not in signature and "**kwargs" not in signature, signature
    documented = {klass: _text(_section(api_page, f"memlab.{klass.__name__}")) for klass in cls.__mro__
                  if f'id="memlab.{klass.__name__}"' in api_page}
    for field in dataclasses.fields(cls):
        if not field.init or field.name.startswith("_"):
            continue
        assert re.search(rf"[(,] ?{field.name}\b", signature), (name, field.name, signature)
        # "name (type) - what it is": the parameter list of the class that declares the field (a subclass's page
        # says "besides the fields of Trial") gives it its type and its words
        owner = next(klass for klass in cls.__mro__ if field.name in vars(klass).get("__annotations__", {}))
        described = documented.get(owner, documented[cls])
        assert re.search(rf"\b{field.name} \([^)]+\) [\u2013\u2014-]", described), (name, field.name, described[:3000])


def test_the_classes_checked_include_the_plan() -> None:
    assert {"memlab.Plan", "memlab.InferencePlan", "memlab.Trial", "memlab.Report"} <= set(_api_classes())
