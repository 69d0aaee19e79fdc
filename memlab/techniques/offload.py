"""The ``offload`` lever whole: optimizer state with the update on the CPU, and activations through
``save_on_cpu``'s hooks; what each keeps in host memory (``Trial.host_bytes``), counted by the offload itself on the
step's parts' :class:`~memlab.techniques.core.technique.HostLedger`, live and on fake tensors alike; its values and what
each moves (:func:`offloads`, the ``*_OFFLOADS`` tuples, which other modules ask instead of spelling the values), its
one-device refusal, what it adds to each export, and its declaration (:data:`DECLARATIONS`).

Host bytes are each tensor's storage, pinned ones rounded up to a power of two as PyTorch's caching host allocator
rounds its blocks. A paged optimizer's spill is counted as all of its state: the most the driver can page to the host
when the GPU runs short.

What the offload puts on the host is not device memory, in a dry run too (issue 60): every host tensor it makes (the
optimizer's fp32 copies, their gradients, the inner optimizer's state and temporaries, the saved activations' copies)
is made inside :func:`~memlab.live.host.host_side` or kept with :func:`~memlab.live.host.keep_on_host`, and
memlab's tracker counts no storage :data:`~memlab.live.host.HOST` holds. A CUDA dry run on the CPU's kernels, whose
device and host are the same fake CPU, so runs the offload as a GPU does: each copy to the host is a new tensor
(``empty`` and ``copy_``, never a ``.to()`` that returns its source), and each copy back to the device (a saved
tensor unpacked for backward, the new weights copied into the device's) is one the tracker counts.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import is_fake

from memlab.live.host import host_side, keep_on_host
from memlab.techniques.checkpointing import trainer_checkpointing
from memlab.techniques.core.fragments import THE_DEEPSPEED_CONFIG, Accelerate, Code, Elsewhere, Keys, per_target
from memlab.techniques.core.lever import Lever, PlanLike
from memlab.techniques.core.technique import HostLedger, PlanFields, StepParts, Technique, Undo

if TYPE_CHECKING:  # annotations only
    from memlab.techniques.core.fragments import Export, Fragment

NOTHING_TO_MOVE = (
    "offload moves nothing on a CPU-only device: memory and speed are as without it, and its host bytes are 0 "
    "(host_bytes is what a plan moves off its device)"
)

OFFLOAD_ESTIMATED = (
    "offload estimated as a GPU runs it: what it moves to the host (the optimizer's fp32 weights, gradients and "
    "state, the saved activations) is not in the GPU's bytes, the copies back to the GPU are; host_bytes counts its "
    "pinned blocks rounded up to a power of two, as PyTorch's caching host allocator does, and the optimizer's state "
    "as pageable memory"
)
"""The note of a CUDA estimate of an offload plan (made on fake tensors): how its host side is modelled."""

NO_OFFLOAD = "none"
"""The ``offload`` value that moves nothing."""

OPTIMIZER_OFFLOADS = ("optimizer", "all", "params")
"""The ``offload`` values that put the optimizer's state and update on the CPU (``"params"``, sharded only, puts
each GPU's shard of the weights there too)."""

PARAMS_NEED_SHARDING = (
    "offload='params' keeps each GPU's shard of the weights in CPU memory (FSDP offload_params, DeepSpeed ZeRO-3 "
    "offload_param), which needs training sharded over GPUs; on one GPU write offload='optimizer' (or 'all'), or "
    "estimate it sharded: memlab.estimate(model, batch, plan, gpus=N, strategy='fsdp2')"
)
"""Why one GPU refuses ``offload="params"``, and what to write instead."""

ACTIVATION_OFFLOADS = ("activations", "all")
"""The ``offload`` values that put the tensors saved for backward in CPU memory."""

WEIGHT_OFFLOADS = ("all", "params")
"""The ``offload`` values that put each GPU's partition of the weights in CPU memory where the engine can (DeepSpeed
ZeRO-3's ``offload_param``; ZeRO-2 cannot)."""

SHARDED_ONLY = "params"
"""The ``offload`` value that only sharded training runs (:data:`PARAMS_NEED_SHARDING`)."""

SEARCHED_OFFLOADS = (NO_OFFLOAD, "optimizer", "all")
"""The ``offload`` values fit searches by default on a GPU (:func:`memlab.search.space.default_space`; on a CPU there
is nothing to move them to, so :data:`NO_OFFLOAD` alone)."""

COMBINED_OFFLOADS = (NO_OFFLOAD, "optimizer")
"""The ``offload`` values suggestions combine with the other levers (:data:`memlab.search.suggest.COMBINED`)."""


def offloads(plan: PlanFields, part: str) -> bool:
    """Whether ``plan`` keeps ``part`` in CPU memory: ``"optimizer"``, the optimizer's state and update
    (``Plan.offloads_optimizer``), or ``"activations"``, the tensors saved for backward (``Plan.offloads_activations``).

    Example:
        >>> from memlab.plan import Plan
        >>> offloads(Plan(offload="all"), "optimizer"), offloads(Plan(offload="activations"), "optimizer")
        (True, False)
        >>> offloads(Plan(offload="activations"), "activations"), offloads(Plan(offload="optimizer"), "activations")
        (True, False)
    """
    return plan.offload in {"optimizer": OPTIMIZER_OFFLOADS, "activations": ACTIVATION_OFFLOADS}[part]


def offload_notes(plan: PlanFields, device: torch.device) -> list[str]:
    """What the plan's offload means on this device.

    Example:
        >>> from memlab.plan import Plan
        >>> offload_notes(Plan(offload="all"), torch.device("cpu")) == [NOTHING_TO_MOVE]
        True
    """
    if plan.offload != "none" and device.type == "cpu":
        return [NOTHING_TO_MOVE]
    return []


def host_block_bytes(nbytes: int, pinned: bool) -> int:
    """Bytes a host tensor of ``nbytes`` takes: pinned ones come from PyTorch's caching host allocator, which
    rounds every block up to a power of two.

    Example:
        >>> host_block_bytes(3000, pinned=False), host_block_bytes(3000, pinned=True)
        (3000, 4096)
    """
    return 1 << (nbytes - 1).bit_length() if pinned and nbytes > 1 else nbytes


def tensors_host_bytes(tensors: Iterable[torch.Tensor | None], pinned: bool) -> int:
    """The host bytes of ``tensors``' storages, each counted once (see :func:`host_block_bytes`).

    Example:
        >>> weight = torch.zeros(4, 4)
        >>> tensors_host_bytes([weight, weight[0], None, torch.zeros(3)], pinned=False)
        76
    """
    seen: dict[int, int] = {}
    for tensor in tensors:
        if tensor is None:
            continue
        storage = tensor.untyped_storage()
        seen[storage._cdata] = host_block_bytes(storage.nbytes(), pinned)
    return sum(seen.values())


class _Saved:
    """A tensor saved for backward as the offload keeps it, and where it goes back to (None: it stayed)."""

    __slots__ = ("__weakref__", "device", "tensor")

    def __init__(self, tensor: torch.Tensor, device: torch.device | None) -> None:
        self.tensor, self.device = tensor, device


def counted_save_on_cpu(ledger: HostLedger, *, move: bool, pinned: bool) -> torch.autograd.graph.saved_tensors_hooks:
    """``torch.autograd.graph.save_on_cpu``'s hooks, each saved tensor's host copy counted on ``ledger`` while
    autograd keeps it (it is given back when the graph lets it go, after its backward). ``move=False`` counts the
    bytes a move would take and keeps the tensor where it is. The host copies are host memory to memlab's tracker
    (:func:`~memlab.live.host.host_side`), on fake tensors too.

    Example:
        >>> ledger = HostLedger()
        >>> weight = torch.ones(4, 4, requires_grad=True)
        >>> with counted_save_on_cpu(ledger, move=True, pinned=False):
        ...     loss = (weight * 2).sin().sum()
        >>> ledger.held  # sin saved its 64-byte input (the product by a number saves nothing)
        64
        >>> loss.backward(); ledger.held, ledger.peak
        (0, 64)
    """

    def pack(tensor: torch.Tensor) -> _Saved:
        if move:
            with host_side():  # a new tensor even where the device is the (fake) CPU itself
                copy = torch.empty(tensor.size(), dtype=tensor.dtype, layout=tensor.layout,
                                   pin_memory=pinned and not tensor.is_sparse)
            keep_on_host([copy])
            copy.copy_(tensor, non_blocking=pinned)
            saved = _Saved(copy, tensor.device)
        else:
            saved = _Saved(tensor, None)
        nbytes = host_block_bytes(tensor.numel() * tensor.element_size(), pinned)
        ledger.add(nbytes)
        weakref.finalize(saved, ledger.remove, nbytes)
        return saved

    def unpack(saved: _Saved) -> torch.Tensor:
        if saved.device is None:
            return saved.tensor
        if saved.tensor.device == saved.device and is_fake(saved.tensor):
            # a CUDA dry run on the CPU's kernels: the copy back to the GPU is a new device tensor, as it is there
            return torch.empty_like(saved.tensor).copy_(saved.tensor)
        return saved.tensor.to(saved.device, non_blocking=pinned)

    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


class OffloadedOptimizer(torch.optim.Optimizer):
    """Keeps fp32 master weights and optimizer state in CPU memory and runs the update there.

    It is a real ``torch.optim.Optimizer`` whose ``param_groups`` hold the device parameters, so a ``GradScaler``
    unscales their gradients as usual and LR schedulers (``LambdaLR``, ...) and hand-set learning rates work on it:
    before each update the hyperparameters of its groups are copied to the CPU optimizer's. ``step()`` copies the
    gradients into (pinned) CPU buffers, steps the CPU optimizer, and copies the new weights back.

    Example:
        >>> layer = nn.Linear(4, 4)
        >>> optimizer = OffloadedOptimizer(list(layer.parameters()), lambda ps: torch.optim.AdamW(ps, lr=1e-3))
        >>> scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5)
        >>> layer(torch.ones(2, 4)).sum().backward(); optimizer.step(); scheduler.step()
        >>> optimizer.param_groups[0]["lr"], optimizer.inner.param_groups[0]["lr"]
        (0.0005, 0.0005)
    """

    def __init__(
        self,
        parameters: Sequence[nn.Parameter],
        make_optimizer: Callable[[Sequence[nn.Parameter]], torch.optim.Optimizer],
        *,
        pinned: bool | None = None,
    ) -> None:
        self.device_parameters = list(parameters)
        pin = torch.cuda.is_available()
        self.pinned = pin if pinned is None else pinned
        """Whether its copies count as pinned blocks (:meth:`host_bytes`): where CUDA is, or as told (a CUDA dry run
        on the CPU's kernels, whose fake copies cannot pin)."""
        with host_side():  # new host tensors even where the device parameters are (fake) CPU ones
            self.cpu_parameters = [
                nn.Parameter(torch.empty(p.shape, dtype=torch.float32, pin_memory=pin).copy_(p.detach()))
                for p in self.device_parameters
            ]
            self.inner = make_optimizer(self.cpu_parameters)
        keep_on_host(self.cpu_parameters)
        super().__init__(self.device_parameters, dict(self.inner.defaults))
        # The groups' hyperparameters are the inner optimizer's (its lr, betas...), over the device parameters.
        self.param_groups[0].update({k: v for k, v in self.inner.param_groups[0].items() if k != "params"})

    def zero_grad(self, set_to_none: bool = True) -> None:
        for parameter in self.device_parameters:
            parameter.grad = None
        self.inner.zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> None:  # type: ignore[override]
        for outer, inner in zip(self.param_groups, self.inner.param_groups, strict=True):
            inner.update({key: value for key, value in outer.items() if key != "params"})
        for device_param, cpu_param in zip(self.device_parameters, self.cpu_parameters, strict=True):
            if device_param.grad is None:
                cpu_param.grad = None
                continue
            if cpu_param.grad is None:
                with host_side():
                    cpu_param.grad = torch.empty_like(cpu_param, pin_memory=cpu_param.is_pinned())
                keep_on_host([cpu_param.grad])
            cpu_param.grad.copy_(device_param.grad, non_blocking=True)
        # The copies to the host must land before the CPU steps; fake ones (a dry run) hold nothing to wait for,
        # and no CUDA call is made under a dry run's fake mode (DESIGN.md 2.4).
        if torch.cuda.is_available() and not all(is_fake(p) for p in self.device_parameters):
            torch.cuda.synchronize()
        with host_side():  # its state and temporaries are the CPU's
            self.inner.step()
        keep_on_host(_state_tensors(self.inner))
        for device_param, cpu_param in zip(self.device_parameters, self.cpu_parameters, strict=True):
            device_param.copy_(cpu_param, non_blocking=True)

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def host_bytes(self) -> int:
        """What it keeps in host memory: the fp32 weights and their gradient buffers (pinned where CUDA is, or as
        ``pinned`` says) and the inner optimizer's state (pageable: its ``zeros_like`` does not pin).

        Example:
            >>> layer = nn.Linear(4, 4)
            >>> optimizer = OffloadedOptimizer(list(layer.parameters()), lambda ps: torch.optim.AdamW(ps))
            >>> layer(torch.ones(1, 4)).sum().backward(); optimizer.step()
            >>> optimizer.host_bytes()  # weights, gradients, two moments: 4 x 80 bytes, and two 4-byte steps
            328
        """
        # A gradient buffer per weight, held or not now: each step holds them all (zero_grad lets them go after it).
        copies = 2 * tensors_host_bytes(self.cpu_parameters, self.pinned)
        return copies + tensors_host_bytes(_state_tensors(self.inner), pinned=False)


class Offload(Technique):
    """``offload``: saved activations through ``save_on_cpu`` during forward, the optimizer's state and update on
    the CPU (:class:`OffloadedOptimizer` over the optimizer the plan builds). On a CPU-only device there is nothing
    to move: a note says so.

    Example:
        >>> from memlab.plan import Plan
        >>> from memlab.techniques.core.technique import StepParts
        >>> parts = StepParts(nn.Linear(2, 2), Plan(offload="all"), torch.device("cpu"))
        >>> OFFLOAD.put_on(parts); OFFLOAD.notes(parts) == [NOTHING_TO_MOVE]
        True
    """

    def put_on(self, parts: StepParts) -> Undo | None:
        plan = parts.plan
        if plan.optimizer == "paged_adamw8bit" and parts.optimizer_device_type == "cuda":
            # its spill: all of its state at the most (read when asked: the optimizer is built after the techniques)
            parts.host.resident.append(lambda: tensors_host_bytes(_state_tensors(parts.optimizer), pinned=False))
        # A CUDA dry run on the CPU's kernels offloads as the GPU would, its host copies marked as host memory.
        emulated = parts.device.type == "cpu" and parts.fake and parts.optimizer_device_type == "cuda"
        if parts.device.type == "cpu" and not emulated:
            return None
        if offloads(plan, "activations"):
            parts.forward_contexts.append(lambda: counted_save_on_cpu(parts.host, move=True, pinned=True))
        if offloads(plan, "optimizer"):
            if parts.make_optimizer is None:
                raise RuntimeError("the optimizer's technique goes on before offload's")
            offloaded = OffloadedOptimizer(parts.parameters, parts.make_optimizer, pinned=True if emulated else None)
            parts.optimizer = offloaded
            parts.host.resident.append(offloaded.host_bytes)
        return None

    def notes(self, parts: StepParts) -> list[str]:
        if parts.plan.offload != "none" and parts.optimizer_device_type == "cuda" and parts.fake:
            return [OFFLOAD_ESTIMATED]
        return offload_notes(parts.plan, parts.device)


def _state_tensors(optimizer: Any) -> list[torch.Tensor]:
    state = getattr(optimizer, "state", {}) if optimizer is not None else {}
    return [v for values in state.values() for v in values.values() if isinstance(v, torch.Tensor)]


OFFLOAD = Offload()


# --- the lever: its declaration and what it adds to each export -------------------------------------------------

_PIN = 'pin = device.type == "cuda"  # pinned CPU memory makes copies to and from the GPU faster'


def _optimizer_offload_code() -> Code:
    return Code(
        settings=(_PIN,),
        before_optimizer=(
            "# Optimizer offload: optimizer state and update live on the CPU, on copies of the weights",
            "cpu_params = [",
            '    torch.empty(p.shape, dtype=p.dtype, device="cpu", pin_memory=pin).copy_(p.detach())',
            "    for p in params",
            "]",
            "for cpu_p in cpu_params:",
            "    cpu_p.requires_grad_()",
        ),
        optimizer_over=("cpu_params", "cpu_params[0].device"),
        before_step=(
            "for p, cpu_p in zip(params, cpu_params):  # gradients to the CPU",
            '    cpu_p.grad = None if p.grad is None else p.grad.to("cpu", dtype=cpu_p.dtype)',
            "    p.grad = None",
        ),
        after_step=(
            "with torch.no_grad():  # updated weights back to the device",
            "    for p, cpu_p in zip(params, cpu_params):",
            "        p.copy_(cpu_p, non_blocking=True)",
        ),
    )


_CPU_CHECKPOINTING = {
    "partition_activations": False,
    "cpu_checkpointing": True,
    "contiguous_memory_optimization": False,
    "synchronize_checkpoint_boundary": False,
}


def _offload_for_deepspeed(plan: PlanLike) -> Fragment:
    keys: dict[str, object] = {}
    if plan.offloads_optimizer:
        keys["zero_optimization"] = {"offload_optimizer": {"device": "cpu", "pin_memory": True}}
    if plan.offloads_activations:
        keys["activation_checkpointing"] = dict(_CPU_CHECKPOINTING)
        if not plan.checkpointing:
            keys["_comment"] = (
                "DeepSpeed offloads only checkpointed activations: cpu_checkpointing acts only with "
                "activation checkpointing on"
            )
    return Keys(keys)


def _offload_for_the_trainer(plan: PlanLike) -> Fragment:
    if plan.offloads_activations and not plan.checkpointing:
        return (
            f"offload={plan.offload!r} without checkpointing has no Trainer form: the Trainer offloads only "
            "checkpointed activations; write checkpointing=True with it, or use plan.to_code() (save_on_cpu)"
        )
    keys: dict[str, object] = {}
    if plan.offloads_optimizer:  # the Trainer offloads optimizer state only through DeepSpeed
        keys["deepspeed"] = THE_DEEPSPEED_CONFIG
    if plan.offloads_activations:  # transformers holds the checkpointed activations in pinned CPU memory: since
        # 5.17 as gradient_checkpointing_kwargs' "offload" (the legacy names), then as activation_checkpointing_kwargs'
        legacy = {**keys, "gradient_checkpointing_kwargs": {"offload": True}}
        keys["activation_checkpointing_kwargs"] = {"offload": True}
        return Keys(keys, legacy=legacy)
    return Keys(keys)


def _offload(target: str) -> Export:
    def fragment(plan: PlanLike) -> Fragment:
        if plan.offload == SHARDED_ONLY and target in ("trainer", "code", "deepspeed"):
            # the Trainer's and plain code's one process, and to_deepspeed's ZeRO-2, cannot offload the weights
            return ("offload='params' offloads each GPU's shard of the weights, which needs FSDP or ZeRO-3; write "
                    "plan.to_accelerate_config(gpus=N, strategy='fsdp2' or 'zero3'), or offload='optimizer'")
        if target == "trainer":
            return _offload_for_the_trainer(plan)
        if target == "deepspeed":
            return _offload_for_deepspeed(plan)
        if target == "code":
            code = _optimizer_offload_code() if plan.offloads_optimizer else Code()
            if plan.offloads_activations:
                code += Code(settings=(_PIN,), contexts=("torch.autograd.graph.save_on_cpu(pin_memory=pin)",))
            return code
        if target == "accelerate":
            device = "cpu" if plan.offloads_optimizer else "none"
            return Accelerate(
                fsdp2={"fsdp_offload_params": bool(plan.offloads_optimizer)},
                zero2={"offload_optimizer_device": device, "offload_param_device": "none"},
                zero3={"offload_optimizer_device": device,
                       "offload_param_device": "cpu" if plan.offload in WEIGHT_OFFLOADS else "none"},
                script=Code(contexts=("torch.autograd.graph.save_on_cpu(pin_memory=True)",))
                if plan.offloads_activations else Code(),
                refused={"zero2": "ZeRO-2 cannot offload the parameters (offload='params'); write strategy='zero3' "
                                  "or 'fsdp2', or offload='optimizer' with zero2"}
                if plan.offload == SHARDED_ONLY else {},
            )
        return Elsewhere()

    return fragment


def engine_offload(offload: str, strategy: str) -> str:
    """What a sharded engine offloads for ``offload`` under ``strategy`` (``"fsdp1"``, ``"fsdp2"``, ``"zero2"``,
    ``"zero3"``), as the note of the engine settings an estimate assumed says it; ``""`` where nothing is.
    FSDP's one CPU offload is the parameters' (with their gradients and optimizer state); DeepSpeed offloads the
    optimizer, and under ZeRO-3 the parameters too.

    Example:
        >>> engine_offload("optimizer", "fsdp2")
        'offload_params=True (weights, gradients and optimizer state in CPU memory)'
        >>> engine_offload("params", "zero3"), engine_offload("optimizer", "zero3"), engine_offload("none", "zero2")
        ('offload_param and offload_optimizer to the CPU', 'offload_optimizer to the CPU', '')
    """
    if offload not in OPTIMIZER_OFFLOADS:
        return ""
    if strategy.startswith("fsdp"):
        return "offload_params=True (weights, gradients and optimizer state in CPU memory)"
    if offload == SHARDED_ONLY and strategy == "zero3":
        return "offload_param and offload_optimizer to the CPU"
    return "offload_optimizer to the CPU"


def offload_from_accelerate(kind: str, section: Any) -> dict[str, str]:
    """The lever as an accelerate config's engine section sets it (``{"offload": value}``, a Plan keyword): FSDP's
    ``fsdp_offload_params`` and ZeRO-3's ``offload_param_device: cpu`` are ``"params"``, DeepSpeed's
    ``offload_optimizer_device: cpu`` alone ``"optimizer"``.

    Example:
        >>> offload_from_accelerate("FSDP", {"fsdp_offload_params": True})
        {'offload': 'params'}
        >>> offload_from_accelerate("DEEPSPEED", {"zero_stage": 2, "offload_optimizer_device": "cpu"})
        {'offload': 'optimizer'}
    """
    on_cpu = {name: str(section.get(name, "none")).lower() == "cpu"
              for name in ("offload_param_device", "offload_optimizer_device")}
    if kind == "FSDP":
        value = SHARDED_ONLY if section.get("fsdp_offload_params") else NO_OFFLOAD
    elif on_cpu["offload_param_device"] and int(section.get("zero_stage", 0)) == 3:
        value = SHARDED_ONLY
    else:
        value = "optimizer" if on_cpu["offload_optimizer_device"] else NO_OFFLOAD
    return {"offload": value}


def offloads_activations(args: Any) -> bool:
    """Whether a ``TrainingArguments`` offloads activations to the CPU: checkpointing with
    ``activation_checkpointing_kwargs={"offload": True}`` (``gradient_checkpointing_kwargs`` before 5.x's names), or
    TRL's ``activation_offloading=True``.

    Example:
        >>> from types import SimpleNamespace
        >>> legacy = SimpleNamespace(gradient_checkpointing=True, gradient_checkpointing_kwargs={"offload": True})
        >>> offloads_activations(legacy)
        True
        >>> offloads_activations(SimpleNamespace(activation_offloading=True)), offloads_activations(SimpleNamespace())
        (True, False)
    """
    checkpointing, checkpoint_kwargs = trainer_checkpointing(args)
    trl_offloads = bool(getattr(args, "activation_offloading", False))
    return trl_offloads or (checkpointing and bool(checkpoint_kwargs.get("offload")))


def trl_offload_keywords(plan: Any) -> tuple[Any, dict[str, bool]]:
    """``plan`` with what remains of its offload once TRL's own ``activation_offloading`` carries the activations
    (with or without checkpointing), and that keyword: what a TRL config writes for the lever.

    Example:
        >>> from memlab.plan import Plan
        >>> rest, keywords = trl_offload_keywords(Plan(offload="all"))
        >>> rest.offload, keywords
        ('optimizer', {'activation_offloading': True})
        >>> trl_offload_keywords(Plan())[1]
        {'activation_offloading': False}
    """
    rest = {"activations": NO_OFFLOAD, "all": "optimizer"}.get(plan.offload, plan.offload)
    return plan.replace(offload=rest), {"activation_offloading": plan.offloads_activations}


DECLARATIONS = (
    Lever(
        "offload",
        "none",
        short="offload-{}",
        choices=("none", "optimizer", "activations", "all", "params"),
        help="moves optimizer state and/or saved activations to CPU memory (params: sharded only, each GPU's shard "
        "of the weights, gradients and optimizer state): less GPU memory, slower steps",
        technique=OFFLOAD,
        slower=(("optimizer", "none"), ("activations", "none"), ("all", "none"), ("params", "none"),
                ("params", "optimizer")),
        activation_key=lambda value: value in ("activations", "all"),
        # Offloaded optimizer state is not on the device at all.
        optimizer_state={"optimizer": 0.0, "all": 0.0, "params": 0.0},
        speed={"optimizer": (0.7, 0.7), "activations": (0.6, 0.6), "all": (0.5, 0.5), "params": (0.5, 0.5)},
        on_cpu=lambda value: "none",
        on_cpu_note="offload moves nothing on a CPU-only device",
        from_arguments=lambda args: "activations" if offloads_activations(args) else NO_OFFLOAD,
        exports=per_target(_offload),
        refuses_step=lambda plan, loss_fn: PARAMS_NEED_SHARDING if plan.offload == SHARDED_ONLY else "",
    ),
)
"""The ``offload`` lever, (:data:`memlab.techniques.core.registry.REGISTRY` gathers it)."""
