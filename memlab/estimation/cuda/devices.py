"""The device an estimate answers for, and the device whose kernels run its dry run: the CPU's when the estimate is
for a GPU this machine does not have (the CUDA emulation of this package then makes the CPU's kernels keep what
CUDA's would).

Example:
    >>> target_device(nn.Linear(2, 2), "cpu"), kernels_device(torch.device("cpu"))
    (device(type='cpu'), device(type='cpu'))
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from memlab.errors import MemlabError

__all__ = ["asked_device", "kernels_device", "target_device"]


def target_device(model_or_config: Any, device: str | torch.device | None) -> torch.device:
    """The device an estimate answers for: ``device`` when given, else the live model's (``"cuda"`` for a model on
    the meta device), else ``"cuda"`` for a config or a name: "will it fit before I buy the GPU" is a question
    about a GPU, whether or not this machine has one.

    Example:
        >>> target_device(nn.Linear(2, 2), None), target_device("gpt2", "cpu")
        (device(type='cpu'), device(type='cpu'))
    """
    if device is not None:
        target = torch.device(device)
    elif isinstance(model_or_config, nn.Module):
        target = next((p.device for p in model_or_config.parameters()), torch.device("cpu"))
        if target.type == "meta":
            target = torch.device("cuda")
    else:
        target = torch.device("cuda")
    if target.type not in ("cpu", "cuda"):
        raise MemlabError(f"device={str(target)!r} cannot be estimated; write device='cuda' or device='cpu'")
    if target.type == "cuda" and target.index is None and torch.cuda.is_available():
        target = torch.device("cuda", torch.cuda.current_device())
    return target


def asked_device(gpu: Any, device: str | torch.device | None) -> str | torch.device | None:
    """The device an estimate is asked for: a GPU kind named (``gpu=``) asks for a CUDA estimate wherever the model
    is, so ``device`` defaults to ``"cuda"`` with it; a ``device`` given is kept (``device="cpu"`` estimates for the
    CPU, as memlab's own CPU searches ask with the kind their budget caps).

    Example:
        >>> asked_device("A100-40GB", None), asked_device(None, None), asked_device("A100-40GB", "cpu")
        ('cuda', None, 'cpu')
    """
    return "cuda" if gpu is not None and device is None else device


def kernels_device(target: torch.device) -> torch.device:
    """The device whose kernels run the fake step for ``target``: the CPU's when ``target`` is a GPU this machine
    does not have.

    Example:
        >>> kernels_device(torch.device("cpu"))
        device(type='cpu')
    """
    return target if target.type != "cuda" or torch.cuda.is_available() else torch.device("cpu")
