"""What a ``%%memfit`` run leaves in a notebook lasts: executed in a real kernel (nbclient) and exported with nbconvert,
the cell shows the static SVG of the figure, not an empty FigureWidget or its repr, and the picked plan's timeline as
a static SVG too.

One tiny model, one plan, one timed step: the kernel's start and imports are most of the time this takes.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import nbformat
import pytest

SETUP = """\
import torch
from torch import nn
%load_ext memlab
torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
batch = (torch.randn(8, 16), torch.randn(8, 1))
"""
MEMFIT = """\
%%memfit model batch --try checkpointing=off --budget 1GiB --steps 1 --warmup 1 --noise 0
loss = (model(batch[0]) - batch[1]).pow(2).mean()
"""
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_an_executed_notebook_keeps_the_figure_as_svg_in_its_html(tmp_path: Path) -> None:
    from nbclient import NotebookClient
    from nbconvert import HTMLExporter

    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(SETUP), nbformat.v4.new_code_cell(MEMFIT)]
    client = NotebookClient(
        notebook, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()

    outputs = notebook.cells[1].outputs
    assert [output.output_type for output in outputs] == ["display_data"] * 3 + ["execute_result"]
    figure = outputs[0]["data"]  # the live widget's output, updated in place when the run ended
    picker, timeline = outputs[1]["data"], outputs[2]["data"]  # the list of plans, the picked plan's timeline
    assert WIDGET_VIEW in picker and picker["text/plain"].startswith("timeline of plain (plan 1)")
    assert WIDGET_VIEW not in timeline and timeline["text/plain"].startswith("memlab timeline: plain: peak ")
    assert timeline["image/svg+xml"].startswith("<svg") and len(json.dumps(outputs[2])) < 100_000
    assert WIDGET_VIEW not in figure and "FigureWidget" not in figure["text/plain"]
    assert figure["image/svg+xml"].startswith("<svg") and "budget 1.00 GiB" in figure["image/svg+xml"]
    assert figure["text/plain"].startswith("memlab: 1 plan")
    assert len(json.dumps(outputs[0])) < 60_000
    assert len(nbformat.writes(notebook)) < 1_000_000  # the whole saved notebook, widget state included

    html, _ = HTMLExporter().from_notebook_node(notebook)
    assert "FigureWidget({" not in html  # no widget repr where the figure was
    # nbconvert puts an SVG output in an <img> as base64: the figure, its bars and its titles are in there.
    svg_image = r'data-mime-type="image/svg\+xml"[^>]*>\s*<img[^>]*src="data:image/svg\+xml;base64,([^"]+)"'
    sources = re.findall(svg_image, html)
    figures = [base64.b64decode(source).decode() for source in sources]
    assert any("Peak memory by category" in svg and svg.count('class="bar"') >= 5 for svg in figures), len(figures)
    assert any("memory over one step" in svg and "plain: peak" in svg for svg in figures)  # the timeline, kept
