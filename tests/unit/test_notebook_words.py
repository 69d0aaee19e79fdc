"""What the workshop notebooks tell a reader to write works, and what they show reads as a person reads it (issue 48:
notebook 12 told readers to put ``accumulation`` in fit's space, which fit refuses, and showed its steps' peaks in
raw bytes)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from memlab.errors import MemlabError
from memlab.plan import Plan
from memlab.search.space import candidate_plans

SOURCES = sorted((Path(__file__).resolve().parents[2] / "notebooks" / "src").glob("[0-9][0-9]_*.py"))
SPACE = re.compile(r"space\s*=\s*\{([^{}]*)\}")
KEY = re.compile(r"""["'](\w+)["']\s*:""")
PLAN_FIELDS = set(Plan.__dataclass_fields__)


def spaces(text: str) -> list[list[str]]:
    """The keys of every ``space = {...}`` a notebook writes, in its code or its words."""
    return [KEY.findall(found) for found in SPACE.findall(text)]


@pytest.mark.parametrize("source", SOURCES, ids=lambda path: path.stem)
def test_every_space_a_notebook_writes_is_one_fit_takes(source: Path) -> None:
    for keys in spaces(source.read_text()):
        assert set(keys) <= PLAN_FIELDS, (source.name, keys)
        # fit refuses accumulation in a space (it follows from the micro-batch): a reader told to add it gets an error
        assert "accumulation" not in keys, (source.name, keys)


def test_fit_refuses_accumulation_in_a_space() -> None:
    """The rule the check above holds the notebooks' words to."""
    with pytest.raises(MemlabError, match="accumulation follows from batch_size / micro_batch"):
        candidate_plans(4, {"micro_batch": [4, 2], "accumulation": [1, 2]})
    old_words = 'space = {"micro_batch": [4, 2, 1], "accumulation": [1, 2], ...}'  # notebook 12's, before
    assert spaces(old_words) == [["micro_batch", "accumulation"]]


def test_notebook_12_shows_its_steps_peaks_in_mib_and_says_what_fit_tried() -> None:
    text = next(source for source in SOURCES if source.stem.startswith("12_")).read_text()
    assert '"peak_bytes", "samples_per_s"' not in text and '"peak_MiB", "samples_per_s"' in text
    assert "searches micro-batch,\n# accumulation and checkpointing" not in text
    assert 'print("tried:"' in text  # the plans fit measured, beyond the levers its space names


def test_notebook_05_shows_host_memory_and_compile_with_figures() -> None:
    """Issue 60's notebook section: host bytes beside the GPU's with a host budget one plan misses, a 7B estimate
    with a host budget, and compile estimated and shown from its recorded run, each with a figure."""
    import json

    text = next(source for source in SOURCES if source.stem.startswith("05_")).read_text()
    for words in ("host_bytes", "host_budget=host_budget", 'host_budget="64GiB"', "verdict_figure",
                  "memlab.Plan(compile=True)", "compile_seconds", 'name="GPU: allocated peak"',
                  'name="host: offloaded bytes"', 'name="compiled, estimated"', "measure_compile = False"):
        assert words in text, words
    # the recorded run the compile figure reads has what the notebook reads from it
    recorded = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "compile_memory-cpu.json"
    data = json.loads(recorded.read_text())
    assert {"date", "device"} <= set(data) and "cpu" in data["device"]
    assert [row["family"] for row in data["families"]] == ["llama", "gpt2", "bert"]
    for row in data["families"]:
        assert {"compiled_over_eager_peak", "compiled_over_eager_speed"} <= set(row)
        assert row["eager"]["peak_bytes"] > 0 and row["compiled"]["peak_bytes"] > 0
        assert {"compile_seconds", "estimate_bytes", "estimate_error"} <= set(row["compiled"])
