"""The expandable_segments lever: declared, set on a CUDA trial, exported, and answered by ``memlab estimate``.

``Plan(expandable_segments=True)`` (DESIGN.md 2.4): a lever declared as every lever is; on a live CUDA trial the
allocator's expandable segments switched on and the process's setting put back after, failed or not; nothing
changed off CUDA. PyTorch's allocator setting is recorded here (this machine has no GPU): the trial's device is made
to read as CUDA, and every call of ``torch._C._accelerator_setAllocatorSettings`` is kept.

Every export of a plan with ``expandable_segments=True`` writes the line that sets them before CUDA starts
(DESIGN.md 2.4): the plain code as its first comments, the accelerate script as the lines that set the environment
before torch is imported (and the shell line for the launcher), DeepSpeed in its ``_comment``, the Trainer's
arguments in a warning; what the plan trains is exported as without them.

Issue 60, expandable segments in ``memlab estimate``: GPT-2 (2x256) on an H200 allocates 2.24 GiB at its peak;
PyTorch's default allocator reserves 2.79 GiB for it (card 3.54 GiB with the CUDA context), expandable segments
2.47 GiB (card 3.23 GiB). Against 3.3 GiB the plan does not fit by default and fits with expandable segments: the
answer says so, with the lines that set them, and ``--expandable-segments`` estimates it so.

benchmarks/expandable_segments.py on its two smallest rows: both estimates of each row, the same allocated peak,
and the figures it writes computed from them."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import memlab
from memlab import Plan
from memlab.errors import MemlabError, MemlabWarning
from memlab.estimation.cuda.gpus import GPUS
from memlab.estimation.dryrun.reserved import EXPANDABLE_NOTE
from memlab.export.accelerate import accelerate_script
from memlab.frontends.cli.main import main
from memlab.live.device import ENVIRONMENT_LINE, PYTHON_LINE
from memlab.plan import LEVERS, parse_grid
from memlab.runner.step import TrainingStep
from memlab.search.space import runs_as
from memlab.techniques.expandable_segments import ALREADY_NOTE, CPU_NOTE, SWITCHED_NOTE

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models import lm_batch, tiny_llama  # noqa: E402

FAST: dict[str, Any] = {"steps": 1, "noise": 0, "progress": False}


class AllocatorRecorder:
    """Stand-ins for PyTorch's allocator setting and its getter: the settings strings set, in order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, started_with: str = "") -> None:
        self.settings: list[str] = []
        self.now = started_with
        monkeypatch.setattr(torch._C, "_accelerator_setAllocatorSettings", self.set, raising=False)
        monkeypatch.setattr(torch._C, "_accelerator_getAllocatorSettings", lambda: self.now, raising=False)
        monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
        monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)

    def set(self, settings: str) -> None:
        self.settings.append(settings)
        self.now = settings


def on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """The training step reads its model's device as CUDA (its tensors stay on the CPU: a step that runs fails)."""
    monkeypatch.setattr("memlab.runner.step.model_device", lambda model: torch.device("cuda", 0))


def test_the_lever_is_declared_as_every_switch_is() -> None:
    plan = Plan(expandable_segments=True)
    assert LEVERS["expandable_segments"].type == "bool" and LEVERS["expandable_segments"].default is False
    assert plan.label() == "xseg" and plan.describe() == "expandable segments"
    assert Plan(checkpointing=True, expandable_segments=True).label() == "ckpt xseg"
    assert [p.expandable_segments for p in parse_grid(["expandable_segments=off,on"])] == [False, True]
    with pytest.raises(MemlabError, match="write True or False"):
        Plan(expandable_segments="yes")
    # a CPU search runs the plan without them: the same step
    assert runs_as(plan, "cpu") == Plan() and runs_as(plan, "cuda") == plan


def test_a_cpu_trial_runs_the_same_step_and_says_so() -> None:
    model, batch = tiny_llama(), lm_batch(rows=2, length=8)
    plain, switched = memlab.compare(model, batch, [Plan(), Plan(expandable_segments=True)], **FAST).trials
    assert switched.status == "ok" and CPU_NOTE in switched.notes and CPU_NOTE not in plain.notes
    assert switched.peak_bytes == plain.peak_bytes and switched.breakdown == plain.breakdown


def test_a_cuda_trial_switches_them_on_and_puts_the_setting_back(monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = AllocatorRecorder(monkeypatch)
    on_cuda(monkeypatch)
    step = TrainingStep(tiny_llama(), Plan(expandable_segments=True))
    assert recorder.settings == ["expandable_segments:True"], "switched on before the step's first allocation"
    assert SWITCHED_NOTE in step.notes
    step.close()
    assert recorder.settings == ["expandable_segments:True", "expandable_segments:False"]


def test_the_setting_is_put_back_when_the_trial_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = AllocatorRecorder(monkeypatch)
    on_cuda(monkeypatch)
    step = TrainingStep(tiny_llama(), Plan(expandable_segments=True))
    with pytest.raises((RuntimeError, AssertionError)):  # the batch cannot go to a CUDA device here: the step fails
        step(lm_batch(rows=2, length=8))
    assert recorder.now == "expandable_segments:True"
    step.close()  # what the runner does with a failed trial's step (Attempt.take_off, in its finally)
    assert recorder.settings[-1] == "expandable_segments:False"
    # a plan whose other technique refuses it while it goes on: taken off at once, the setting put back
    recorder.settings.clear()
    with pytest.raises(MemlabError):
        TrainingStep(tiny_llama(layers=2), Plan(expandable_segments=True, checkpointing=5))
    assert recorder.settings == ["expandable_segments:True", "expandable_segments:False"]


def test_a_process_that_runs_with_them_is_measured_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = AllocatorRecorder(monkeypatch, started_with="expandable_segments:True")
    on_cuda(monkeypatch)
    step = TrainingStep(tiny_llama(), Plan(expandable_segments=True))
    step.close()
    assert recorder.settings == [] and ALREADY_NOTE in step.notes
    # the environment alone says so on a torch without the getter (2.11)
    recorder = AllocatorRecorder(monkeypatch)
    monkeypatch.delattr(torch._C, "_accelerator_getAllocatorSettings")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    TrainingStep(tiny_llama(), Plan(expandable_segments=True)).close()
    assert recorder.settings == []


def test_a_plan_without_them_and_a_dry_run_change_no_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = AllocatorRecorder(monkeypatch)
    on_cuda(monkeypatch)
    TrainingStep(tiny_llama(), Plan()).close()
    assert recorder.settings == []
    monkeypatch.undo()
    recorder = AllocatorRecorder(monkeypatch)
    trial = memlab.estimate(tiny_llama(), lm_batch(rows=2, length=8), Plan(expandable_segments=True), device="cuda")
    assert trial.status == "ok" and recorder.settings == [], "a dry run never touches the real allocator"


def _llama_config() -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                       vocab_size=32000)


@pytest.mark.slow
def test_the_plans_lever_decides_the_allocator_its_estimate_assumes() -> None:
    from memlab.estimation.dryrun.reserved import EXPANDABLE_NOTE
    from memlab.estimation.estimate import estimate_plans

    shapes = {"input_ids": (4, 256), "labels": (4, 256)}
    keyword = memlab.estimate(_llama_config(), shapes, Plan(), device="cuda", gpu="H200-141GB",
                              expandable_segments=True)
    lever = memlab.estimate(_llama_config(), shapes, Plan(expandable_segments=True), device="cuda", gpu="H200-141GB")
    both = memlab.estimate(_llama_config(), shapes, Plan(expandable_segments=True), device="cuda", gpu="H200-141GB",
                           expandable_segments=True)
    default = memlab.estimate(_llama_config(), shapes, Plan(), device="cuda", gpu="H200-141GB")
    assert lever.reserved_bytes == keyword.reserved_bytes == both.reserved_bytes
    assert lever.peak_bytes == default.peak_bytes and lever.reserved_bytes < default.reserved_bytes
    assert EXPANDABLE_NOTE in lever.notes and EXPANDABLE_NOTE not in default.notes
    # several plans in one dry run (what fit and the CLI's --try make): each plan's own allocator, as estimated alone
    for model in (_llama_config(), tiny_llama(layers=4, width=64)):  # a config carried from a few layers; a live model
        plain, switched = estimate_plans(model, shapes, [Plan(), Plan(expandable_segments=True)], device="cuda",
                                         gpu=GPUS["H200-141GB"]).trials
        alone = [memlab.estimate(model, shapes, Plan(), device="cuda", gpu="H200-141GB", expandable_segments=on)
                 for on in (False, True)]
        assert plain.reserved_bytes == alone[0].reserved_bytes and EXPANDABLE_NOTE not in plain.notes
        assert switched.reserved_bytes == alone[1].reserved_bytes != plain.reserved_bytes
        assert EXPANDABLE_NOTE in switched.notes and switched.peak_bytes == plain.peak_bytes


PLAN = Plan(micro_batch=2, accumulation=4, checkpointing=True, precision="bf16", expandable_segments=True)
WITHOUT = PLAN.replace(expandable_segments=False)


def _before_torch(script: str) -> list[str]:
    lines = script.splitlines()
    return lines[: lines.index("import torch")]


def test_the_code_says_first_how_to_set_them() -> None:
    code = PLAN.to_code()
    head = _before_torch(code)
    assert f"#   {ENVIRONMENT_LINE}" in head and f"#   {PYTHON_LINE}" in head
    assert all(line.startswith("#") for line in head), "the snippet's model is on its GPU already: said, not set"
    assert ENVIRONMENT_LINE not in WITHOUT.to_code()
    plain = WITHOUT.to_code()
    assert code.splitlines()[len(head):] == plain.splitlines()[len(_before_torch(plain)):], "the same loop"
    compile(code, "<plan>", "exec")


@pytest.mark.parametrize("strategy", ["fsdp2", "fsdp1", "zero2", "zero3"])
def test_the_accelerate_script_sets_them_before_torch_and_the_launcher_line_says_so(
        strategy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    script = accelerate_script(PLAN, strategy=strategy)
    head = _before_torch(script)
    assert any(ENVIRONMENT_LINE in line for line in head)
    # set first, so that monkeypatch puts back its absence too (delenv of an absent name records nothing, and the
    # script's line would stay in this process's environment for the tests after)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "")
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    exec("\n".join(head), {})  # the script's own lines, run as it runs them
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert script.splitlines()[len(head):] == accelerate_script(WITHOUT, strategy=strategy).splitlines()[1:]
    assert "PYTORCH_CUDA_ALLOC_CONF" not in accelerate_script(WITHOUT, strategy=strategy)
    compile(script, "train.py", "exec")
    assert PLAN.to_accelerate_config(gpus=2, strategy=strategy) == WITHOUT.to_accelerate_config(gpus=2,
                                                                                                  strategy=strategy)


def test_deepspeed_says_the_line_in_its_comment() -> None:
    config = PLAN.to_deepspeed()
    assert ENVIRONMENT_LINE in config["_comment"]
    assert {k: v for k, v in config.items() if k != "_comment"} == {
        k: v for k, v in WITHOUT.to_deepspeed().items() if k != "_comment"}


def test_the_trainers_arguments_warn_with_the_line(recwarn: pytest.WarningsRecorder) -> None:
    with pytest.warns(MemlabWarning, match="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True") as caught:
        kwargs = PLAN.to_training_arguments()
    assert PYTHON_LINE in str(caught[0].message)
    with pytest.warns(MemlabWarning, match="expandable_segments:True") as caught_trl:
        trl_kwargs = PLAN.to_training_arguments(trl=True)
    # the warning points at the line that asked, past memlab's own calls (the Plan's seam, the TRL keywords)
    assert {Path(w.filename).resolve() for w in (*caught, *caught_trl)} == {Path(__file__).resolve()}
    with warnings.catch_warnings():
        warnings.simplefilter("error", MemlabWarning)
        assert kwargs == WITHOUT.to_training_arguments() and trl_kwargs == WITHOUT.to_training_arguments(trl=True)


def test_peft_config_is_the_adapters_alone() -> None:
    lora = Plan(adapter="lora", expandable_segments=True)
    assert lora.to_peft_config() == lora.replace(expandable_segments=False).to_peft_config()


QUESTION = ["estimate", "gpt2", "--batch", "2x256", "--gpu", "H200-141GB", "--budget", "3.3GiB"]


def _run(argv: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(argv)
    return status, out.getvalue()


@pytest.fixture(scope="module")
def default() -> tuple[int, str]:
    return _run(QUESTION)


def test_a_plan_that_fits_only_with_expandable_segments_is_suggested_with_the_line_to_set(
        default: tuple[int, str]) -> None:
    status, text = default
    assert status == 1  # as asked (the default allocator), nothing fits
    assert "Fits with the CUDA allocator's expandable segments" in text
    # the plan suggested has the lever on (what --try, apply and the exports take), its command estimates it so
    assert "  xseg: card 3.23 GiB (3.54 GiB with the default allocator)" in text
    assert ENVIRONMENT_LINE in text and PYTHON_LINE in text
    assert "--budget 3.3GiB --gpu H200-141GB --try expandable_segments=on\n" in text


def test_the_suggested_plan_fits_as_suggested() -> None:
    status, text = _run([*QUESTION, "--try", "expandable_segments=on"])
    assert status == 0 and "xseg" in text and "Fits with the CUDA allocator's expandable segments" not in text


def test_expandable_segments_on_the_command_line_fit_and_say_so() -> None:
    status, text = _run([*QUESTION, "--expandable-segments", "--json"])
    assert status == 0
    assert EXPANDABLE_NOTE.split(" (")[0] in text
    assert "Fits with the CUDA allocator's expandable segments" not in text


def test_no_suggestion_where_the_allocated_peak_itself_is_over_the_budget() -> None:
    status, text = _run([*QUESTION[:-1], "2.9GiB"])  # 2.24 GiB + 0.76 GiB context: over, whatever the reserve
    assert status == 1 and "expandable" not in text


def test_the_benchmark_estimates_each_row_both_ways(tmp_path: Path) -> None:
    from benchmarks import expandable_segments as runner

    result = runner.main(["--smoke", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "expandable_segments-cpu-smoke.json").read_text())
    assert data["markdown"] == result["markdown"] and data["rows_done"] == "2 of 2"
    for row in data["rows"]:
        assert row["status"] == "ok" and row["same_allocated_peak"]
        saved = row["estimate_reserved_bytes"] - row["expandable_reserved_bytes"]
        assert row["saved_mib"] == round(saved / 2**20, 1)
        assert row["expandable_reserved_bytes"] >= row["estimate_peak_bytes"]
    with pytest.raises(SystemExit):
        runner.main(["--device", "cuda", "--out", str(tmp_path)])
