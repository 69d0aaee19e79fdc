"""precision (bf16, fp16): mixed precision keeps fp32 master weights and trains, and a bf16 trial measured on a CPU
says why it is slow where its speed is read."""

from __future__ import annotations

import pytest
import torch
from models import (
    lm_batch,
    tiny_gpt2,
)

import memlab
from memlab.techniques.precision import ScaledStep


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_keeps_fp32_master_weights_and_trains(precision):
    model, batch = tiny_gpt2(), lm_batch(rows=4)
    with memlab.apply(model, memlab.Plan(precision=precision), lr=1e-2) as applied:
        first = applied.step(batch)
        for _ in range(5):
            last = applied.step(batch)
        assert all(p.dtype == torch.float32 for p in model.parameters())
        assert isinstance(applied._step.parts.optimizer_step, ScaledStep) == (precision == "fp16")
    assert last < first
    if precision == "fp16":
        assert any("fp16 on CPU is slow" in note for note in applied.notes)


EMULATED, NATIVE = frozenset({"avx2", "fma"}), frozenset({"avx512f", "avx512_bf16", "amx_bf16"})
"""Two CPUs' flags as /proc/cpuinfo lists them: one without bf16 matrix units (a laptop's), one with them (a Sapphire
Rapids Xeon's, this project's CI machine)."""


@pytest.fixture(params=[EMULATED, NATIVE], ids=["emulated", "native"])
def cpu(request, monkeypatch):
    """This machine's CPU made to list ``request.param``'s flags (what memlab reads of /proc/cpuinfo)."""
    from memlab.techniques import precision

    monkeypatch.setattr(precision, "machine_cpu_flags", lambda: request.param)
    return request.param


def test_bf16_measured_on_a_cpu_says_why_it_is_slow_only_where_the_cpu_emulates_it(cpu):
    """Issue 71 item 11: notebook 06's bf16 plans ran about ten times slower than fp32 on a CPU and nothing said why.
    Issue 84 item 7: on a CPU with bf16 matrix units (this one: amx_bf16, avx512_bf16) notebook 06 measured bf16 at 136
    samples/s against fp32's 94 under a note "slow on most CPUs". The trial says it (a note: the table's notes, the
    CLI's) where the CPU's flags list no bf16 matrix unit, and the figures say it from the trial, in the key under the
    static figure and in the plotly figure's hover of each such plan; a CPU with them gets no such words; an fp32
    plan says nothing of it, nor does a dry run."""
    from memlab.report.views.figure import report_figure
    from memlab.report.views.static import report_svg
    from memlab.report.views.tables import text_table
    from memlab.techniques.precision import BF16_ON_CPU, BF16_ON_CPU_SHORT

    emulated = cpu == EMULATED
    report = memlab.compare(tiny_gpt2(), lm_batch(rows=4), [memlab.Plan(), memlab.Plan(precision="bf16")],
                            steps=1, noise=0, progress=False)
    plain, bf16 = report.trials
    assert (BF16_ON_CPU in bf16.notes) == emulated and BF16_ON_CPU not in plain.notes
    assert ("bf16 on this CPU is emulated" in text_table(report, width=200)) == emulated
    svg = report_svg(report)  # once, beside the key's title (a search of 24 plans has 12 in bf16)
    assert svg.count(BF16_ON_CPU_SHORT) == emulated and (f"bf16 plans: {BF16_ON_CPU_SHORT}" in svg) == emulated
    hovers = [text for trace in report_figure(report).data if trace.hovertext for text in trace.hovertext]
    assert any(BF16_ON_CPU_SHORT in text for text in hovers if "bf16" in text.split("<br>")[0]) == emulated
    assert not any(BF16_ON_CPU_SHORT in text for text in hovers if "plain" in text.split("<br>")[0])
    estimate = memlab.estimate(tiny_gpt2(), lm_batch(rows=4), memlab.Plan(precision="bf16"), device="cpu")
    assert BF16_ON_CPU not in estimate.notes


def test_the_demo_says_what_the_cpu_does_with_bf16(cpu):
    """``memlab demo`` left bf16 out on any CPU as "slow here"; it says why from the same rule: emulated where the
    CPU lists no bf16 matrix unit, native (and how to measure it) where it lists one, naming the units."""
    from memlab.frontends.demo import cpu_search_note

    said = cpu_search_note()
    assert ("emulates bf16" in said) == (cpu == EMULATED) and ("natively" in said) == (cpu == NATIVE)
    assert ("amx_bf16, avx512_bf16)" in said) == (cpu == NATIVE)
    assert "slow here" not in said


def test_cpu_flags_are_read_as_linux_lists_them():
    """x86's "flags" and Arm's "Features" lines; a bf16 unit named on either is found, and nothing else counts."""
    from memlab.techniques.precision import cpu_bf16_units, cpu_flags

    x86 = "processor\t: 0\nflags\t\t: fpu avx2 avx512_bf16 amx_tile\nbugs\t\t: spectre_v1\n\nprocessor\t: 1\n"
    arm = "processor\t: 0\nFeatures\t: fp asimd sve bf16\nCPU implementer\t: 0x41\n"
    assert cpu_bf16_units(cpu_flags(x86)) == ("avx512_bf16",) and cpu_bf16_units(cpu_flags(arm)) == ("bf16",)
    assert cpu_bf16_units(cpu_flags("flags : avx2 avx512f avx512_vnni\nbugs : avx512_bf16_missing")) == ()


def test_the_docs_state_the_rule_the_note_follows():
    """The README's line on bf16 on a CPU, docs/jupyter.md and notebook 06's words say what the note, the figures and
    the demo follow (bf16 is native on a CPU whose flags list bf16 matrix units, emulated elsewhere) rather than that
    a CPU emulates bf16, which this project's own CI machine does not."""
    from pathlib import Path

    from memlab.techniques.precision import CPU_BF16_UNITS

    root = Path(__file__).resolve().parents[2]
    for path in ("README.md", "docs/jupyter.md", "notebooks/src/06_memfit_and_panel.py"):
        text = " ".join((root / path).read_text().replace("#", " ").split())
        assert all(unit in text for unit in CPU_BF16_UNITS[:2]), f"{path} does not name the bf16 units"
        for stale in ("a CPU emulates bf16", "most CPUs have no bf16", "slow on most CPUs"):
            assert stale not in text, f"{path}: {stale!r}"
