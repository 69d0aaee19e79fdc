"""``memlab.watch(...).timeline``: the costliest step of a real (tiny) Trainer's ``train()`` on CPU, its peak the step's
and its categories the step's, its phases each micro-batch's forward and backward and the optimizer step, only that
step kept, nothing left hooked afterwards; and the CUDA form's conversion of the allocator's trace, on a made-up
trace (no GPU here)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

pytest.importorskip("datasets")
from test_trainer import LONG, SHORT, dataset, trainer  # noqa: E402

import memlab  # noqa: E402
from memlab.report.timeline import Timeline  # noqa: E402
from memlab.trainer.watch_timeline import CUDA_MODULE, recording_from_trace  # noqa: E402


def phases(timeline: Timeline) -> list[str]:
    return [name for name, _, _ in timeline.phases]


def test_watch_keeps_the_costliest_steps_timeline(tmp_path: Path) -> None:
    lengths = [SHORT] * 6 + [LONG, LONG] + [SHORT] * 4  # the long pair is the 4th step's batch, in order
    t = trainer(tmp_path, data=dataset(lengths), max_steps=6, train_sampling_strategy="sequential")
    w = memlab.watch(t, show=False)
    assert w.timeline is None  # before any step
    t.train()
    timeline = w.timeline
    assert timeline is not None and w.peak is not None
    assert timeline.label == "step 4" == f"step {w.peak_step}"
    assert timeline.peak.bytes == w.peak_bytes and timeline.peak.by_category == w.peak.categories
    assert max(timeline.totals) == w.peak_bytes
    assert phases(timeline) == ["forward", "backward", "optimizer"]
    # a module of the model, as named_modules() names it (the model itself "")
    assert timeline.peak.phase in ("forward", "backward")
    assert timeline.peak.module in {name for name, _ in t.model.named_modules()}
    assert timeline.peak.by_category["activations"] > 0
    snapshot = pickle.loads(timeline.save(tmp_path / "step.pickle").read_bytes())
    assert snapshot["device_traces"][0]  # memory_viz's format, from memlab's tracking on CPU
    assert w._memory.costliest is not None and w._memory.costliest.step == 4  # the one step kept
    assert not torch.nn.modules.module._global_forward_pre_hooks  # the module watch is off between steps
    w.remove()
    assert not {"training_step", "compute_loss", "train"} & set(vars(t))


def test_what_the_optimizer_step_allocates_is_optimizer_state(tmp_path: Path) -> None:
    """The first step creates Adam's moments inside the optimizer step: on the timeline they are "optimizer", not
    "other" (on CPU the watch's tracker charges the optimizer step's allocations to it)."""
    t = trainer(tmp_path, max_steps=1)
    w = memlab.watch(t, show=False)
    t.train()
    w.remove()
    timeline = w.timeline
    assert timeline is not None
    moments = 2 * sum(p.numel() * p.element_size() for p in t.model.parameters() if p.requires_grad)
    assert max(timeline.series["optimizer"]) >= moments
    assert max(timeline.series["other"]) < moments / 4


def test_each_micro_batch_has_its_forward_and_backward(tmp_path: Path) -> None:
    t = trainer(tmp_path, max_steps=2, gradient_accumulation_steps=2)
    w = memlab.watch(t, show=False)
    t.train()
    w.remove()
    timeline = w.timeline
    assert timeline is not None
    assert phases(timeline) == ["forward", "backward", "forward", "backward", "optimizer"]
    assert timeline.peak.bytes == w.peak_bytes and timeline.peak.micro_batch in (0, 1, None)


def test_a_second_train_keeps_the_costliest_of_both(tmp_path: Path) -> None:
    lengths = [LONG, LONG] + [SHORT] * 10
    t = trainer(tmp_path, data=dataset(lengths), max_steps=1, train_sampling_strategy="sequential")
    w = memlab.watch(t, show=False)
    t.train()
    first = w.timeline
    t.train_dataset = dataset([SHORT] * 12)
    t.train()
    assert len(w.steps) == 2 and w.peak_step == 1 and w.steps[1].peak_bytes < w.steps[0].peak_bytes
    assert w.timeline is first  # the shorter step did not replace it
    w.remove()


def test_the_cuda_form_reads_the_allocators_trace() -> None:
    """A made-up trace as ``torch.cuda.memory._snapshot()`` gives it: blocks alive before the step (a parameter, the
    optimizer state, one the step frees), the step's allocations (an activation, a gradient, the optimizer's), an
    address freed and allocated again, and a free of something never seen."""
    mib = 2**20
    trace = [
        {"action": "alloc", "addr": 100, "size": 4 * mib, "time_us": 10},  # activation, forward
        {"action": "free_requested", "addr": 100, "size": 4 * mib, "time_us": 19},  # ignored: not yet free
        {"action": "alloc", "addr": 200, "size": 1 * mib, "time_us": 20},  # gradient, backward
        {"action": "free_completed", "addr": 100, "size": 4 * mib, "time_us": 21},
        {"action": "free_completed", "addr": 300, "size": 2 * mib, "time_us": 22},  # alive before, unnamed
        {"action": "alloc", "addr": 100, "size": 3 * mib, "time_us": 30},  # the same address, another block
        {"action": "free_completed", "addr": 100, "size": 3 * mib, "time_us": 31},
        {"action": "segment_alloc", "addr": 0, "size": 20 * mib, "time_us": 32},  # segments are not allocations
    ]
    kinds = {0: ("params", 8 * mib), 50: ("optimizer", 2 * mib), 200: ("grads", 1 * mib)}
    sections = [("forward", 5, 15), ("backward", 15, 25), ("optimizer", 25, 40)]
    recording = recording_from_trace(trace, allocated_before=13 * mib, kinds=kinds, sections=sections)
    before = sorted(zip(recording.sizes[: recording.start], (recording.categories[c] for c in recording.cats),
                        strict=False))
    # The parameter and the state by address, the freed block as other, and the rest (1 MiB) as other.
    assert before == [(1 * mib, "other"), (2 * mib, "optimizer"), (2 * mib, "other"), (8 * mib, "params")]
    made = [(recording.sizes[i], recording.categories[recording.cats[i]]) for i in range(recording.start,
                                                                                        len(recording))]
    assert made == [(4 * mib, "activations"), (1 * mib, "grads"), (0, "activations"), (0, "other"),
                    (3 * mib, "optimizer"), (0, "optimizer")]
    assert [name for name, _, _ in recording.sections] == ["forward", "backward", "optimizer"]
    assert recording.sections[0] == ("forward", recording.start, recording.start + 1)
    timeline = Timeline.from_recording(recording, peak_bytes=18 * mib, breakdown={})
    assert timeline.peak.bytes == 18 * mib == max(timeline.totals)  # 13 before, an activation and a gradient
    assert timeline.peak.phase == "backward" and timeline.peak.module == CUDA_MODULE


def test_the_optimizer_phase_holds_the_end_of_a_watched_step(tmp_path: Path) -> None:
    """The optimizer phase was empty (AdamW updates in place: no change between on_pre_optimizer_step and
    on_optimizer_step) and the Trainer's gradient clipping before it and the gradients' release after it were in no
    phase: a white gap and no optimizer band on the figure. It runs from the last backward's end to the step's end,
    holding the gradients' release, as memlab's own step's optimizer phase does."""
    t = trainer(tmp_path, max_steps=2)  # the second step: Adam's moments exist, the update allocates nothing
    w = memlab.watch(t, show=False)
    t.train()
    w.remove()
    timeline = w.timeline
    assert timeline is not None
    (*_, (last, _, backward_end), (name, start, end)) = timeline.phases
    assert (last, name) == ("backward", "optimizer") and start == backward_end < end, timeline.phases
    assert end == timeline.x[-1], (timeline.phases, timeline.x[-1])
    released = [grads for x, grads in zip(timeline.x, timeline.series["grads"], strict=True) if start <= x <= end]
    assert max(released) > 0 and released[-1] == 0  # the gradients are released inside it
