"""What a trial or an applied technique can change on a model, captured and put back exactly.

Two kinds of state:

- the structure (:class:`~memlab.live.structure.ModuleStructure`, in :mod:`memlab.live.structure`, where the
  techniques read it too): the instance state of every module and parameter, captured generally. Cheap: shallow
  copies, no tensor data.
- the values (:class:`ModelValues`): the tensors a trial can change (trainable parameters and buffers), ``.grad``
  fields and random-number state. They cost a host copy, so they are taken once per ``compare``/``fit`` rather than
  once per plan, and frozen parameters are never copied.

A dry run's values are its fake copy's alone (``rng=False``): the process's random-number state is the live
model's, never read or put back under a fake or emulating mode, where a CUDA call can break the process's CUDA
context (DESIGN.md 2.4; issue 57: ``set_rng_state_all`` under the fake mode, an illegal memory access on an H200).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from memlab.live.host import keep_on_host
from memlab.live.structure import trainable_parameters, unique_parameters

__all__ = ["ModelValues"]


@dataclass
class ModelValues:
    """Values of the tensors a trial can change, ``.grad`` fields and random-number state, to put back bit-exact.

    What a trial can change: trainable parameters (the optimizer steps them) and buffers (running statistics).
    Frozen parameters are never copied, so a LoRA model's base costs nothing. Copies live in CPU memory so that a
    snapshot never takes device memory from the trial it protects; ``host_bytes`` says how much they hold.

    Example:
        >>> model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
        >>> model[0].weight.requires_grad_(False)
        Parameter containing:
        tensor([...])
        >>> ModelValues.capture(model).host_bytes  # bias 16 + BatchNorm weight, bias, 2 stats 64 + count 8
        88
    """

    tensors: list[tuple[torch.Tensor, torch.Tensor]]
    grads: list[tuple[nn.Parameter, torch.Tensor | None]]
    cpu_rng: torch.Tensor | None
    cuda_rng: list[torch.Tensor] | None

    @classmethod
    def capture(cls, model: nn.Module, *, parameters: bool = True, rng: bool = True) -> ModelValues:
        """Copy the buffers, and the trainable parameters unless ``parameters=False`` (for trials that train
        adapters on a frozen base: :meth:`include_parameters` adds them when a trial needs them); with
        ``rng=False`` (a dry run's fake model) no random-number state is read, and none is put back.

        Example:
            >>> fake = ModelValues.capture(nn.Linear(2, 2), rng=False)
            >>> fake.cpu_rng is None and fake.cuda_rng is None
            True
        """
        values = cls([], [(p, p.grad) for p in unique_parameters(model)],
                     torch.random.get_rng_state() if rng else None,
                     torch.cuda.get_rng_state_all() if rng and torch.cuda.is_initialized() else None)
        keep_on_host([values.cpu_rng, *(values.cuda_rng or [])])
        values._add([*model.buffers()])
        if parameters:
            values.include_parameters(model)
        return values

    def include_parameters(self, model: nn.Module) -> None:
        """Copy the trainable parameters too, if not yet copied (call it while they hold their original values).

        Example:
            >>> model = nn.Linear(4, 4)
            >>> values = ModelValues.capture(model, parameters=False)
            >>> values.host_bytes, (values.include_parameters(model), values.host_bytes)[1]
            (0, 80)
        """
        self._add(trainable_parameters(model))

    def _add(self, tensors: Sequence[torch.Tensor]) -> None:
        seen = {id(live) for live, _ in self.tensors}
        for tensor in tensors:
            if id(tensor) in seen:
                continue
            seen.add(id(tensor))
            copy = _copy_to_cpu(tensor.detach())
            # Host memory however the model's device is (a CPU one too): memlab's trackers count it as no device's.
            keep_on_host([copy])
            self.tensors.append((tensor, copy))

    @property
    def host_bytes(self) -> int:
        """Bytes of host memory the copies hold."""
        return sum(copy.numel() * copy.element_size() for _, copy in self.tensors)

    def detach_grads(self) -> None:
        """Set every ``.grad`` to None for the trial; the user's gradient tensors are kept aside untouched."""
        for parameter, _ in self.grads:
            parameter.grad = None

    def restore(self) -> None:
        with torch.no_grad():
            for live, saved in self.tensors:
                live.copy_(saved)
        for parameter, grad in self.grads:
            parameter.grad = grad
        if self.cpu_rng is not None:
            torch.random.set_rng_state(self.cpu_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)


def _copy_to_cpu(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.device.type == "cpu":
        return tensor.clone()
    return tensor.to("cpu", copy=True)
