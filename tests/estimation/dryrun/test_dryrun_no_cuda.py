"""No dry run calls a real CUDA API (DESIGN.md 2.4), on every route that takes a live object (issue 57, item 1).

On an H200, ``memlab.fit(sft_trainer)`` (TRL's SFTTrainer with a peft LoRA config) killed the process's CUDA context:
the dry run's runner saved and put back the CUDA RNG of every device while its fake mode was active. On a machine
without CUDA that branch never ran (``torch.cuda.is_initialized()`` is False). Here it does: ``is_initialized`` says
True, and every CUDA function that reads or changes the device's state (RNG, allocator statistics, the cache, the
memory cap, synchronisation) is replaced by a recorder that keeps a stand-in state and marks a violation when called
while a fake tensor mode, any other dispatch mode or a torch-function mode (CUDA's kernels emulated) is active. Each
route runs on a live model, trainer or VLM, and must leave no violation, the live model, its gradients and the CPU
RNG as they were, and the (stand-in) CUDA RNG untouched.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.utils.checkpoint

import memlab
from memlab import Plan
from memlab.estimation.cuda.gpus import GPUS
from memlab.estimation.dryrun.fake import FakeMode

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from models import assert_same, fingerprint, lm_batch, tiny_llama  # noqa: E402

FAST: dict[str, Any] = {"steps": 1, "noise": 0, "progress": False}

# Functions of torch.cuda that reach the real device (or its allocator) when CUDA is initialised.
RECORDED = (
    "get_rng_state", "get_rng_state_all", "set_rng_state", "set_rng_state_all", "manual_seed", "manual_seed_all",
    "seed", "seed_all", "initial_seed", "empty_cache", "synchronize", "reset_peak_memory_stats",
    "reset_max_memory_allocated", "reset_accumulated_memory_stats", "max_memory_allocated", "memory_allocated",
    "memory_reserved", "max_memory_reserved", "memory_stats", "set_per_process_memory_fraction", "mem_get_info",
    "current_device", "set_device", "get_device_properties", "get_device_name", "_snapshot", "_record_memory_history",
)
_STATE_BYTES = 16


def active_modes() -> list[str]:
    """The fake, dispatch and torch-function modes active now (empty outside every dry run)."""
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    modes = [type(mode).__name__ for mode in _get_current_dispatch_mode_stack()]
    fake = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)
    if fake is not None and type(fake).__name__ not in modes:
        modes.append(type(fake).__name__)
    return modes + [type(mode).__name__ for mode in _get_current_function_mode_stack()]


class CudaRecorder:
    """Stand-ins for torch.cuda's device functions: each call is recorded, a call under a mode is a violation."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.violations: list[str] = []
        self.rng = [torch.arange(_STATE_BYTES, dtype=torch.uint8), torch.arange(_STATE_BYTES, dtype=torch.uint8) + 1]

    def stand_in(self, name: str) -> Callable[..., Any]:
        def called(*args: Any, **kwargs: Any) -> Any:
            modes = active_modes()
            self.calls.append(name)
            if modes:
                where = "".join(traceback.format_stack(limit=8)[:-1])
                self.violations.append(f"torch.cuda.{name} called under {modes}:\n{where}")
            return self.answer(name, args)

        return called

    def answer(self, name: str, args: tuple[Any, ...]) -> Any:
        with torch._C.DisableTorchFunction(), _no_dispatch():
            if name == "get_rng_state_all":
                return [state.clone() for state in self.rng]
            if name == "get_rng_state":
                return self.rng[0].clone()
            if name == "set_rng_state_all":
                self.rng = [torch.as_tensor(state).clone() for state in args[0]]
            elif name == "set_rng_state":
                self.rng[0] = torch.as_tensor(args[0]).clone()
        if name == "mem_get_info":
            return (0, 0)
        if name == "get_device_properties":
            return SimpleNamespace(major=9, minor=0, name="stand-in", total_memory=0)
        if name in ("memory_stats", "_snapshot"):
            return {}
        if name in ("current_device", "initial_seed") or name.startswith(("max_", "memory_")):
            return 0
        return None


@contextlib.contextmanager
def _no_dispatch() -> Iterator[None]:
    from torch.utils._mode_utils import no_dispatch

    with no_dispatch():
        yield


@contextlib.contextmanager
def cuda_watched(available: bool = False) -> Iterator[CudaRecorder]:
    """CUDA made to look initialised (and with ``available``, present), its device functions recorded (outside
    every mode they answer as a GPU with nothing allocated would)."""
    recorder = CudaRecorder()
    # torch 2.11's fake mode makes one real tensor on a device the first time it fakes one there, where
    # torch.cuda.is_available() (2.13 asks torch.accelerator): its cached init_gpu_context is run here, before CUDA is
    # made to look available on a machine without it, as the first fake CUDA tensor of the process would have; else
    # a test that fakes the first CUDA tensor of its worker fails on a CUDA build without a driver (the floor stack)
    init_gpu_context = getattr(torch._subclasses.fake_tensor, "init_gpu_context", None)
    if init_gpu_context is not None:
        init_gpu_context(torch.device("cuda", 0))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.cuda, "is_initialized", lambda: True)
        if available:
            patch.setattr(torch.cuda, "is_available", lambda: True)
        for module in (torch.cuda, torch.cuda.memory, torch.cuda.random):
            for name in RECORDED:
                if hasattr(module, name):
                    patch.setattr(module, name, recorder.stand_in(name))
        yield recorder


def check_route(run: Callable[[], Any], model: torch.nn.Module) -> tuple[Any, CudaRecorder]:
    """Run a route with CUDA watched: no call under a mode, the live model, its grads, the CPU RNG and the device's
    RNG as they were."""
    before = fingerprint(model)
    cpu_rng = torch.random.get_rng_state()
    with cuda_watched() as recorder:
        device_rng = [state.clone() for state in recorder.rng]
        result = run()
    assert not recorder.violations, "\n".join(recorder.violations[:3])
    assert_same(before, fingerprint(model))
    assert torch.equal(torch.random.get_rng_state(), cpu_rng), "the CPU RNG changed"
    assert all(torch.equal(a, b) for a, b in zip(recorder.rng, device_rng, strict=True)), "the CUDA RNG changed"
    return result, recorder


def with_grads(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.nn.Module:
    """The user's model after a backward: its gradients are there, and must stay."""
    model(**batch).loss.backward()
    return model


@pytest.fixture(scope="module")
def llama() -> torch.nn.Module:
    return with_grads(tiny_llama(), lm_batch(rows=2))


@pytest.fixture(scope="module")
def peft_llama() -> torch.nn.Module:
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(tiny_llama(), peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    return with_grads(model, lm_batch(rows=2))


def test_the_recorder_sees_a_call_under_a_fake_mode() -> None:
    """The check itself: a CUDA call under FakeMode, or under an emulating torch-function mode, is a violation; one
    outside every mode is not."""
    from memlab.estimation.cuda.kernels import cuda_kernels

    with cuda_watched() as recorder:
        torch.cuda.empty_cache()
        assert not recorder.violations
        with FakeMode():
            torch.cuda.get_rng_state_all()
        with cuda_kernels(GPUS["A100-80GB"]):
            torch.cuda.synchronize()
    assert recorder.calls == ["empty_cache", "get_rng_state_all", "synchronize"]
    assert len(recorder.violations) == 2 and "FakeMode" in recorder.violations[0]


def test_checkpointing_keeps_no_cuda_rng_of_fake_tensors() -> None:
    """Where the machine has CUDA, a dry run's fake tensors are on ``cuda``, and torch.utils.checkpoint stashes the
    RNG of their device (``get_device_states``: torch.cuda.get_rng_state) to set it again in the recomputation: a
    real CUDA call under the fake mode for every checkpointed block. The dry run's guard keeps none for fake inputs
    (a CPU-only torch cannot run a fake CUDA step: the stash is checked alone)."""
    from memlab.estimation.dryrun.single_gpu import fake_checkpoints

    unguarded = torch.utils.checkpoint.get_device_states
    with cuda_watched() as recorder, pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
        with FakeMode():
            fake = torch.empty(2, 4, device="cuda:0")
            recorder.calls.clear()
            assert torch.utils.checkpoint.get_device_states(fake)[0] == [0]  # what torch does unguarded
            assert recorder.calls == ["get_rng_state"] and len(recorder.violations) == 1
            with fake_checkpoints():
                assert torch.utils.checkpoint.get_device_states(fake, torch.ones(2)) == ([], [])
    assert recorder.calls == ["get_rng_state"] and len(recorder.violations) == 1
    assert torch.utils.checkpoint.get_device_states is unguarded  # put back after the dry run


def test_techniques_on_fake_cuda_weights_ask_no_device() -> None:
    """Where the machine has CUDA, a dry run's bf16 plan asked the real GPU whether it has bf16
    (get_device_properties) and the optimizer offload synchronised it, both under the fake mode."""
    from memlab.techniques.offload import OffloadedOptimizer
    from memlab.techniques.precision import check_precision

    with cuda_watched(available=True) as recorder, FakeMode():
        weight = torch.nn.Parameter(torch.empty(4, 4, device="cuda:0"))
        recorder.calls.clear()
        assert check_precision(Plan(precision="bf16"), torch.device("cuda", 0), [weight]) == []
        offloaded = OffloadedOptimizer([weight], _Stepped)
        weight.grad = torch.empty(4, 4, device="cuda:0")
        try:
            offloaded.step()
        except RuntimeError as error:
            # Its last line, the copy back to the weight, is torch's to fake: 2.11's and 2.14's CUDA builds do,
            # 2.13's CPU build fails it (no CUDA linked), in words of its own. Any other line failing is memlab's.
            assert _raised_at(error, OffloadedOptimizer.step, "device_param.copy_(cpu_param"), error
        assert offloaded.inner.steps == 1, "the CPU step did not run"
    assert not recorder.violations, "\n".join(recorder.violations)
    assert "synchronize" not in recorder.calls


class _Stepped(torch.optim.Optimizer):
    """Plain SGD that counts its steps, with no device check of its own: torch's AdamW asks CUDA whether it is
    capturing a graph wherever CUDA looks available, as this test makes it look (torch 2.11's CUDA build then fails
    for want of a driver, inside torch)."""

    def __init__(self, parameters: Any) -> None:
        super().__init__(parameters, {"lr": 0.1})
        self.steps = 0

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        self.steps += 1
        for group in self.param_groups:
            for parameter in group["params"]:
                if parameter.grad is not None:
                    parameter.add_(parameter.grad, alpha=-group["lr"])


def _raised_at(error: BaseException, function: Callable[..., Any], line: str) -> bool:
    """Whether ``error`` left ``function`` (memlab's own code) from its line that starts with ``line``."""
    code = inspect.unwrap(function).__code__
    frames = [frame for frame in traceback.extract_tb(error.__traceback__)
              if frame.filename == code.co_filename and frame.name == code.co_name]
    return bool(frames) and (frames[-1].line or "").startswith(line)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("plan", [Plan(), Plan(adapter="lora", lora_rank=4), Plan(checkpointing=True, weights="bf16"),
                                  Plan(compile=True)], ids=["plain", "lora", "ckpt-bf16", "compiled"])
@pytest.mark.slow
def test_estimate_of_a_live_model(llama: torch.nn.Module, plan: Plan, device: str) -> None:
    trial, _ = check_route(lambda: memlab.estimate(llama, lm_batch(rows=2), plan, device=device), llama)
    assert trial.status == "ok", trial.error


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_estimate_of_a_peft_model(peft_llama: torch.nn.Module, device: str) -> None:
    trial, _ = check_route(lambda: memlab.estimate(peft_llama, lm_batch(rows=2), Plan(), device=device), peft_llama)
    assert trial.status == "ok", trial.error


@pytest.mark.parametrize("space", [{"checkpointing": [False, True]}, {"adapter": ["none", "lora"]}],
                         ids=["plain", "adapters"])
def test_fit_of_a_live_model(llama: torch.nn.Module, space: dict[str, list[Any]]) -> None:
    """fit measures live trials (its session saves the CUDA RNG, outside every mode) and estimates others."""
    report, recorder = check_route(
        lambda: memlab.fit(llama, lm_batch(rows=2), budget="1GiB", space=space, max_trials=2, **FAST), llama)
    assert report.best is not None
    assert "get_rng_state_all" in recorder.calls  # the CUDA branch ran, outside the modes


def test_fit_dry_run(peft_llama: torch.nn.Module) -> None:
    report, _ = check_route(lambda: memlab.fit(peft_llama, lm_batch(rows=2), budget="1GiB", dry_run=True,
                                               space={"checkpointing": [False, True]}, max_trials=2, **FAST),
                            peft_llama)
    assert report.best is not None


def test_limits_dry_run(llama: torch.nn.Module) -> None:
    answer, _ = check_route(lambda: memlab.limits(llama, Plan(), budget="256MiB", batch=lm_batch(rows=1, length=16),
                                                  multiple=16, dry_run=True, device="cuda"), llama)
    assert answer.value is not None


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_inference_estimate(llama: torch.nn.Module, device: str) -> None:
    trial, _ = check_route(lambda: memlab.estimate(llama, {"input_ids": (2, 16)}, memlab.InferencePlan(),
                                                   device=device), llama)
    assert trial.status == "ok", trial.error


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("plan", [Plan(), Plan(adapter="lora", lora_rank=4)], ids=["plain", "lora"])
def test_sharded_estimate(llama: torch.nn.Module, plan: Plan, device: str) -> None:
    """FSDP2's dry run, and adapters sharded (composed from the one-GPU dry run)."""
    trial, _ = check_route(lambda: memlab.estimate(llama, lm_batch(rows=2), plan, device=device, gpus=2,
                                                   strategy="fsdp2"), llama)
    assert trial.status == "ok", trial.error


@pytest.fixture(scope="module")
def trainer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from trainers import make_trainer

    return make_trainer(tmp_path_factory.mktemp("trainer"), steps=2)


@pytest.fixture(scope="module")
def sft_trainer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """TRL's SFTTrainer with a peft LoRA config: the route that broke the H200's CUDA context."""
    pytest.importorskip("peft")
    pytest.importorskip("trl")
    from peft import LoraConfig
    from test_trainer_setups import sft

    return sft(tmp_path_factory.mktemp("sft"), peft_config=LoraConfig(r=4, lora_alpha=8,
                                                                        target_modules=["q_proj", "v_proj"]))


@pytest.mark.parametrize("which", ["trainer", "sft_trainer"])
def test_trainer_routes(which: str, request: pytest.FixtureRequest) -> None:
    trainer = request.getfixturevalue(which)
    estimated, _ = check_route(lambda: memlab.estimate(trainer, Plan(), device="cuda"), trainer.model)
    assert estimated.status == "ok", estimated.error
    report, _ = check_route(lambda: memlab.fit(trainer, budget="1GiB", max_trials=2, **FAST), trainer.model)
    assert report.best is not None


@pytest.mark.slow
def test_vlm(tmp_path: Path) -> None:
    from vlms import FAMILIES

    family = FAMILIES["llava"]()
    model, _ = family.build()
    batch = family.batch(2)
    for device in ("cpu", "cuda"):
        trial, _ = check_route(lambda device=device: memlab.estimate(model, batch, Plan(), device=device), model)
        assert trial.status == "ok", trial.error
    report, _ = check_route(lambda: memlab.fit(model, batch, budget="1GiB", space={"adapter": ["none", "lora"]},
                                               max_trials=2, **FAST), model)
    assert report.best is not None


# --- nothing real made on the GPU: a dry run for a GPU on a machine that has one -----------------------------------
# Where the machine has CUDA, a dry run's fake model and batch are on "cuda". This CPU-only PyTorch cannot make a
# real CUDA tensor: with CUDA made to look available and initialised, any real allocation or copy on it fails
# ("Could not run 'aten::empty_strided' with arguments from the 'CUDA' backend"), so each check below fails where a
# dry run would have made a real tensor on the user's GPU. (A whole fake CUDA step cannot run on a CPU-only PyTorch:
# the parts that made real CUDA tensors are run alone.)
CUDA0 = torch.device("cuda", 0)


def _lora_layout(model: torch.nn.Module) -> dict[str, tuple[Any, ...]]:
    return {name: (tuple(p.shape), p.dtype, p.requires_grad, p.device.type) for name, p in model.named_parameters()
            if "lora_" in name}


@pytest.mark.parametrize("fields", [{"adapter": "lora"}, {"adapter": "qlora"},
                                    {"adapter": "qlora", "precision": "bf16"},
                                    {"adapter": "lora", "precision": "bf16", "weights": "bf16"}])
def test_adapters_of_a_fake_cuda_model_are_made_fake_there(fields: dict[str, str]) -> None:
    """peft made each adapter real and moved it to its base layer's device: on a GPU machine a real allocation and
    copy per adapter. They are fake tensors on that device, laid out as on the CPU. QLoRA's bf16 adapters, held in
    fp32 after the move, stayed on the meta device that stood for the move (the H200 of 2026-11-27: a 4-bit load's
    estimate made on the GPU machine stopped at "found two different devices cuda:0, meta")."""
    from torch._subclasses.fake_tensor import FakeTensor

    from memlab.estimation.dryrun.adapters import attach_fake_adapter
    from memlab.estimation.dryrun.fake import fake_copy

    plan = Plan(lora_rank=4, **fields)
    layouts = {}
    for device in (torch.device("cpu"), CUDA0):
        mode = FakeMode()
        live = tiny_llama()
        with cuda_watched(available=True) as recorder:
            model = fake_copy(live, mode, device)
            undo = attach_fake_adapter(model, plan, mode, device)
            assert all(isinstance(p, FakeTensor) and p.device == device for p in model.parameters())
            layouts[device.type] = _lora_layout(model)
            undo()
        assert not recorder.violations and not _lora_layout(model)
    assert layouts["cpu"] and {name: (*layout[:3], "cuda") for name, layout in layouts["cpu"].items()} == \
        layouts["cuda"]


@pytest.fixture(scope="module")
def image_batch() -> dict[str, torch.Tensor]:
    from vlms import FAMILIES

    return FAMILIES["llava"]().batch(2)


def test_an_image_batch_keeps_its_values_on_the_cpu(image_batch: dict[str, torch.Tensor]) -> None:
    """An image batch's values were copied to the GPU (a real copy of every tensor): they stay on the CPU, the fake
    tensors on the GPU."""
    from memlab.estimation.dryrun.fake import fake_batch

    with cuda_watched(available=True):
        batch = fake_batch(image_batch, FakeMode(), CUDA0)
    for key, value in image_batch.items():
        assert batch[key].device == CUDA0 and batch[key].constant.device.type == "cpu"
        assert torch.equal(batch[key].constant, value)


def test_values_are_computed_on_the_cpu_for_a_fake_gpu(image_batch: dict[str, torch.Tensor]) -> None:
    """What a VLM computes from an image batch's values alone (its image tokens' mask, count, positions and
    indices, made as llava merges its image features) is computed on the CPU: each result a fake tensor on the
    GPU with the values a real step has; integer factories of the step (positions) too; and a real CPU tensor moved
    to the GPU, or torch.tensor made there, inside the dry run is faked, never made real."""
    from memlab.estimation.dryrun.fake import fake_batch

    ids = image_batch["input_ids"]
    token = int(ids.max())
    mode = FakeMode()
    with cuda_watched(available=True), pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.cuda, "current_device", lambda: 0)
        batch = fake_batch(image_batch, mode, CUDA0)
        with mode:
            fake_ids = batch["input_ids"]
            # aten's operators called directly: Tensor methods on a CUDA tensor take a device guard, which a
            # CPU-only PyTorch does not have
            aten = torch.ops.aten
            mask = aten.eq.Scalar(fake_ids, token)
            count = aten.sum.default(mask).item()
            where = aten.nonzero.default(mask)
            positions = torch.arange(fake_ids.shape[1], device=fake_ids.device)
            first = aten.select.int(fake_ids, 0, 0)  # a view: its values and its storage its base's
            picked = aten.index.Tensor(aten.expand.default(aten.unsqueeze.default(positions, 0), list(ids.shape)),
                                       [mask])
            back = aten._to_copy.default(mask, device=torch.device("cpu"))
            moved = aten._to_copy.default(torch.ones(3, dtype=torch.int64), device=CUDA0)
            made = torch.tensor([1, 2], device=CUDA0)
    assert count == int((ids == token).sum()) > 0
    for fake, real in ((mask, ids == token), (where, (ids == token).nonzero()), (positions, torch.arange(ids.shape[1])),
                       (first, ids[0]), (picked, torch.arange(ids.shape[1]).expand_as(ids)[ids == token])):
        assert fake.device == CUDA0 and fake.constant.device.type == "cpu"
        assert torch.equal(fake.constant, real)
    assert first.untyped_storage()._cdata == fake_ids.untyped_storage()._cdata
    assert back.device.type == "cpu" and torch.equal(back.constant, ids == token)
    assert moved.device == CUDA0 and made.device == CUDA0


def test_rows_of_a_fake_gpu_batch_are_taken_without_the_gpu() -> None:
    """Cutting micro-batches moved the row indices (a real CPU tensor) to the fake batch's device for real."""
    from memlab.estimation.dryrun.fake import fake_batch
    from memlab.live.batch import take_rows

    with cuda_watched(available=True):
        batch = fake_batch(lm_batch(rows=4), FakeMode(), CUDA0)
        rows = take_rows(batch, torch.tensor([2, 0]))
    assert all(tensor.device == CUDA0 and tensor.shape[0] == 2 for tensor in rows.values())
