"""The report's tables and card (memlab.report.views.tables): the card's CUDA readings, and the demo's table and HTML.

What the card shows: the reserved peak and the CUDA context beside the allocated peak, and verdicts on them.

No GPU here: the CUDA readings are tested with monkeypatched ``torch.cuda`` functions and a fake ``pynvml``.

Issue 48's layout items off the browser: ``memlab demo``'s table within a 120-column terminal (the notes under
it, numbered, and the memory categories left out where they would not fit), and its HTML report small (the static
SVG figure inlined, not plotly.js) with the verdict marks its table prints. (The progress bar piped to a log is
``tests/runner/test_progress.py::test_no_bar_is_animated_into_a_log``.)"""

from __future__ import annotations

import dataclasses
import importlib.machinery
import json
import os
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from reports import report_of

from memlab.errors import MemlabError
from memlab.estimation.cuda.context import card_context, card_contexts
from memlab.estimation.cuda.gpus import DEFAULT_GPU, GPUS, gpu_kind
from memlab.frontends.cli.main import terminal_width, write_html_report
from memlab.measure import cuda
from memlab.plan import Plan
from memlab.report import Report, Trial
from memlab.report.views.tables import card_line, judged_text, nothing_fits_reason, text_table, verdict_text
from memlab.search.fitting.measured import fits_only_uncapped
from memlab.search.space import fits

GIB = 1024**3
MIB = 1024**2


def cuda_trial(peak: int, reserved: int | None = None, context: int | None = None, **fields: Any) -> Trial:
    return Trial(Plan(), "ok", peak, {"params": peak // 2}, None, None, None, "cuda:0", reserved_bytes=reserved,
                 context_bytes=context, **fields)


# --- Trial and Report ----------------------------------------------------------------------------------------------


def test_the_card_figure_is_reserved_plus_context_and_only_when_both_are_known() -> None:
    assert cuda_trial(20 * GIB, 23 * GIB, GIB).card_bytes == 24 * GIB
    assert cuda_trial(20 * GIB, 23 * GIB).card_bytes is None
    assert cuda_trial(20 * GIB, None, GIB).card_bytes is None
    assert cuda_trial(20 * GIB, 0, 0).card_bytes == 0  # zero is known, not missing


def test_a_verdict_judges_the_card_figure_where_known_else_the_allocated_peak() -> None:
    # 20 GiB allocated fits 24 GiB; the card shows 23.5 GiB reserved and 0.75 GiB context: it does not.
    judged = cuda_trial(20 * GIB, 23 * GIB + 512 * MIB, 768 * MIB, budget=24 * GIB)
    assert judged.verdict_bytes == judged.card_bytes == 24 * GIB + 256 * MIB
    assert judged.verdict_figure == "card" and not judged.fits
    unknown = dataclasses.replace(judged, context_bytes=None)
    assert unknown.verdict_bytes == 20 * GIB and unknown.verdict_figure == "allocated" and unknown.fits
    report = Report([dataclasses.replace(judged, budget=None), dataclasses.replace(unknown, budget=None)],
                    budget=24 * GIB)
    assert [report.fits(trial) for trial in report] == [False, True]
    assert report.best is report.trials[1]
    assert fits(judged, 24 * GIB) is False and fits(judged, 25 * GIB) is True and fits(unknown, 24 * GIB) is True


def test_the_new_fields_survive_dict_json_and_dataframe() -> None:
    trial = cuda_trial(20 * GIB, 23 * GIB, 800 * MIB, budget=24 * GIB)
    data = trial.to_dict()
    assert data["context_bytes"] == 800 * MIB and data["card_bytes"] == 23 * GIB + 800 * MIB
    assert data["verdict_figure"] == "card" and data["fits"] is True
    assert Trial.from_dict(data) == trial
    report = Report([trial, cuda_trial(GIB)], budget=24 * GIB)
    again = Report.from_json(report.to_json())
    assert again == report and again.trials[0].context_bytes == 800 * MIB
    assert json.loads(report.to_json())["trials"][1]["verdict_figure"] == "allocated"
    frame = report.to_dataframe()
    assert list(frame["context_bytes"].astype("object").fillna(-1)) == [800 * MIB, -1]
    assert "card_bytes" in frame.columns and "verdict_figure" in frame.columns
    old = {key: value for key, value in data.items() if key not in ("context_bytes", "card_bytes")}
    assert Trial.from_dict(old).context_bytes is None  # a report saved before the field reads back


# --- tables ----------------------------------------------------------------------------------------------------------


def test_the_table_shows_the_card_column_and_says_which_figure_it_judged() -> None:
    over = dataclasses.replace(cuda_trial(20 * GIB, 23 * GIB + 512 * MIB, 768 * MIB), plan=Plan(checkpointing=True))
    report = Report([cuda_trial(10 * GIB, 11 * GIB, 768 * MIB), over], budget=24 * GIB)
    lines = report.to_text().splitlines()
    assert lines[0].split()[:6] == ["plan", "status", "peak", "GiB", "card", "GiB"]
    assert lines[1].split()[1:5] == ["plain", "ok", "10.0", "11.8"]
    assert "does not fit (over budget)" in lines[2] and lines[2].split()[6:8] == ["20.0", "24.2"]
    assert "Card: allocator reserve + CUDA context (what nvidia-smi shows); fits are judged on it" in lines
    assert ("Best: plain (lowest peak among the plans that fit, nothing was timed: peak 10.00 GiB, card 11.75 GiB)"
            in lines)
    assert "card GiB" in report._repr_html_()


def test_a_cuda_table_without_card_figures_says_they_are_unknown_and_a_cpu_table_says_nothing() -> None:
    unknown = Report([cuda_trial(GIB, None, 768 * MIB)], budget=2 * GIB)
    text = unknown.to_text()
    assert "card" not in text.splitlines()[0]  # no column of dashes
    assert ("Card figure unknown (the allocator's reserve or the CUDA context is not known); fits are judged on "
            "the allocated peak") in text
    mixed = Report([cuda_trial(GIB, GIB, GIB), cuda_trial(GIB)], budget=4 * GIB)
    assert card_line(mixed) is not None and "where known, else on the allocated peak" in card_line(mixed)  # type: ignore[operator]
    assert card_line(Report([cuda_trial(GIB, GIB, GIB)])) == (
        "Card: allocator reserve + CUDA context (what nvidia-smi shows)"  # no budget: nothing judged
    )
    cpu = Trial(Plan(), "ok", GIB, {}, None, None, None, "cpu", budget=2 * GIB)
    assert card_line(Report([cpu])) is None and "Card" not in Report([cpu]).to_text()
    assert verdict_text(cpu, True) == "fits"


def test_why_nothing_fits_names_the_card_figure_when_it_judged_it() -> None:
    trial = cuda_trial(20 * GIB, 23 * GIB + 512 * MIB, 768 * MIB)
    reason = nothing_fits_reason(Report([trial], budget=24 * GIB))
    assert reason == "the smallest card figure, 24.25 GiB (plain), is 256.0 MiB over the budget of 24.00 GiB"
    assert judged_text(trial) == "card 24.25 GiB (peak 20.00 GiB)"
    assert verdict_text(trial, False) == "does not fit by the card figure"


def test_the_panel_says_which_figure_it_judged() -> None:
    from memlab.frontends.jupyter.panel_core import PanelCore

    trial = cuda_trial(20 * GIB, 23 * GIB + 512 * MIB, 768 * MIB)
    message, kind = PanelCore._message(None, trial, Report([trial], budget=24 * GIB))  # type: ignore[arg-type]
    assert message == "plain: does not fit: card 24.25 GiB (peak 20.00 GiB) is over the budget" and kind == "warn"


def test_fit_reruns_under_the_cap_a_first_plan_whose_allocator_took_more_than_the_budget_leaves_it() -> None:
    # Allocated 90 + context 20 is within 140; the reserve of 130 + 20 is not: the cap (at 140 - 20) decides.
    assert fits_only_uncapped(cuda_trial(90, 130, 20), 140)
    assert not fits_only_uncapped(cuda_trial(90, 110, 20), 140)  # fits by the card figure already
    assert not fits_only_uncapped(cuda_trial(130, 150, 20), 140)  # the allocated peak and the context alone are over
    assert fits_only_uncapped(cuda_trial(90, 130), 100)  # no context read: the reserve against the budget, as before


# --- the context read on CUDA (monkeypatched torch.cuda) --------------------------------------------------------------


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A GPU of 80 GiB with 30 GiB free to this machine, whose allocator reserves 40 GiB, as torch.cuda reports it."""
    state: dict[str, Any] = {"free": 30 * GIB, "total": 80 * GIB, "reserved": 40 * GIB, "fractions": []}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (state["free"], state["total"]))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: state["reserved"])
    properties = types.SimpleNamespace(uuid="0a1b2c3d-0000-1111-2222-333344445555", total_memory=state["total"])
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: properties)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda device=None: 1.0, raising=False)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction",
                        lambda fraction, device=None: state["fractions"].append(fraction))
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    monkeypatch.setattr(cuda.importlib.util, "find_spec", lambda name, *a: None if name == "pynvml" else _spec(name))
    return state


def _spec(name: str) -> Any:
    return importlib.machinery.PathFinder.find_spec(name)


class _NVMLError(Exception):
    pass


def fake_pynvml(monkeypatch: pytest.MonkeyPatch, processes: list[Any], *, fails: bool = False) -> dict[str, Any]:
    """A ``pynvml`` that lists ``processes`` on the GPU whose UUID it is asked for (and records the calls)."""
    calls: dict[str, Any] = {"uuid": None}
    module = types.ModuleType("pynvml")
    module.__spec__ = importlib.machinery.ModuleSpec("pynvml", None)
    module.NVMLError = _NVMLError  # type: ignore[attr-defined]

    def init() -> None:
        if fails:
            raise _NVMLError("driver not loaded")

    def by_uuid(uuid: bytes) -> str:
        calls["uuid"] = uuid
        return "handle"

    module.nvmlInit = init  # type: ignore[attr-defined]
    module.nvmlDeviceGetHandleByUUID = by_uuid  # type: ignore[attr-defined]
    module.nvmlDeviceGetComputeRunningProcesses = lambda handle: processes  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", module)
    monkeypatch.setattr(cuda.importlib.util, "find_spec", lambda name, *a: module.__spec__)
    return calls


def test_without_pynvml_the_context_is_the_devices_used_memory_less_the_reserve(fake_gpu: dict[str, Any]) -> None:
    # used = 80 - 30 = 50 GiB, of which the allocator reserves 40: 10 GiB, other processes included.
    assert cuda.cuda_context_bytes("cuda:0") == 10 * GIB
    fake_gpu["reserved"] = 60 * GIB  # never negative
    assert cuda.cuda_context_bytes("cuda:0") == 0


def test_with_pynvml_the_context_is_this_processs_own(
    monkeypatch: pytest.MonkeyPatch, fake_gpu: dict[str, Any]
) -> None:
    mine = types.SimpleNamespace(pid=os.getpid(), usedGpuMemory=40 * GIB + 600 * MIB)
    other = types.SimpleNamespace(pid=os.getpid() + 1, usedGpuMemory=9 * GIB)  # another process: not ours
    calls = fake_pynvml(monkeypatch, [other, mine])
    assert cuda.cuda_context_bytes("cuda:0") == 600 * MIB
    assert calls["uuid"] == b"GPU-0a1b2c3d-0000-1111-2222-333344445555"


@pytest.mark.parametrize("case", ["not-listed", "no-figure", "nvml-fails"])
def test_when_nvml_cannot_say_the_device_wide_figure_is_used(
    case: str, monkeypatch: pytest.MonkeyPatch, fake_gpu: dict[str, Any]
) -> None:
    processes = {
        "not-listed": [types.SimpleNamespace(pid=os.getpid() + 1, usedGpuMemory=GIB)],  # a container's pids
        "no-figure": [types.SimpleNamespace(pid=os.getpid(), usedGpuMemory=None)],
        "nvml-fails": [],
    }[case]
    fake_pynvml(monkeypatch, processes, fails=case == "nvml-fails")
    assert cuda.cuda_context_bytes("cuda:0") == 10 * GIB


def test_the_cap_leaves_room_for_the_context(fake_gpu: dict[str, Any]) -> None:
    with cuda.cap_cuda_memory(24 * GIB, "cuda:0"):
        pass
    # the budget is the card's: 24 GiB less the 10 GiB context, of 80 GiB; then the fraction before comes back
    assert fake_gpu["fractions"] == [pytest.approx(14 / 80), 1.0]
    with cuda.cap_cuda_memory(5 * GIB, "cuda:0"):  # less than the context: nothing can be allocated
        pass
    assert fake_gpu["fractions"][-2] == 0.0


def test_the_default_budget_is_the_card_the_process_can_reach(fake_gpu: dict[str, Any]) -> None:
    # free 30 + reserved 40 is what the allocator can hold; the 10 GiB context beside it is on the card too.
    assert cuda.cuda_card_capacity("cuda:0") == 80 * GIB
    with cuda.cap_cuda_memory(cuda.cuda_card_capacity("cuda:0"), "cuda:0"):
        pass
    assert fake_gpu["fractions"][0] == pytest.approx(70 / 80)  # the allocator may still take all that is free


def test_cuda_peak_reads_the_context_on_exit(monkeypatch: pytest.MonkeyPatch, fake_gpu: dict[str, Any]) -> None:
    for name in ("synchronize", "reset_peak_memory_stats"):
        monkeypatch.setattr(torch.cuda, name, lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 0)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 35 * GIB)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: 40 * GIB)
    with cuda.CudaPeak("cuda:0") as probe:
        assert probe.context is None
    fake_gpu["free"] -= GIB  # the context is read when first asked for after the block, then kept
    assert (probe.peak_allocated, probe.peak_reserved, probe.context) == (35 * GIB, 40 * GIB, 11 * GIB)
    fake_gpu["free"] -= GIB
    assert probe.context == 11 * GIB


# --- the context modelled in an estimate -----------------------------------------------------------------------------


def test_every_gpu_kind_says_where_its_context_comes_from() -> None:
    assert DEFAULT_GPU == "H100-80GB" and gpu_kind().name == DEFAULT_GPU
    assert GPUS[DEFAULT_GPU].context_bytes == 812_449_792 and GPUS[DEFAULT_GPU].source.startswith("measured")
    assert all(kind.source.startswith(("measured", "assumed")) and kind.context_bytes > 0 for kind in GPUS.values())
    assert gpu_kind("l4-24gb").name == "L4-24GB"
    with pytest.raises(MemlabError, match="write one of H100-80GB, "):
        gpu_kind("TPU")


def test_card_context_models_the_gpu_or_reads_the_live_one(monkeypatch: pytest.MonkeyPatch) -> None:
    estimated = dataclasses.replace(cuda_trial(GIB, 2 * GIB), device="cuda", estimated=True, notes=("a",))
    a100 = card_context(estimated, GPUS["A100-80GB"])
    assert a100.context_bytes == GPUS["A100-80GB"].context_bytes and a100.card_bytes is not None
    assert a100.notes[0] == "a" and "modelled for an A100-80GB" in a100.notes[-1]
    assert "assumed" in a100.notes[-1] and "card figure (reserve + CUDA context)" in a100.notes[-1]
    unknown = card_context(dataclasses.replace(estimated, reserved_bytes=None))
    assert unknown.card_bytes is None and unknown.notes[-1].endswith(
        "card figure unknown: the allocator's reserve is not known")
    monkeypatch.setattr(cuda, "cuda_context_bytes", lambda device: 500 * MIB)
    read = card_context(a100, read_on=torch.device("cuda", 0))
    assert read.context_bytes == 500 * MIB and "read on cuda:0" in read.notes[-1]
    assert len(read.notes) == len(a100.notes)  # the modelled note is replaced, not added to
    cpu = dataclasses.replace(estimated, device="cpu")
    assert card_contexts([cpu], GPUS["L4-24GB"]) == [cpu]




def _noted_report() -> Report:
    notes = ("timed again in turn with ckpt, mb4x2 ckpt (3 rounds): close in speed when first measured",)
    trials = [
        Trial(Plan(), "ok", 35 * MIB, {"params": 4 * MIB, "activations": 31 * MIB}, 0.036, 223.0, None, "cpu",
              rows_per_step=8, step_times=(0.035, 0.036, 0.037)),
        Trial(Plan(micro_batch=2, accumulation=4, loss="chunked"), "ok", 20 * MIB, {"params": 20 * MIB}, 0.065,
              124.0, None, "cpu", rows_per_step=8, step_times=(0.064, 0.065, 0.066), notes=notes),
        Trial(Plan(checkpointing=True), "ok", 19 * MIB, {"params": 19 * MIB}, 0.047, 169.0, None, "cpu",
              rows_per_step=8, step_times=(0.046, 0.047, 0.048), notes=notes),
        Trial(Plan(checkpointing=2), "oom", 23 * MIB, {}, None, None, None, "cpu", error="out of memory",
              budget=21 * MIB),
    ]
    return Report(trials, budget=21 * MIB)


def test_the_table_keeps_within_the_terminals_columns() -> None:
    report = _noted_report()
    wide = text_table(report)
    assert max(len(line) for line in wide.splitlines()) > 120  # what a 120-column terminal wrapped
    narrow = text_table(report, width=120)
    lines = narrow.splitlines()
    assert max(len(line) for line in lines) <= 120, narrow
    # Every row is still one line, with its status; its notes are under the table, numbered once.
    rows = [line for line in lines if re.match(r"^[\u2605\u2248 ] \S", line)][1:]
    assert [row.split()[-1] for row in rows if "[" in row] == ["[1]", "[1]", "[2]"], rows
    assert "[1] timed again in turn" in narrow and narrow.count("timed again in turn") == 1
    assert "does not fit (over budget)" in narrow and "does not fit (OOM)" in narrow
    assert "Memory by category (params, grads, optimizer, activations, other) left out to fit 120 columns" in (
        " ".join(narrow.split())
    )
    assert text_table(report, width=400) == wide  # room enough: the table as it was


def test_the_lines_under_the_table_keep_within_the_terminal_too() -> None:
    """The summary under the table (ties, plans not measured) went past 120 columns in the demo."""
    report = _noted_report()
    report.skipped = [(Plan(micro_batch=1, accumulation=8, checkpointing=True, loss="chunked"),
                       "estimated (dry run on fake tensors) not to fit, a reason as long as the search can write "
                       "when it says why")] * 9
    wide = text_table(report)
    assert any(len(line) > 120 for line in wide.splitlines()[-6:])
    narrow = text_table(report, width=120)
    assert max(len(line) for line in narrow.splitlines()) <= 120, narrow
    assert " ".join(wide.split()).endswith(" ".join(narrow.split())[-40:])  # the same words, wrapped


def test_the_demo_reads_its_width_from_columns_or_the_terminal(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import io

    monkeypatch.setenv("COLUMNS", "120")
    assert terminal_width(io.StringIO()) == 120
    monkeypatch.delenv("COLUMNS")
    assert terminal_width(io.StringIO()) is None  # a log: no width to keep within


def test_the_html_report_is_small_and_marks_each_plans_verdict_as_its_table(tmp_path: Path) -> None:
    report = report_of(24, budget_mib=1000)
    page = Path(write_html_report(report, tmp_path / "report.html")).read_text()
    assert len(page.encode()) < 150_000  # plotly.js inlined made it 4.8 MB
    assert "<svg" in page and "plotly" not in page.lower()
    drawn = {label: verdict for verdict, label in re.findall(
        r'<g class="plan" data-verdict="([^"]+)"[^>]*><title>(?:#\d+ )?([^\n<]+)', page)}
    table = {
        trial.label: "out of memory" if trial.status == "oom" else "fits" if report.fits(trial) else "over budget"
        for trial in report.trials
    }
    assert drawn == table
    assert {"fits", "over budget", "out of memory"} <= set(table.values())


def test_a_long_note_goes_under_the_html_table_numbered() -> None:
    from memlab.report.views.tables import html_table

    table = html_table(_noted_report())
    note = "timed again in turn with ckpt, mb4x2 ckpt (3 rounds): close in speed when first measured"
    assert table.count(note) == 1 and f"[1] {note}" in table  # once, under the table
    assert table.count(">[1]</td>") == 2  # its rows say its number
    assert ">out of memory</td>" in table  # a short note stays in its row


def test_table_lines_are_what_pandas_printed_of_the_padded_cells() -> None:
    import pandas

    from memlab.report.views.tables import _LEFT, headers, shown_columns, table_rows, text_lines

    for report in (_noted_report(), Report(_noted_report().trials[:1])):
        rows, names = table_rows(report), headers(report)
        keys = shown_columns(rows, with_mark=True, categories=report.categories)
        lines = text_lines(rows, names, keys)
        # each column's cells padded as _text_lines pads them, joined by pandas as before
        cells = [[row[key] for key in keys] for row in rows]
        width = {key: max(len(names[key]), *(len(row[key]) for row in rows)) for key in keys}

        def pad(key: str, text: str, width: dict[str, int] = width) -> str:
            return text.ljust(width[key]) if key in _LEFT else text.rjust(width[key])

        header = [pad(key, names[key]) for key in keys]
        frame = pandas.DataFrame([[pad(key, cell) for key, cell in zip(keys, row, strict=True)] for row in cells],
                                 columns=header)
        printed = frame.to_string(index=False, formatters={name: str for name in header})
        assert lines == [line.rstrip() for line in printed.splitlines()]
