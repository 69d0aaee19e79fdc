"""A step's timeline (memlab.measure.timeline): what it records across architectures and the promises it keeps.

A step's timeline (trial.timeline) across architectures: its peak is the trial's, its categories at the peak are the
breakdown, its phases come in order, its module is a real one, recording changes nothing, and the saved snapshot opens
with PyTorch's own memory_viz tools.

Issue 61 item 12: a timeline keeps its promises. ``timeline.peak.module`` (and every module ``by_module`` names)
is a name ``model.named_modules()`` gives: the model itself is "", never its class's name; the plotly figure names
its phases in its legend; ``timeline.save`` to a folder, or into a folder that does not exist, says what to write.
Over the families the suite builds (tiny Llama, GPT-2) and the plans of a measured and an estimated step."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.cuda._memory_viz as memory_viz
import transformers
from models import assert_same, fingerprint, lm_batch, mlp_batch, mlp_loss, tiny_gpt2, tiny_llama, tiny_mlp
from torch import nn

import memlab
from memlab.errors import MemlabError
from memlab.measure.probes import Probe
from memlab.measure.timeline import StepRecorder
from memlab.report.timeline import MAX_POINTS, Timeline
from memlab.report.views.timeline_figure import timelines_svg

VOCAB = 128
ROWS = 2


def _tokens(length: int = 12) -> dict[str, torch.Tensor]:
    ids = torch.randint(3, VOCAB, (ROWS, length), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "labels": ids.clone()}


def _decoder(config: str, model: str, **extra: Any) -> Callable[[], tuple[nn.Module, Any, Any]]:
    sizes = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=2)

    def build() -> tuple[nn.Module, Any, Any]:
        torch.manual_seed(0)
        return getattr(transformers, model)(getattr(transformers, config)(**{**sizes, **extra})), _tokens(), None

    return build


def _bert() -> tuple[nn.Module, Any, Any]:
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64)
    batch = {"input_ids": _tokens()["input_ids"], "labels": torch.tensor([0, 1])}
    return transformers.BertForSequenceClassification(config), batch, None


def _t5() -> tuple[nn.Module, Any, Any]:
    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=VOCAB, d_model=32, d_ff=64, d_kv=16, num_layers=2, num_heads=2,
                                   decoder_start_token_id=0)
    batch = {"input_ids": _tokens()["input_ids"], "labels": _tokens(6)["labels"]}
    return transformers.T5ForConditionalGeneration(config), batch, None


def _mlp() -> tuple[nn.Module, Any, Any]:
    return tiny_mlp(), mlp_batch(rows=ROWS), mlp_loss


MOE = dict(num_experts_per_tok=2)
CASES: dict[str, Callable[[], tuple[nn.Module, Any, Any]]] = {
    "llama": _decoder("LlamaConfig", "LlamaForCausalLM"),
    "gpt2": lambda: (transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=32)), _tokens(), None),
    "qwen2": _decoder("Qwen2Config", "Qwen2ForCausalLM"),
    "mistral": _decoder("MistralConfig", "MistralForCausalLM"),
    "gemma": _decoder("GemmaConfig", "GemmaForCausalLM", head_dim=16),
    "phi3": _decoder("Phi3Config", "Phi3ForCausalLM", pad_token_id=0),
    "mixtral (MoE)": _decoder("MixtralConfig", "MixtralForCausalLM", num_local_experts=4, **MOE),
    "bert (encoder)": _bert,
    "t5 (encoder-decoder)": _t5,
    "mlp (plain module)": _mlp,
}


def _module_names(model: nn.Module) -> set[str]:
    return {name for name, _ in model.named_modules()}  # the model itself is "", as named_modules() names it


def _check(timeline: Timeline, trial: memlab.Trial, model: nn.Module, micro_batches: int) -> None:
    peak = timeline.peak
    assert peak.bytes == trial.peak_bytes
    assert peak.by_category == trial.breakdown
    assert sum(peak.by_category.values()) == peak.bytes
    # The drawn series reach the peak exactly, at the peak's place, and never above it.
    totals = timeline.totals
    assert max(totals) == peak.bytes
    assert totals[timeline.x.index(peak.at)] == peak.bytes
    names = [name for name, _, _ in timeline.phases]
    assert names == ["forward", "backward"] * micro_batches + ["optimizer"]
    edges = [edge for _, start, end in timeline.phases for edge in (start, end)]
    assert edges == sorted(edges) and timeline.phases[-1][2] <= timeline.x[-1]
    assert peak.phase in ("forward", "backward", "optimizer")
    assert peak.module == "" or peak.module in _module_names(model)
    assert all(name.startswith("(") or name in _module_names(model) for name in peak.by_module)


@pytest.mark.parametrize("name", list(CASES))
def test_timeline_of_each_architecture(name: str) -> None:
    model, batch, loss_fn = CASES[name]()
    before = fingerprint(model)
    plan = memlab.Plan(micro_batch=1, accumulation=2)
    trial = memlab.measure(model, batch, plan, loss_fn=loss_fn, steps=1, noise=0, warmup=1, progress=False)
    assert trial.status == "ok", trial.error
    assert trial.timeline is not None
    _check(trial.timeline, trial, model, micro_batches=2)
    assert_same(before, fingerprint(model))


@pytest.fixture(scope="module")
def llama_report() -> tuple[nn.Module, memlab.Report]:
    model = tiny_llama(layers=4)
    plans = [memlab.Plan(), memlab.Plan(checkpointing=True), memlab.Plan(micro_batch=4, accumulation=2)]
    return model, memlab.compare(model, lm_batch(), plans, steps=1, noise=0, progress=False)


def test_checkpointing_lowers_the_activations_at_the_peak(llama_report: tuple[nn.Module, memlab.Report]) -> None:
    model, report = llama_report
    plain, checkpointed, accumulated = (trial.timeline for trial in report)
    assert plain is not None and checkpointed is not None and accumulated is not None
    assert checkpointed.peak.by_category["activations"] < plain.peak.by_category["activations"]
    # Without checkpointing every layer's activations are held at the start of backward; with it, fewer.
    assert plain.peak.layers_held == 4 and checkpointed.peak.layers_held < 4
    assert plain.peak.module in _module_names(model) and plain.peak.phase == "backward"
    assert [name for name, _, _ in accumulated.phases].count("forward") == 2
    assert accumulated.peak.micro_batch == 1  # the second micro-batch: the first one's gradients are held


def test_report_plot_timeline_draws_every_plan_on_one_scale(llama_report: tuple[nn.Module, memlab.Report]) -> None:
    _, report = llama_report
    figure = report.plot(kind="timeline")
    ranges = {tuple(axis.range) for name, axis in figure.layout.to_plotly_json().items() if name.startswith("yaxis")
              for axis in [figure.layout[name]]}
    assert len(ranges) == 1  # one memory scale
    titles = [annotation.text for annotation in figure.layout.annotations]
    assert [title.split(":")[0] for title in titles] == [trial.label for trial in report]
    assert all("of " in title for title in titles)
    svg = timelines_svg([trial.timeline for trial in report if trial.timeline is not None])
    assert svg.startswith("<svg") and svg.count("<polygon") >= 3 * 3
    with pytest.raises(MemlabError, match="kind='timeline'"):
        report.plot(kind="timelines")


def test_saved_snapshot_opens_with_pytorchs_memory_viz(llama_report: tuple[nn.Module, memlab.Report], tmp_path: Any
                                                       ) -> None:
    _, report = llama_report
    timeline = report.trials[0].timeline
    assert timeline is not None
    path = timeline.save(tmp_path / "step.pickle")
    with path.open("rb") as file:
        snapshot = pickle.load(file)
    assert "Active Memory Timeline" in memory_viz.trace_plot(snapshot)
    assert "Allocator State History" in memory_viz.segment_plot(snapshot)
    assert "Summary of segments" in memory_viz.segsum(snapshot)
    assert "entries" in memory_viz.trace(snapshot)
    # Replaying the trace from what was alive before the step reaches the timeline's peak, no more.
    live = timeline.totals[0]
    highest = live
    for entry in snapshot["device_traces"][0]:
        live += entry["size"] if entry["action"] == "alloc" else -entry["size"] if entry[
            "action"] == "free_completed" else 0
        highest = max(highest, live)
    assert highest == timeline.peak.bytes
    frames = {frame["filename"] for entry in snapshot["device_traces"][0] for frame in entry["frames"]}
    assert "model.layers.0.mlp.down_proj" in frames


def test_recording_leaves_the_peak_and_the_timed_steps_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    model, batch = tiny_llama(), lm_batch(rows=4)
    plan = memlab.Plan(checkpointing=True)
    recorded = memlab.measure(model, batch, plan, steps=2, noise=0, progress=False)
    assert not torch.nn.modules.module._global_forward_hooks  # the module watch is gone after the tracked step

    class NotRecording(StepRecorder):
        def recording(self, tracker: Any) -> Any:
            import contextlib

            return contextlib.nullcontext(self.result)

    # the runner asks its probe for the tracked step's recorder
    monkeypatch.setattr(Probe, "step_recorder", lambda self, model, categories: NotRecording(model, categories))
    plain = memlab.measure(model, batch, plan, steps=2, noise=0, progress=False)
    assert plain.timeline is None
    assert (recorded.peak_bytes, recorded.breakdown) == (plain.peak_bytes, plain.breakdown)
    assert len(recorded.step_times) == len(plain.step_times)


def test_estimates_have_timelines_with_the_exact_peak() -> None:
    model = tiny_llama()
    shapes = {"input_ids": (2, 16), "labels": (2, 16)}
    trial = memlab.estimate(model, shapes, memlab.Plan(micro_batch=1, accumulation=2), device="cuda")
    assert trial.timeline is not None
    _check(trial.timeline, trial, model, micro_batches=2)
    generation = memlab.estimate(model, {"input_ids": (2, 8)}, memlab.InferencePlan(new_tokens=3), device="cuda")
    timeline = generation.timeline
    assert timeline is not None and timeline.peak.bytes == generation.peak_bytes
    assert [name for name, _, _ in timeline.phases] == ["prefill", "decode", "decode"]
    eight_bit = memlab.estimate(model, shapes, memlab.Plan(optimizer="adamw8bit"), device="cuda")
    assert eight_bit.timeline is not None and eight_bit.timeline.peak.bytes == eight_bit.peak_bytes
    assert eight_bit.timeline.peak.by_category == eight_bit.breakdown
    sharded = memlab.estimate(model, shapes, memlab.Plan(), gpus=2, strategy="zero2", device="cuda")
    assert sharded.timeline is None


def test_a_long_step_is_thinned_with_its_peak_kept() -> None:
    model = tiny_mlp(blocks=48)
    plan = memlab.Plan(micro_batch=2, accumulation=4)
    trial = memlab.measure(model, mlp_batch(), plan, loss_fn=mlp_loss, steps=1, noise=0, progress=False)
    timeline = trial.timeline
    assert timeline is not None and timeline.events > MAX_POINTS
    assert len(timeline.x) <= MAX_POINTS and max(timeline.totals) == timeline.peak.bytes == trial.peak_bytes


def test_the_gpu_runs_timeline_section_holds_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks/
    from benchmarks.gpu_sections_timeline import section_timeline

    part = section_timeline("smoke", torch.device("cpu"))
    assert len(part["rows"]) == 3
    failed = [check for check in part["checks"] if check["passed"] is False]
    assert not failed, failed
    assert all(row["timeline_peak_bytes"] == row["snapshot_peak_bytes"] for row in part["rows"])


def test_a_trainers_trial_has_a_timeline(tmp_path: Path) -> None:
    from trainers import make_trainer

    trainer = make_trainer(tmp_path)
    trial = memlab.measure(trainer, memlab.Plan(), steps=1, noise=0, progress=False)
    assert trial.status == "ok", trial.error
    assert trial.timeline is not None and trial.timeline.peak.bytes == trial.peak_bytes
    assert [name for name, _, _ in trial.timeline.phases][-1] == "optimizer"


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


def _replayed_peak(snapshot: dict[str, Any]) -> int:
    """The highest bytes alive a replay of ``snapshot`` reaches, as PyTorch's memory_viz reads one: the blocks alive
    when it was taken (its segments' active blocks), the trace walked back to what was alive before it began (an
    allocation taken off, a free put back), then the trace walked forward."""
    alive = {block["address"]: block["size"] for segment in snapshot["segments"] for block in segment["blocks"]
             if block["state"] == "active_allocated"}
    trace = snapshot["device_traces"][0]
    for entry in reversed(trace):
        if entry["action"] == "alloc":
            alive.pop(entry["addr"])
        elif entry["action"] == "free_completed":
            alive[entry["addr"]] = entry["size"]
    live = highest = sum(alive.values())
    for entry in trace:
        live += entry["size"] if entry["action"] == "alloc" else -entry["size"] if entry[
            "action"] == "free_completed" else 0
        highest = max(highest, live)
    return highest


def test_an_estimates_saved_snapshot_replays_to_its_peak(tmp_path: Path) -> None:
    """Issue 84 item 12: an estimate's memory_viz snapshot replayed to exactly 64 MiB less than its timeline's peak
    (a small Llama at 1 x 256 for an H100: 12,454,376 against 79,563,240 bytes): the cuBLAS workspaces, added to the
    timeline all through the step, were not in the snapshot. So were 8-bit state computed from its size (taken off
    the recorded fp32 state) and what a trial's peak holds beyond the tracked bytes."""
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=2, vocab_size=VOCAB)
    trial = memlab.estimate(config, {"input_ids": (1, 256), "labels": (1, 256)}, memlab.Plan(), gpu="H100-80GB")
    timeline = trial.timeline
    assert timeline is not None and timeline.peak.bytes == trial.peak_bytes
    with timeline.save(tmp_path / "step.pickle").open("rb") as file:
        snapshot = pickle.load(file)
    assert _replayed_peak(snapshot) == trial.peak_bytes
    held = [block for segment in snapshot["segments"] for block in segment["blocks"]
            if block["frames"] and block["frames"][0]["filename"] == "cuBLAS workspaces"]
    assert sum(block["size"] for block in held) == 2 * 32 * 2**20  # the H100's two handles, 32 MiB each
    smaller = timeline.shifted("optimizer", -trial.breakdown["optimizer"] // 2)  # 8-bit state in place of fp32
    assert _replayed_peak(smaller.snapshot()) == smaller.peak.bytes < timeline.peak.bytes


def test_a_grpo_estimates_timeline_saves_and_replays_to_its_peak(tmp_path: Path) -> None:
    """A GRPO step's timeline is composed of its generation's and its training's, with no trace of its own: saving
    it raised zlib's "incomplete or truncated stream"; it is saved as drawn."""
    pytest.importorskip("trl")
    from trl_trainers import make_grpo_trainer

    trial = memlab.estimate(make_grpo_trainer(tmp_path), device="cpu")
    timeline = trial.timeline
    assert timeline is not None and "generation" in [name for name, _, _ in timeline.phases]
    with timeline.save(tmp_path / "grpo.pickle").open("rb") as file:
        snapshot = pickle.load(file)
    assert _replayed_peak(snapshot) == timeline.peak.bytes == trial.peak_bytes
    assert "Active Memory Timeline" in memory_viz.trace_plot(snapshot)
