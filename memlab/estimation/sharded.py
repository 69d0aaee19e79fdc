"""Per-GPU estimates of a training step sharded over several GPUs: FSDP2, DeepSpeed ZeRO-2 and ZeRO-3.

memlab never shards anything itself: the engines do (accelerate with FSDP2, DeepSpeed). This module answers, before
the machines are booked, how much each GPU will hold, and :func:`smallest_gpus` how many GPUs each strategy needs.
``batch`` is always what ONE GPU sees per micro-step (the per-GPU micro-batch); data parallelism multiplies it.

**FSDP2** runs for real, on fake tensors: the model is built on the ``meta`` device, sharded with
``torch.distributed.fsdp.fully_shard`` over a device mesh of a *fake* process group (``backend="fake"``, from
``torch.testing._internal.distributed.fake_pg``: collectives that move nothing, one process standing for rank 0 of
``gpus``), then materialised on fake tensors (``to_empty`` under ``FakeTensorMode``). The wrapping is accelerate's
``TRANSFORMER_BASED_WRAP`` (one FSDP unit per class in the model's ``_no_split_modules``, else per repeated block,
then the root), with ``reshard_after_forward=True`` and, for ``precision="bf16"/"fp16"``, accelerate's FSDP2
``MixedPrecisionPolicy`` (parameters, reductions and outputs in that dtype) plus autocast. One steady-state step
(the optimizer state already there) is tracked by PyTorch's own
``torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker``, which tells sharded from unsharded parameters and
gradients, the all-gather and reduce-scatter buffers, optimizer state and activations. What it cannot see is what
any fake-tensor estimate cannot (see :mod:`memlab.estimate`), plus NCCL's own buffers. Where the plan offloads the
optimizer, FSDP2's ``CPUOffloadPolicy`` keeps the sharded parameters, gradients and optimizer state in CPU memory:
the per-GPU peak is then the largest module-level snapshot without them (they are reported in ``host_bytes``).

**ZeRO-2 / ZeRO-3** cannot run without DeepSpeed's engine, so they are computed. The activations (and the batch)
come from the FSDP2 dry run of the same plan and per-GPU batch (its largest activations, over every module-level
snapshot: data parallelism does not change them); the model
states follow DeepSpeed's own formulas (``deepspeed/runtime/zero/stage_1_and_2.py``:
``estimate_zero2_model_states_mem_needs`` and ``stage3.py``: ``estimate_zero3_model_states_mem_needs``, DeepSpeed
0.19), written per dtype so that they hold for any plan. With ``w`` bytes per 16-bit (or fp32) weight, ``K`` bytes
of optimizer state per trainable parameter (8 for AdamW; from the dry run for the others), ``P`` parameters,
``L`` the largest layer's own parameters and ``N`` GPUs:

- ZeRO-2: ``w*P`` (the weights, whole) + ``(w + 4 + 4 + K) * P / N`` (partitions of the 16-bit gradients, their
  fp32 copy, the fp32 master weights and the optimizer state). DeepSpeed's formula, for bf16/fp16 and AdamW:
  ``2*P + 18*P/N``. With the optimizer offloaded (ZeRO-Offload): ``w*P`` on the GPU (DeepSpeed: ``2*P``).
- ZeRO-3: ``2*w*L`` (one layer's gathered weights and gradients) + ``(w + 4 + 4 + K) * P / N`` (partitions of the
  16-bit weights, the fp32 gradients, the fp32 master weights and the optimizer state); DeepSpeed:
  ``4*L + 18*P/N``. Optimizer offloaded: ``2*w*L + w*P/N``; parameters too (``offload="all"``): ``2*w*L``.
- Communication buffers, which DeepSpeed's formulas leave out: the gradient reduce bucket
  (``reduce_bucket_size``, 5e8 elements by default) and, for ZeRO-2, the parameter all-gather bucket
  (``allgather_bucket_size``, 5e8) or, for ZeRO-3, the prefetch bucket (``stage3_prefetch_bucket_size``, 5e7),
  each at most the model's size, in the weights' dtype.

The per-GPU peak is the model states + buffers + the largest activations and the batch: it leans high, as it adds
the largest of each. The ``host_bytes`` of offload are each rank's share of what DeepSpeed keeps in CPU
memory (without its pinned-buffer factor).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from memlab.errors import MemlabError
from memlab.measure.tracker import CATEGORIES
from memlab.plan import Plan, parse_budget
from memlab.report import Trial
from memlab.runner.batch import LossFn, count_rows, map_tensors, resolve_loss_fn

__all__ = [
    "DETAIL",
    "STRATEGIES",
    "ShardedTrial",
    "check_sharding",
    "layer_counts",
    "parse_gpus",
    "shard_units",
    "sharded_estimate",
    "sharded_lines",
    "sharded_trials",
    "smallest_gpus",
    "zero_model_states",
]

STRATEGIES = ("none", "fsdp2", "zero2", "zero3")
"""How training is spread over GPUs: ``"none"`` (one GPU), FSDP2, DeepSpeed ZeRO stage 2 or 3."""

DETAIL = (
    "sharded_params",
    "unsharded_params",
    "sharded_grads",
    "unsharded_grads",
    "optimizer",
    "activations",
    "communication",
    "inputs",
)
"""The finer categories of a sharded estimate (:attr:`ShardedTrial.detail`), in bytes per GPU at the peak."""

# Which detail adds up into which of memlab's five categories.
_DETAIL_TO_CATEGORY = {
    "sharded_params": "params",
    "unsharded_params": "params",
    "sharded_grads": "grads",
    "unsharded_grads": "grads",
    "optimizer": "optimizer",
    "activations": "activations",
    "communication": "other",
    "inputs": "other",
}

# FSDPMemTracker's reference types (their values) -> detail.
_FSDP_KINDS = {
    "Sharded Param": "sharded_params",
    "Unsharded Param": "unsharded_params",
    "Buffer": "unsharded_params",
    "Sharded Grad": "sharded_grads",
    "Unsharded Grad": "unsharded_grads",
    "Activation": "activations",
    "Temp": "activations",
    "All Gather": "communication",
    "Reduce Scatter": "communication",
    "OptState": "optimizer",
    "Inputs": "inputs",
}
_HOST_WITH_OFFLOAD = ("sharded_params", "sharded_grads", "optimizer")

# DeepSpeed's defaults (deepspeed/runtime/zero/config.py), in elements.
DS_REDUCE_BUCKET = 500_000_000
DS_ALLGATHER_BUCKET = 500_000_000
DS_PREFETCH_BUCKET = 50_000_000

_FSDP_NOTE = "FSDP2 estimated with fully_shard on fake tensors and a fake process group (FSDPMemTracker)"


@dataclass
class ShardedTrial(Trial):
    """A :class:`~memlab.report.Trial` for one GPU of ``gpus`` training with ``strategy``.

    ``peak_bytes`` and ``breakdown`` are per GPU (the five categories of every Trial: ``"other"`` holds the
    communication buffers and the batch); ``detail`` splits the peak finer (:data:`DETAIL`: sharded and unsharded
    parameters and gradients, optimizer state, activations, communication buffers, inputs); ``model_state_bytes`` is
    what each GPU holds between steps for the weights, gradients and optimizer state; ``host_bytes`` is each rank's
    CPU memory for offloaded state.

    Example:
        >>> t = ShardedTrial(Plan(), "ok", 10, {"params": 10}, None, None, None, "cuda", gpus=8, strategy="zero3")
        >>> t.gpus, t.strategy, t.breakdown["other"]
        (8, 'zero3', 0)
    """

    gpus: int = 1
    strategy: str = "none"
    detail: dict[str, int] = field(default_factory=dict)
    model_state_bytes: int = 0
    host_bytes: int = 0

    @property
    def label(self) -> str:
        """The plan's label, then the strategy and the number of GPUs (``"ckpt bf16 fsdp2 x8"``), so that the
        trials of several strategies tell apart in one Report (its table and figure).

        Example:
            >>> ShardedTrial(Plan(checkpointing=True), "ok", 1, {}, None, None, None, "cuda", gpus=8,
            ...              strategy="fsdp2").label
            'ckpt fsdp2 x8'
            >>> ShardedTrial(Plan(), "ok", 1, {}, None, None, None, "cuda").label
            'plain'
        """
        label = super().label
        if self.strategy == "none":
            return label
        where = f"{self.strategy} x{self.gpus}"
        return where if label == "plain" else f"{label} {where}"


def check_sharding(gpus: Any, strategy: Any) -> tuple[int, str]:
    """``(gpus, strategy)`` checked: a MemlabError saying what to write when they do not go together.

    Example:
        >>> check_sharding(8, "FSDP2")
        (8, 'fsdp2')
        >>> check_sharding(8, "none")
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: gpus=8 needs a strategy; write strategy="fsdp2", "zero2" or "zero3"
    """
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise MemlabError(f"gpus={gpus!r} is not a number of GPUs; write an int >= 1, such as gpus=8")
    name = str(strategy).lower() if isinstance(strategy, str) else strategy
    if name not in STRATEGIES:
        raise MemlabError(f"strategy={strategy!r} is unknown; write one of {', '.join(map(repr, STRATEGIES))}")
    if gpus > 1 and name == "none":
        raise MemlabError(f'gpus={gpus} needs a strategy; write strategy="fsdp2", "zero2" or "zero3"')
    return gpus, name


def sharded_estimate(
    model_or_config: Any,
    batch: Any,
    plan: Plan | None = None,
    *,
    gpus: int,
    strategy: str,
    loss_fn: LossFn | None = None,
    budget: int | str | None = None,
    lr: float = 1e-5,
    device: str | torch.device | None = None,
) -> ShardedTrial:
    """The peak of one steady-state training step per GPU, sharded over ``gpus`` GPUs with ``strategy``.

    :func:`memlab.estimate` with ``gpus=``/``strategy=`` calls this; the arguments are its own, and ``batch`` is
    the per-GPU micro-batch. ``strategy="fsdp2"`` runs ``fully_shard`` on fake tensors; ``"zero2"``/``"zero3"``
    compute DeepSpeed's partitioning (the module docstring gives the formulas). Adapter plans and the chunked loss
    are not estimated sharded (a MemlabError says so).

    Example:
        >>> from transformers import LlamaConfig
        >>> config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        ...                      num_attention_heads=2, vocab_size=256)
        >>> batch = {"input_ids": (1, 32), "labels": (1, 32)}
        >>> one = sharded_estimate(config, batch, gpus=2, strategy="fsdp2", device="cpu")
        >>> four = sharded_estimate(config, batch, gpus=4, strategy="fsdp2", device="cpu")
        >>> one.status, four.model_state_bytes < one.model_state_bytes, sum(one.breakdown.values()) == one.peak_bytes
        ('ok', True, True)
    """
    gpus, strategy = check_sharding(gpus, strategy)
    plan = Plan() if plan is None else plan
    _check_plan(plan)
    limit = parse_budget(budget)
    if strategy == "fsdp2":
        return _fsdp2_run(model_or_config, batch, plan, gpus, loss_fn, lr, device, limit)[0]
    if strategy in ("zero2", "zero3"):
        single = _one_gpu(model_or_config, batch, plan, loss_fn, lr, device)
        counts = layer_counts(model_or_config)
        return _zero(single, counts, plan, gpus, int(strategy[-1]), limit)
    from memlab.estimation.estimate import estimate

    trial = estimate(model_or_config, batch, plan, loss_fn=loss_fn, budget=budget, lr=lr, device=device)
    return ShardedTrial(**{f.name: getattr(trial, f.name) for f in dataclasses.fields(Trial)})


def smallest_gpus(
    model_or_config: Any,
    batch: Any,
    plan: Plan | None = None,
    *,
    budget: int | str,
    strategies: Sequence[str] = ("fsdp2", "zero2", "zero3"),
    candidates: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
    loss_fn: LossFn | None = None,
    lr: float = 1e-5,
    device: str | torch.device | None = None,
) -> dict[str, ShardedTrial | None]:
    """For each strategy, the estimate at the smallest number of GPUs in ``candidates`` whose per-GPU peak fits
    ``budget`` (None when none does: ZeRO-2 keeps whole weights on every GPU, so it may never fit).

    The per-GPU peak falls as GPUs are added, so the candidates are bisected: FSDP2 runs a dry run per probe
    (about log2 of the number of candidates), ZeRO one dry run in all (its model states are a formula of N).

    Example:
        >>> from transformers import LlamaConfig
        >>> config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        ...                      num_attention_heads=2, vocab_size=256)
        >>> found = smallest_gpus(config, {"input_ids": (1, 16), "labels": (1, 16)}, budget="3MiB",
        ...                       strategies=["zero3"], device="cpu")
        >>> found["zero3"].gpus, found["zero3"].fits
        (2, True)
    """
    plan = Plan() if plan is None else plan
    _check_plan(plan)
    limit = parse_budget(budget)
    if limit is None:
        raise MemlabError("smallest_gpus needs a budget; write for example budget='80GiB'")
    numbers = sorted({check_sharding(int(n), "fsdp2")[0] for n in candidates})
    if not numbers:
        raise MemlabError("candidates is empty; write numbers of GPUs such as candidates=(1, 2, 4, 8)")
    names = [check_sharding(2, s)[1] for s in strategies]
    if "none" in names:
        raise MemlabError('strategies lists "none"; write "fsdp2", "zero2" or "zero3"')
    found: dict[str, ShardedTrial | None] = {}
    single: Trial | None = None
    counts: tuple[int, int] | None = None
    for name in names:
        if name != "fsdp2" and single is None:
            single = _one_gpu(model_or_config, batch, plan, loss_fn, lr, device)
            counts = layer_counts(model_or_config)

        def run(n: int, name: str = name, one: Trial | None = single, sizes: Any = counts) -> ShardedTrial:
            if name == "fsdp2":
                return _fsdp2_run(model_or_config, batch, plan, n, loss_fn, lr, device, limit)[0]
            assert one is not None and sizes is not None
            return _zero(one, sizes, plan, n, int(name[-1]), limit)

        found[name] = _bisect(run, numbers)
    return found


def parse_gpus(value: Any) -> int | str:
    """A number of GPUs as a front end reads it: an int >= 1, or ``"auto"`` (the smallest number that fits a budget,
    which ``auto`` needs).

    Example:
        >>> parse_gpus("8"), parse_gpus(" AUTO "), parse_gpus(2)
        (8, 'auto', 2)
        >>> parse_gpus("eight")
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: gpus='eight' is not a number of GPUs; write an int >= 1 such as 8, or auto
    """
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        number = int(value) if not isinstance(value, bool) else 0
    except (TypeError, ValueError):
        number = 0
    if number < 1 or (isinstance(value, float) and value != number):
        raise MemlabError(f"gpus={value!r} is not a number of GPUs; write an int >= 1 such as 8, or auto")
    return number


def sharded_trials(
    model_or_config: Any,
    batch: Any,
    plans: Sequence[Plan],
    *,
    gpus: int | str,
    strategies: Sequence[str] | None = None,
    budget: int | str | None = None,
    loss_fn: LossFn | None = None,
    lr: float = 1e-5,
    device: str | torch.device | None = None,
) -> list[tuple[Plan, str, ShardedTrial | None]]:
    """Per-GPU estimates of every plan under every strategy: ``(plan, strategy, trial)``, plans outer.

    What ``memlab estimate --gpus`` and ``%%memfit --dry-run --gpus`` run. ``gpus`` is a number, or ``"auto"``
    (needs ``budget``): then each trial is the one at the smallest number that fits (:func:`smallest_gpus`), and
    None where no number up to 1024 does. ``strategies`` defaults to all three (``"fsdp2"``, ``"zero2"``,
    ``"zero3"``); ZeRO-2 and ZeRO-3 share one dry run per plan, which is FSDP2's own where the plan trains with
    AdamW without offload (so all three cost one dry run).

    Example:
        >>> from transformers import LlamaConfig
        >>> config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        ...                      num_attention_heads=2, vocab_size=256)
        >>> rows = sharded_trials(config, {"input_ids": (1, 16), "labels": (1, 16)}, [Plan()], gpus=2,
        ...                       strategies=["zero2", "zero3"], device="cpu")
        >>> [(name, trial.label) for _, name, trial in rows]
        [('zero2', 'zero2 x2'), ('zero3', 'zero3 x2')]
    """
    gpus = parse_gpus(gpus)
    names = [check_sharding(2, s)[1] for s in (strategies or ("fsdp2", "zero2", "zero3"))]
    if not names or "none" in names:
        raise MemlabError('strategies must name "fsdp2", "zero2" or "zero3"; write for example strategies=["fsdp2"]')
    limit = parse_budget(budget)
    plans = list(plans)
    for plan in plans:
        _check_plan(plan)
    rows: list[tuple[Plan, str, ShardedTrial | None]] = []
    if gpus == "auto":
        if limit is None:
            raise MemlabError("gpus='auto' needs a budget; write for example a budget of 80GiB")
        for plan in plans:
            found = smallest_gpus(model_or_config, batch, plan, budget=limit, strategies=names, loss_fn=loss_fn,
                                  lr=lr, device=device)
            rows += [(plan, name, trial) for name, trial in found.items()]
        return rows
    assert isinstance(gpus, int)
    counts = layer_counts(model_or_config) if any(name != "fsdp2" for name in names) else (0, 0)
    for plan in plans:
        single: Trial | None = None
        run: tuple[ShardedTrial, list[dict[str, int]]] | None = None
        for name in names:
            if name == "fsdp2":
                trial, peaks = _fsdp2_run(model_or_config, batch, plan, gpus, loss_fn, lr, device, limit)
                if plan.optimizer == "adamw" and plan.offload == "none" and trial.status == "ok":
                    run = (dataclasses.replace(trial, budget=None), peaks)  # ZeRO's dry run too: same plan
            else:
                if single is None:
                    single = _one_gpu(model_or_config, batch, plan, loss_fn, lr, device, run)
                trial = _zero(single, counts, plan, gpus, int(name[-1]), limit)
            rows.append((plan, name, trial))
    return rows


def sharded_lines(trials: Sequence[tuple[Plan, str, ShardedTrial | None]], budget: int | None) -> list[str]:
    """One line per ``(plan, strategy, trial or None)`` of :func:`sharded_trials`: GPUs, the peak per GPU, where it
    goes, whether it fits ``budget`` (bytes).

    Example:
        >>> sharded_lines([(Plan(), "zero2", None)], 2**30)
        ['plain        zero2  no number of GPUs up to 1024 fits 1.00 GiB']
    """
    from memlab.plan import format_bytes

    lines = []
    for plan, name, trial in trials:
        if trial is None:
            lines.append(f"{plan.label():12s} {name:6s} no number of GPUs up to 1024 fits {format_bytes(budget)}")
            continue
        if trial.status != "ok":
            lines.append(f"{plan.label():12s} {name:6s} x{trial.gpus}: error {trial.error}")
            continue
        parts = ", ".join(f"{key} {format_bytes(value)}" for key, value in trial.detail.items() if value)
        verdict = "" if budget is None else ("  fits" if trial.fits else "  does not fit")
        lines.append(f"{plan.label():12s} {name:6s} x{trial.gpus}: {format_bytes(trial.peak_bytes)} per GPU "
                     f"({parts}){verdict}")
    return lines


def _bisect(run: Any, numbers: list[int]) -> ShardedTrial | None:
    low, high = 0, len(numbers) - 1
    best: ShardedTrial | None = None
    while low <= high:
        middle = (low + high) // 2
        trial = run(numbers[middle])
        if trial.status == "ok" and trial.fits:
            best, high = trial, middle - 1
        else:
            low = middle + 1
    return best


# --- what cannot be estimated sharded -------------------------------------------------------------------------------


def _check_plan(plan: Plan) -> None:
    if not isinstance(plan, Plan):
        raise MemlabError(f"plan is a {type(plan).__name__}; pass a memlab.Plan")
    if plan.adapter != "none":
        raise MemlabError(
            f"adapter={plan.adapter!r} is not estimated sharded; estimate it on one GPU (gpus=1), where adapters "
            "usually fit, or shard the full model (adapter='none')"
        )
    if plan.loss != "full":
        raise MemlabError("loss='chunked' is not estimated sharded; write loss='full' (the estimate then leans high)")


# --- FSDP2 -----------------------------------------------------------------------------------------------------------


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The modules that become FSDP units before the root, as accelerate's ``TRANSFORMER_BASED_WRAP`` picks them:
    every module whose class is in the model's ``_no_split_modules`` (Hugging Face models), else the repeated
    blocks memlab checkpoints (:func:`memlab.techniques.checkpointing.repeated_blocks`).

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> with torch.device("meta"):
        ...     model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=3,
        ...                                          num_attention_heads=2, vocab_size=256))
        >>> sorted({type(unit).__name__ for unit in shard_units(model)}), len(shard_units(model))
        (['LlamaDecoderLayer'], 3)
    """
    names = set(getattr(model, "_no_split_modules", None) or ())
    units = [m for m in model.modules() if m is not model and type(m).__name__ in names]
    if units:
        return units
    from memlab.techniques.checkpointing import repeated_blocks

    return [m for m in repeated_blocks(model) if m is not model]


def _meta_copy(model_or_config: Any) -> nn.Module:
    """The model on the ``meta`` device (no memory): a live model is deep-copied with meta twins of its tensors."""
    from memlab.estimation.estimate import load_config, meta_model

    if isinstance(model_or_config, nn.Module):
        memo: dict[int, Any] = {}
        for module in model_or_config.modules():
            for tensor in [*module._parameters.values(), *module._buffers.values()]:
                if isinstance(tensor, torch.Tensor) and id(tensor) not in memo:
                    twin = torch.empty_like(tensor.detach(), device="meta")
                    memo[id(tensor)] = nn.Parameter(twin, tensor.requires_grad) if isinstance(
                        tensor, nn.Parameter) else twin
        with torch.no_grad():
            try:
                return copy.deepcopy(model_or_config, memo)
            except Exception as error:  # noqa: BLE001 - objects deepcopy cannot copy
                raise MemlabError(
                    f"could not copy the {type(model_or_config).__name__} onto the meta device "
                    f"({type(error).__name__}); pass its transformers config (model.config) instead"
                ) from None
    if isinstance(model_or_config, str):
        model_or_config = load_config(model_or_config)
    return meta_model(model_or_config)


@contextlib.contextmanager
def _fake_process_group(gpus: int) -> Iterator[Any]:
    """A fake process group of ``gpus`` ranks (this process is rank 0) and its CPU device mesh, for the block."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend

    if dist.is_initialized():
        raise MemlabError(
            "a torch.distributed process group is already initialised in this process; run the sharded estimate "
            "before init_process_group, or in a fresh kernel (memlab estimate on the command line)"
        )
    hook = sys.excepthook  # init_process_group wraps it to prefix tracebacks with "[rank0]": put it back after
    dist.init_process_group("fake", rank=0, world_size=gpus, store=FakeStore())
    try:
        yield init_device_mesh("cpu", (gpus,))
    finally:
        dist.destroy_process_group()
        sys.excepthook = hook


def _fsdp2_run(
    model_or_config: Any,
    batch: Any,
    plan: Plan,
    gpus: int,
    loss_fn: LossFn | None,
    lr: float,
    device: str | torch.device | None,
    limit: int | None,
) -> tuple[ShardedTrial, list[dict[str, int]]]:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from memlab.estimation.estimate import BLIND_SPOTS, adamw8bit_state_bytes, fake_batch
    from memlab.techniques.checkpointing import enable_checkpointing
    from memlab.techniques.optimizer import build_optimizer

    target = _target(model_or_config, device)
    model = _meta_copy(model_or_config)
    if plan.weights == "bf16":
        model.to(torch.bfloat16)
    if plan.checkpointing:
        enable_checkpointing(model)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(plan.precision)
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype, output_dtype=dtype)
    notes = [BLIND_SPOTS, _FSDP_NOTE]
    if target.type == "cuda" and not torch.cuda.is_available():
        notes.append("no CUDA here: estimated with CPU kernels and CPU autocast rules")
    if plan.offloads_activations:
        notes.append("activation offload is not estimated sharded: shown as no change")
    eight_bit = plan.optimizer in ("adamw8bit", "paged_adamw8bit")
    with _fake_process_group(gpus) as mesh, _quiet():
        for unit in shard_units(model):
            fully_shard(unit, mesh=mesh, mp_policy=policy, reshard_after_forward=True)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        with mode:
            model.to_empty(device="cpu")
            fake = _micro_batch(fake_batch(batch, mode, "cpu"), plan)
            loss_of = resolve_loss_fn(fake, loss_fn)
            trained = [p for p in model.parameters() if p.requires_grad]
            optimizer = build_optimizer(
                trained, plan.replace(optimizer="adamw") if eight_bit else plan, lr,
                device_type=target.type, fused=False if target.type == "cuda" else None,
            )
            tracker = FSDPMemTracker(model, optimizer)
            tracker.track_inputs((fake,))
            autocast = torch.autocast("cpu", dtype=dtype) if dtype is not None else contextlib.nullcontext()
            try:
                # Steady state: the optimizer state exists before the tracked step (one update on zero gradients).
                for parameter in trained:
                    parameter.grad = torch.zeros_like(parameter)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                with tracker:
                    with autocast:
                        loss = loss_of(model, fake)
                    loss.backward()
                    optimizer.step()
            except MemlabError:
                raise
            except Exception as error:  # noqa: BLE001 - reported as the plan's estimate, like any failure
                first = next((line for line in str(error).splitlines() if line.strip()), "")
                return ShardedTrial(plan, "error", 0, {}, None, None, None, str(target), error=(
                    f"{type(error).__name__}: {first}"), budget=limit, estimated=True, gpus=gpus,
                    strategy="fsdp2"), []
            held = _local_bytes(
                [p for p in model.parameters()]
                + [p.grad for p in trained if p.grad is not None]
                + [t for state in optimizer.state.values() for t in state.values() if isinstance(t, torch.Tensor)]
            )
            shards = [_local(p) for p in trained]
    detail, peaks = _fsdp_detail(tracker)
    host = 0
    if eight_bit:
        state = adamw8bit_state_bytes(shards)
        held += state - detail["optimizer"]
        detail["optimizer"] = state
        notes.append("8-bit AdamW state computed from its known size (bitsandbytes cannot run on fake tensors)")
    if plan.offloads_optimizer:
        # CPUOffloadPolicy: sharded parameters, gradients and optimizer state live in CPU memory.
        host = sum(detail[k] for k in _HOST_WITH_OFFLOAD)
        detail = max(peaks, key=lambda d: sum(v for k, v in d.items() if k not in _HOST_WITH_OFFLOAD))
        host = max(host, held)
        detail = {k: (0 if k in _HOST_WITH_OFFLOAD else v) for k, v in detail.items()}
        held = 0
        notes.append("optimizer offload = FSDP2 CPUOffloadPolicy: sharded weights, gradients and optimizer state "
                     "in CPU memory (host_bytes)")
    return _trial(plan, detail, target, limit, gpus, "fsdp2", held, host, notes), peaks


def _fsdp_detail(tracker: Any) -> tuple[dict[str, int], list[dict[str, int]]]:
    """The tracker's peak snapshot, and every module-level snapshot, as :data:`DETAIL` dicts (device summed)."""

    def convert(snapshot: Any) -> dict[str, int]:
        detail = dict.fromkeys(DETAIL, 0)
        for per_device in snapshot.values():
            for kind, nbytes in per_device.items():
                name = _FSDP_KINDS.get(getattr(kind, "value", kind))
                if name is not None:
                    detail[name] += int(nbytes)
        return detail

    peaks = [convert(tracker.get_tracker_snapshot("peak"))]
    for stats in tracker.memory_tracking.values():
        for snapshots in getattr(stats, "snapshots", {}).values():
            peaks.extend(convert(snapshot) for snapshot in snapshots)
    return peaks[0], peaks


def _local(tensor: torch.Tensor) -> torch.Tensor:
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def _local_bytes(tensors: Sequence[torch.Tensor]) -> int:
    seen: dict[int, int] = {}
    for tensor in tensors:
        local = _local(tensor)
        storage = local.untyped_storage()
        seen[id(storage)] = int(storage.nbytes())
    return sum(seen.values())


def _micro_batch(batch: Any, plan: Plan) -> Any:
    """The plan's micro-batch: the first ``plan.micro_batch`` rows (repeated when it asks for more)."""
    if plan.micro_batch is None:
        return batch
    rows = count_rows(batch)
    index = torch.arange(plan.micro_batch) % max(rows, 1)
    return map_tensors(batch, lambda t: t[index] if t.dim() > 0 and t.shape[0] == rows else t)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


# --- ZeRO ------------------------------------------------------------------------------------------------------------


def layer_counts(model_or_config: Any) -> tuple[int, int]:
    """``(trainable parameters, the largest layer's own parameters)`` as DeepSpeed counts them
    (``model_to_params`` and ``estimate_zero3_model_states_mem_needs_all_live``: tied weights once; a layer's own
    parameters, ``recurse=False``).

    Example:
        >>> layer_counts(nn.Sequential(nn.Linear(10, 10), nn.Linear(10, 2)))
        (132, 110)
    """
    model = model_or_config if isinstance(model_or_config, nn.Module) else _meta_copy(model_or_config)
    seen: dict[int, int] = {}
    for parameter in model.parameters():
        if parameter.requires_grad:
            seen[id(parameter)] = parameter.numel()
    largest = max((sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()), default=0)
    return sum(seen.values()), largest


def zero_model_states(
    parameters: int,
    largest_layer: int,
    gpus: int,
    stage: int,
    *,
    weight_bytes: int = 2,
    optimizer_bytes: float = 8,
    offload: str = "none",
) -> dict[str, int]:
    """Bytes per GPU of DeepSpeed ZeRO's model states: ``{"params", "grads", "optimizer", "host"}``.

    The formulas are DeepSpeed's (module docstring), per dtype: ``weight_bytes`` per 16-bit weight (4 for fp32
    training), ``optimizer_bytes`` of optimizer state per parameter (AdamW: 8), ``offload`` as in the Plan
    (``"optimizer"``: ZeRO-Offload; ``"all"``: ZeRO-3 offloads the parameters too). ``"host"`` is this rank's
    share of the CPU memory offload takes.

    Example:
        >>> states = zero_model_states(10**9, 10**7, 8, 2)  # DeepSpeed: 2*P + 18*P/N
        >>> sum(v for k, v in states.items() if k != "host") == 2 * 10**9 + 18 * 10**9 // 8
        True
        >>> states = zero_model_states(10**9, 10**7, 8, 3)  # DeepSpeed: 4*L + 18*P/N
        >>> sum(v for k, v in states.items() if k != "host") == 4 * 10**7 + 18 * 10**9 // 8
        True
    """
    if stage not in (2, 3):
        raise MemlabError(f"ZeRO stage {stage} is not estimated; write stage=2 or stage=3")
    w, p, n, big = weight_bytes, parameters, gpus, largest_layer
    partition = int(w * p / n)
    params = w * p if stage == 2 else partition + w * big  # whole weights; or a partition and one gathered layer
    # ZeRO-2: the 16-bit gradient partition and its fp32 copy; ZeRO-3: the fp32 partition and one gathered layer's.
    grads = int((w + 4) * p / n) if stage == 2 else int(4 * p / n) + w * big
    optimizer = int((4 + optimizer_bytes) * p / n)  # fp32 master weights and the optimizer state
    host = 0
    if offload in ("optimizer", "all"):  # ZeRO-Offload: gradients, master weights and state on the CPU
        host = int((4 + 4 + optimizer_bytes) * p / n)
        grads = w * big if stage == 3 else 0
        optimizer = 0
    if offload == "all" and stage == 3:  # ZeRO-Infinity's parameter offload
        host += partition
        params = w * big
    return {"params": params, "grads": grads, "optimizer": optimizer, "host": host}


def _one_gpu(
    model_or_config: Any,
    batch: Any,
    plan: Plan,
    loss_fn: LossFn | None,
    lr: float,
    device: Any,
    run: tuple[ShardedTrial, list[dict[str, int]]] | None = None,
) -> Trial:
    """What ZeRO shares with any data-parallel step: the largest activations of the per-GPU forward and backward
    (and the batch), taken from an FSDP2 dry run of the same plan (same per-GPU batch, weights gathered in the
    compute dtype, as DeepSpeed's bf16/fp16 run them), and the optimizer's state per parameter (AdamW: 8 bytes and a
    4-byte step per tensor; 8-bit AdamW: bitsandbytes' size; others: from the one-GPU dry run). Returned as a Trial
    whose breakdown holds those three numbers. ``run``: an FSDP2 dry run of that same plan already made (at any
    number of GPUs: data parallelism does not change the activations), used instead of a new one."""
    from memlab.estimation.estimate import adamw8bit_state_bytes, estimate

    one = plan.replace(offload="none", optimizer="adamw")
    trial, peaks = run if run is not None else _fsdp2_run(model_or_config, batch, one, 2, loss_fn, lr, device, None)
    if trial.status != "ok":
        raise MemlabError(f"the dry run the ZeRO estimate starts from failed: {trial.error}")
    activations = max((d["activations"] for d in peaks), default=0)
    inputs = max((d["inputs"] for d in peaks), default=0)
    model = model_or_config if isinstance(model_or_config, nn.Module) else _meta_copy(model_or_config)
    trained = [p for p in {id(p): p for p in model.parameters()}.values() if p.requires_grad]
    if plan.optimizer == "adamw":
        state = sum(8 * p.numel() + 4 for p in trained)
    elif plan.optimizer in ("adamw8bit", "paged_adamw8bit"):
        state = adamw8bit_state_bytes(trained)
    else:
        single = estimate(model_or_config, batch, plan.replace(offload="none"), loss_fn=loss_fn, lr=lr, device=device)
        if single.status != "ok":
            raise MemlabError(f"the one-GPU dry run the ZeRO estimate starts from failed: {single.error}")
        state = single.breakdown["optimizer"]
    breakdown = {"optimizer": state, "activations": activations, "other": inputs}
    return dataclasses.replace(trial, breakdown=breakdown, peak_bytes=sum(breakdown.values()),
                               notes=tuple(n for n in trial.notes if n != _FSDP_NOTE))


def _zero(single: Trial, counts: tuple[int, int], plan: Plan, gpus: int, stage: int, limit: int | None) -> ShardedTrial:
    parameters, largest = counts
    w = 2 if plan.precision != "fp32" or plan.weights == "bf16" else 4
    k = single.breakdown["optimizer"] / max(parameters, 1)
    states = zero_model_states(parameters, largest, gpus, stage, weight_bytes=w, optimizer_bytes=k,
                               offload=plan.offload)
    buckets = min(DS_REDUCE_BUCKET, parameters) + min(
        DS_ALLGATHER_BUCKET if stage == 2 else DS_PREFETCH_BUCKET, parameters)
    detail = dict.fromkeys(DETAIL, 0)
    detail["sharded_params" if stage == 3 else "unsharded_params"] = states["params"]
    detail["sharded_grads"] = states["grads"]
    detail["optimizer"] = states["optimizer"]
    detail["activations"] = single.breakdown["activations"]
    detail["inputs"] = single.breakdown["other"]
    detail["communication"] = w * buckets
    notes = [
        *(n for n in single.notes if not n.startswith("fp16 on CPU")),
        f"ZeRO-{stage} model states from DeepSpeed's formulas (memlab.estimation.sharded); "
        "activations from the FSDP2 dry run",
    ]
    if plan.offload == "all" and stage == 2:
        notes.append("ZeRO-2 cannot offload parameters: offload='all' offloads the optimizer only")
    if plan.weights == "bf16":
        notes.append("DeepSpeed keeps fp32 master weights even for bf16 weights: counted")
    held = states["params"] + states["grads"] + states["optimizer"]
    return _trial(plan, detail, torch.device(single.device), limit, gpus, f"zero{stage}", held, states["host"], notes)


# --- results ---------------------------------------------------------------------------------------------------------


def _trial(
    plan: Plan,
    detail: dict[str, int],
    target: torch.device,
    limit: int | None,
    gpus: int,
    strategy: str,
    held: int,
    host: int,
    notes: Sequence[str],
) -> ShardedTrial:
    breakdown = dict.fromkeys(CATEGORIES, 0)
    for name, nbytes in detail.items():
        breakdown[_DETAIL_TO_CATEGORY[name]] += nbytes
    peak = sum(breakdown.values())
    return ShardedTrial(
        plan, "ok", peak, breakdown, None, None, None, str(target),
        budget=limit, notes=tuple(dict.fromkeys(notes)), estimated=True, gpus=gpus, strategy=strategy,
        detail=detail, model_state_bytes=held, host_bytes=host,
    )


def _target(model_or_config: Any, device: str | torch.device | None) -> torch.device:
    if device is not None:
        target = torch.device(device)
    elif isinstance(model_or_config, nn.Module):
        target = next((p.device for p in model_or_config.parameters()), torch.device("cpu"))
        target = torch.device("cuda") if target.type == "meta" else target
    else:
        target = torch.device("cuda")
    if target.type not in ("cpu", "cuda"):
        raise MemlabError(f"device={str(target)!r} cannot be estimated; write device='cuda' or device='cpu'")
    return target
