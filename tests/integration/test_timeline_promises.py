"""Issue 61 item 12: a timeline keeps its promises. ``timeline.peak.module`` (and every module ``by_module`` names)
is a name ``model.named_modules()`` gives: the model itself is "", never its class's name; the plotly figure names
its phases in its legend; ``timeline.save`` to a folder, or into a folder that does not exist, says what to write.
Over the families the suite builds (tiny Llama, GPT-2) and the plans of a measured and an estimated step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from models import lm_batch, tiny_gpt2, tiny_llama
from torch import nn

import memlab
from memlab.errors import MemlabError
from memlab.report.timeline import Timeline

FAMILIES = {"llama": lambda: tiny_llama(layers=2), "gpt2": tiny_gpt2}
PLANS = [memlab.Plan(), memlab.Plan(checkpointing=True), memlab.Plan(micro_batch=2, accumulation=2)]


def _names(model: nn.Module) -> set[str]:
    return {name for name, _ in model.named_modules()}


def _check_names(timeline: Timeline, model: nn.Module) -> None:
    peak = timeline.peak
    assert peak.module in _names(model), (peak.module, peak.phase)
    assert type(model).__name__ not in (peak.module, *peak.by_module)
    assert all(name.startswith("(") or name in _names(model) for name in peak.by_module), peak.by_module


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def measured(request: pytest.FixtureRequest) -> tuple[nn.Module, memlab.Report]:
    model = FAMILIES[request.param]()
    return model, memlab.compare(model, lm_batch(rows=4), PLANS, steps=1, noise=0, progress=False)


def test_the_peak_and_what_is_alive_are_named_as_named_modules_names_them(
    measured: tuple[nn.Module, memlab.Report],
) -> None:
    model, report = measured
    for trial in report:
        assert trial.status == "ok" and trial.timeline is not None, trial.error
        _check_names(trial.timeline, model)


def test_an_estimates_timeline_is_named_the_same_way() -> None:
    model = tiny_llama(layers=2)
    trial = memlab.estimate(model, {"input_ids": (4, 16), "labels": (4, 16)}, memlab.Plan())
    assert trial.timeline is not None
    _check_names(trial.timeline, model)


def test_the_plotly_timeline_names_its_phases(measured: tuple[nn.Module, memlab.Report]) -> None:
    _, report = measured
    timeline = report.trials[2].timeline
    assert timeline is not None
    figure: Any = timeline.plot()
    legend = [trace.name for trace in figure.data if trace.showlegend is not False]
    assert [name for name in legend if name in ("forward", "backward", "optimizer step")] == [
        "forward", "backward", "optimizer step"]
    assert len(figure.layout.annotations) == 0 and "peak" in figure.layout.title.text  # its title once
    many: Any = report.plot(kind="timeline")
    assert all(a.text.startswith(f"{t.label}: peak ") for t, a in
               zip(report.trials, many.layout.annotations, strict=True))


def test_saving_to_a_folder_says_what_to_write(measured: tuple[nn.Module, memlab.Report], tmp_path: Path) -> None:
    _, report = measured
    timeline = report.trials[0].timeline
    assert timeline is not None
    with pytest.raises(MemlabError, match="is a folder; write a file's path, for example .*step.pickle"):
        timeline.save(tmp_path)
    with pytest.raises(MemlabError, match="does not exist; create it first"):
        timeline.save(tmp_path / "missing" / "step.pickle")
    assert timeline.save(tmp_path / "step.pickle").stat().st_size > 0


def test_a_peak_in_the_model_itself_names_the_model(measured: tuple[nn.Module, memlab.Report]) -> None:
    """Issue 71 item 9: a peak while the model's own forward (or its backward) ran, outside its submodules, is titled
    with the model's class, as it was before ``peak.module`` became ``""`` for the model; "(outside modules)" is left
    to what runs outside the model (the loss, the optimizer step)."""
    model, report = measured
    in_model = [trial.timeline.peak for trial in report if trial.timeline and trial.timeline.peak.model]
    assert in_model, [trial.timeline.peak.description for trial in report if trial.timeline]
    for peak in in_model:
        assert peak.module == "" and peak.model == type(model).__name__
        assert peak.description.startswith(f"{peak.phase} of {type(model).__name__}"), peak.description
        assert "(outside modules)" not in peak.description
        assert peak.by_module.get("(the model itself)", 0) > 0, peak.by_module  # what its own forward made
