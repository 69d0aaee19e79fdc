"""Liger's Triton kernels run on this CPU for the tests that measure a Liger step here (no GPU, so Triton cannot
launch them): each launch with real CPU tensors is answered by a NumPy stand-in that writes what the kernel writes
into the tensors Liger's host code made, through NumPy views of their memory. NumPy's own temporaries are not torch
tensors, so a watched step counts exactly what it would on the GPU: Liger's host allocations (its outputs, what its
autograd functions save, its buffers), never a kernel's registers. Triton's interpreter (``TRITON_INTERPRET=1``)
cannot run them as written (``eps.to(tl.float32)`` on a Python float in Liger 0.8.5's RMSNorm).

Written from Liger's kernels (``liger_kernel/ops/rms_norm.py``, ``swiglu.py``, ``rope.py``, ``cross_entropy.py``,
0.6.4 and 0.8.5: their arguments are the same) for fp32 tensors; the tests check the step's values against
transformers' own layers (the stand-ins compute what the kernels compute).

Also here: the module globals Liger's ``apply_liger_kernel_to_*`` set for good, put back after a test that trains
(:func:`liger_globals_kept`).
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch._subclasses.fake_tensor import is_fake

__all__ = ["STAND_INS", "liger_globals_kept", "liger_on_cpu"]


def _view(tensor: torch.Tensor, rows: int | None = None, cols: int | None = None) -> np.ndarray:
    array = tensor.detach().numpy()
    return array.reshape(rows, cols) if rows is not None and cols is not None else array


def _rms_forward(a: dict[str, Any]) -> None:
    x = _view(a["X_ptr"])
    x = x.reshape(-1, a["n_cols"])
    y = _view(a["Y_ptr"]).reshape(x.shape)
    rstd = 1.0 / np.sqrt((x * x).mean(axis=1) + a["eps"])
    _view(a["RSTD_ptr"])[: x.shape[0]] = rstd
    normed = x * rstd[:, None]
    y[:] = normed * (a["offset"] + _view(a["W_ptr"])) if a.get("elementwise_affine", True) else normed


def _rms_backward(a: dict[str, Any]) -> None:
    n_rows, n_cols = a["n_rows"], a["n_cols"]
    dy = _view(a["dY_ptr"]).reshape(n_rows, n_cols).copy()
    x = _view(a["X_ptr"]).reshape(n_rows, n_cols)
    rstd = _view(a["RSTD_ptr"])[:n_rows][:, None]
    affine = a.get("elementwise_affine", True)  # 0.6.x: always
    w = _view(a["W_ptr"]) + a["offset"] if affine else 1.0
    m = dy * w
    dx = rstd * m - rstd * (rstd * rstd / n_cols) * (m * x).sum(axis=1, keepdims=True) * x
    _view(a["dX_ptr"]).reshape(n_rows, n_cols)[:] = dx
    if affine and a.get("COMPUTE_DW", True):
        dw = _view(a["dW_ptr"])
        per = a["rows_per_program"]
        for program in range(dw.shape[0]):
            rows = slice(program * per, min((program + 1) * per, n_rows))
            dw[program] = (dy[rows] * x[rows] * rstd[rows]).sum(axis=0)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _swiglu_forward(a: dict[str, Any]) -> None:
    n_cols = a["n_cols"]
    gate = _view(a["a_ptr"]).reshape(-1, n_cols) * a.get("gate_multiplier", 1.0)
    up = _view(a["b_ptr"]).reshape(-1, n_cols)
    _view(a["c_ptr"]).reshape(-1, n_cols)[:] = gate * _sigmoid(gate) * up


def _swiglu_backward(a: dict[str, Any]) -> None:
    n_cols, multiplier = a["n_cols"], a.get("gate_multiplier", 1.0)
    dc = _view(a["dc_ptr"]).reshape(-1, n_cols)
    gate_out, up_out = _view(a["a_ptr"]).reshape(-1, n_cols), _view(a["b_ptr"]).reshape(-1, n_cols)
    gate, up = gate_out * multiplier, up_out.copy()
    sig = _sigmoid(gate)
    silu = gate * sig
    gate_out[:] = dc * (silu * (1 - sig) + sig) * up * multiplier  # in place, as the kernel stores them
    up_out[:] = dc * silu


def _rope(a: dict[str, Any]) -> None:
    bs, sl, rd = a["bs"], a["sl"], a.get("rd", a["hd"])  # 0.6.x rotates the whole head
    half = rd // 2
    cos = _view(a["cos"]).reshape(a["cos_bs"], sl, -1)[..., :half]
    sin = _view(a["sin"]).reshape(a["cos_bs"], sl, -1)[..., :half]
    sign = -1.0 if a.get("BACKWARD_PASS", False) else 1.0
    for name, heads in (("q_ptr", a["n_qh"]), ("k_ptr", a["n_kh"])):
        x = _view(a[name]).reshape(bs, sl, heads, a["hd"])
        first, second = x[..., :half].copy(), x[..., half:rd].copy()
        c, s = cos[:, :, None, :], sign * sin[:, :, None, :]
        x[..., :half] = first * c - second * s
        x[..., half:rd] = second * c + first * s


def _cross_entropy(a: dict[str, Any]) -> None:
    """``liger_cross_entropy_kernel`` without label smoothing, softcap or z-loss: each row's loss into ``loss_ptr``
    and, where it computes the gradient, the gradient written over the logits (the kernel's in-place trick)."""
    n_cols, ignore = a["n_cols"], a["ignore_index"]
    logits = _view(a["X_ptr"]).reshape(-1, n_cols)
    targets = _view(a["Y_ptr"]).reshape(-1)[: logits.shape[0]]
    loss = _view(a["loss_ptr"]).reshape(-1)[: logits.shape[0]]
    valid = a["n_non_ignore"]
    valid = float(valid.item() if isinstance(valid, torch.Tensor) else valid)
    scale = 1.0 / valid if a.get("reduction", "mean") == "mean" else 1.0
    kept = targets != ignore
    rows = np.arange(logits.shape[0])
    safe = np.where(kept, targets, 0)
    top = logits.max(axis=1, keepdims=True)
    log_sum = top[:, 0] + np.log(np.exp(logits - top).sum(axis=1))
    loss[:] = np.where(kept, (log_sum - logits[rows, safe]) * scale, 0.0)
    if a.get("HAS_GRADIENTS", True):
        grad = np.exp(logits - log_sum[:, None])
        grad[rows, safe] -= 1.0
        logits[:] = np.where(kept[:, None], grad * scale, 0.0)


def _element_mul(a: dict[str, Any]) -> None:
    n_cols = a["n_cols"]
    scale = float(_view(a["grad_output_ptr"]).reshape(-1)[0])
    _view(a["X_ptr"]).reshape(-1, n_cols)[:] *= scale


STAND_INS: dict[str, Callable[[dict[str, Any]], None]] = {
    "_rms_norm_forward_kernel": _rms_forward,
    "_rms_norm_backward_kernel": _rms_backward,
    "_swiglu_forward_kernel": _swiglu_forward,
    "_swiglu_backward_kernel": _swiglu_backward,
    "_triton_rope": _rope,
    "liger_cross_entropy_kernel": _cross_entropy,
    "element_mul_kernel": _element_mul,
}
"""Liger's kernels a Llama or Qwen2 step launches, by name, each a NumPy stand-in taking the launch's arguments by
the kernel's parameter names."""


def _real_cpu(values: Any) -> bool:
    tensors = [value for value in values if isinstance(value, torch.Tensor)]
    return bool(tensors) and all(t.device.type == "cpu" and not t.is_meta and not is_fake(t) for t in tensors)


@contextlib.contextmanager
def liger_on_cpu(launched: list[str] | None = None) -> Iterator[None]:
    """While entered, a launch of a kernel of :data:`STAND_INS` with real CPU tensors runs its stand-in (its name
    appended to ``launched``); any other launch goes to Triton as before (a fake one to memlab's guard). Patches
    Triton's ``JITFunction.run``, which ``kernel[grid](...)`` calls."""
    from triton.runtime.jit import JITFunction

    original = vars(JITFunction)["run"]

    def run(self: Any, *args: Any, grid: Any = None, warmup: bool = False, **kwargs: Any) -> Any:
        function = getattr(self, "fn", None)
        name = getattr(function, "__name__", "")
        stand_in = STAND_INS.get(name)
        if stand_in is None or not _real_cpu((*args, *kwargs.values())):
            return original(self, *args, grid=grid, warmup=warmup, **kwargs)
        parameters = inspect.signature(function).parameters
        bound = inspect.signature(function).bind_partial(
            *args, **{key: value for key, value in kwargs.items() if key in parameters})
        bound.apply_defaults()
        if launched is not None:
            launched.append(name)
        with torch.no_grad():
            stand_in(dict(bound.arguments))
        return None

    JITFunction.run = run  # type: ignore[method-assign]
    try:
        yield
    finally:
        JITFunction.run = original  # type: ignore[method-assign]


@contextlib.contextmanager
def liger_globals_kept() -> Iterator[None]:
    """transformers' modules and ``torch.nn.functional`` as they were before, after a ``train()`` that applied Liger
    (``apply_liger_kernel_to_llama`` sets ``modeling_llama.apply_rotary_pos_emb`` and its classes for good)."""
    modules = {name: module for name, module in list(sys.modules.items()) if isinstance(module, types.ModuleType)
               and (name.startswith("transformers.") or name == "torch.nn.functional")}
    before = {name: dict(vars(module)) for name, module in modules.items()}
    try:
        yield
    finally:
        for name, module in modules.items():
            own = vars(module)
            for key in [key for key in own if key not in before[name]]:
                delattr(module, key)
            for key, value in before[name].items():
                if own.get(key, before) is not value:
                    setattr(module, key, value)
