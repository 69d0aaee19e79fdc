"""Offload to CPU: optimizer state with the update on the CPU, and activations through ``save_on_cpu``'s hooks; and
what each keeps in host memory (``Trial.host_bytes``), counted by the offload itself on the step's parts'
:class:`~memlab.techniques.technique.HostLedger`, live and on fake tensors alike.

Host bytes are each tensor's storage, pinned ones rounded up to a power of two as PyTorch's caching host allocator
rounds its blocks. A CUDA dry run on CPU kernels cannot move anything off its device (the step runs on the CPU): the
offload then counts what it would move (the saved tensors, the optimizer's fp32 copies, gradients and state built from
the state the dry run's optimizer holds) without moving it. A paged optimizer's spill is counted as all of its state:
the most the driver can page to the host when the GPU runs short.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import is_fake

from memlab.techniques.technique import HostLedger, PlanFields, StepParts, Technique, Undo

NOTHING_TO_MOVE = (
    "offload moves nothing on a CPU-only device: memory and speed are as without it, and its host bytes are 0 "
    "(host_bytes is what a plan moves off its device)"
)

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
    bytes a move would take and keeps the tensor where it is (a CUDA dry run on CPU kernels).

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
            copy = torch.empty(tensor.size(), dtype=tensor.dtype, layout=tensor.layout,
                               pin_memory=pinned and not tensor.is_sparse)
            copy.copy_(tensor, non_blocking=pinned)
            saved = _Saved(copy, tensor.device)
        else:
            saved = _Saved(tensor, None)
        nbytes = host_block_bytes(tensor.numel() * tensor.element_size(), pinned)
        ledger.add(nbytes)
        weakref.finalize(saved, ledger.remove, nbytes)
        return saved

    def unpack(saved: _Saved) -> torch.Tensor:
        return saved.tensor if saved.device is None else saved.tensor.to(saved.device, non_blocking=pinned)

    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


def activation_offload(
    plan: PlanFields, device: torch.device, ledger: HostLedger | None = None
) -> contextlib.AbstractContextManager[object]:
    """Saved activations go to (pinned) CPU memory during forward and come back for backward, counted on ``ledger``.

    Example:
        >>> from memlab.plan import Plan
        >>> isinstance(activation_offload(Plan(offload="activations"), torch.device("cpu")), contextlib.nullcontext)
        True
    """
    if not offloads(plan, "activations") or device.type == "cpu":
        return contextlib.nullcontext()
    return counted_save_on_cpu(HostLedger() if ledger is None else ledger, move=True, pinned=True)


def offloaded_state_bytes(optimizer: torch.optim.Optimizer, parameters: Sequence[torch.Tensor], pinned: bool) -> int:
    """What :class:`OffloadedOptimizer` would keep in host memory for ``parameters``, from ``optimizer``'s state on
    the device (a CUDA dry run on CPU kernels, where nothing can move): an fp32 copy and an fp32 gradient buffer of
    each parameter (pinned where CUDA is), and its state with each floating tensor of the parameter's shape in fp32.

    Example:
        >>> layer = nn.Linear(4, 4)
        >>> adamw = torch.optim.AdamW(layer.parameters())
        >>> layer(torch.ones(1, 4)).sum().backward(); adamw.step()
        >>> offloaded_state_bytes(adamw, list(layer.parameters()), pinned=False)  # 4 x 80 bytes, and 2 steps
        328
    """
    total = 0
    for parameter in parameters:
        fp32 = parameter.numel() * 4
        total += 2 * host_block_bytes(fp32, pinned)
        for value in optimizer.state.get(parameter, {}).values():
            if isinstance(value, torch.Tensor):
                shaped = value.is_floating_point() and value.shape == parameter.shape
                total += fp32 if shaped else value.untyped_storage().nbytes()
    return total


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
    ) -> None:
        self.device_parameters = list(parameters)
        pin = torch.cuda.is_available()
        self.pinned = pin
        self.cpu_parameters = [
            nn.Parameter(torch.empty(p.shape, dtype=torch.float32, pin_memory=pin).copy_(p.detach()))
            for p in self.device_parameters
        ]
        self.inner = make_optimizer(self.cpu_parameters)
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
                cpu_param.grad = torch.empty_like(cpu_param, pin_memory=cpu_param.is_pinned())
            cpu_param.grad.copy_(device_param.grad, non_blocking=True)
        # The copies to the host must land before the CPU steps; fake ones (a dry run) hold nothing to wait for,
        # and no CUDA call is made under a dry run's fake mode (DESIGN.md 2.4).
        if torch.cuda.is_available() and not all(is_fake(p) for p in self.device_parameters):
            torch.cuda.synchronize()
        self.inner.step()
        for device_param, cpu_param in zip(self.device_parameters, self.cpu_parameters, strict=True):
            device_param.copy_(cpu_param, non_blocking=True)

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def host_bytes(self) -> int:
        """What it keeps in host memory: the fp32 weights and their gradient buffers (pinned where CUDA is) and the
        inner optimizer's state (pageable: its ``zeros_like`` does not pin).

        Example:
            >>> layer = nn.Linear(4, 4)
            >>> optimizer = OffloadedOptimizer(list(layer.parameters()), lambda ps: torch.optim.AdamW(ps))
            >>> layer(torch.ones(1, 4)).sum().backward(); optimizer.step()
            >>> optimizer.host_bytes()  # weights, gradients, two moments: 4 x 80 bytes, and two 4-byte steps
            328
        """
        copies = [*self.cpu_parameters, *(p.grad for p in self.cpu_parameters)]
        state = [v for values in self.inner.state.values() for v in values.values() if isinstance(v, torch.Tensor)]
        return tensors_host_bytes(copies, self.pinned) + tensors_host_bytes(state, pinned=False)


class Offload(Technique):
    """``offload``: saved activations through ``save_on_cpu`` during forward, the optimizer's state and update on
    the CPU (:class:`OffloadedOptimizer` over the optimizer the plan builds). On a CPU-only device there is nothing
    to move: a note says so.

    Example:
        >>> from memlab.plan import Plan
        >>> from memlab.techniques.technique import StepParts
        >>> parts = StepParts(nn.Linear(2, 2), Plan(offload="all"), torch.device("cpu"))
        >>> OFFLOAD.put_on(parts); OFFLOAD.notes(parts) == [NOTHING_TO_MOVE]
        True
    """

    def put_on(self, parts: StepParts) -> Undo | None:
        plan = parts.plan
        if plan.optimizer == "paged_adamw8bit" and parts.optimizer_device_type == "cuda":
            # its spill: all of its state at the most (read when asked: the optimizer is built after the techniques)
            parts.host.resident.append(lambda: tensors_host_bytes(_state_tensors(parts.optimizer), pinned=False))
        if parts.device.type == "cpu":
            if parts.fake and parts.optimizer_device_type == "cuda":
                _count_without_moving(parts)
            return None
        if offloads(plan, "activations"):
            parts.forward_contexts.append(lambda: activation_offload(plan, parts.device, parts.host))
        if offloads(plan, "optimizer"):
            if parts.make_optimizer is None:
                raise RuntimeError("the optimizer's technique goes on before offload's")
            offloaded = OffloadedOptimizer(parts.parameters, parts.make_optimizer)
            parts.optimizer = offloaded
            parts.host.resident.append(offloaded.host_bytes)
        return None

    def notes(self, parts: StepParts) -> list[str]:
        return offload_notes(parts.plan, parts.device)


def _count_without_moving(parts: StepParts) -> None:
    """A CUDA dry run on CPU kernels: what the offload would keep in (pinned) host memory, counted on the step's
    ledger; nothing moves, since the step's device is the CPU itself."""
    if offloads(parts.plan, "activations"):
        parts.forward_contexts.append(lambda: counted_save_on_cpu(parts.host, move=False, pinned=True))
    if offloads(parts.plan, "optimizer"):
        parameters = parts.parameters
        parts.host.resident.append(lambda: offloaded_state_bytes(parts.optimizer, parameters, pinned=True)
                                   if parts.optimizer is not None else 0)


def _state_tensors(optimizer: Any) -> list[torch.Tensor]:
    state = getattr(optimizer, "state", {}) if optimizer is not None else {}
    return [v for values in state.values() for v in values.values() if isinstance(v, torch.Tensor)]


OFFLOAD = Offload()
