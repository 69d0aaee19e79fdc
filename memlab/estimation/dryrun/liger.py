"""Liger Kernel in a dry run, as the installed release runs it (issue 83): a trainer's ``use_liger_kernel`` put on
the fake model the way ``trainer.train()`` puts it on the live one, and Liger's chunked losses run on fake tensors.

What ``use_liger_kernel=True`` does, read from the code memlab runs with (transformers 5.24, TRL 1.16,
liger-kernel 0.6.4 and 0.8.5):

- **transformers' Trainer** calls ``transformers.integrations.liger.apply_liger_kernel(model, liger_kernel_config)``
  at the start of ``train()`` (never in ``__init__``, so a trainer memlab is handed holds an unpatched model), which
  calls Liger's ``_apply_liger_kernel_to_instance`` on the model (a peft model's base): for a Llama or a Qwen2 it
  binds ``LigerRMSNorm.forward`` to every RMSNorm, ``LigerSwiGLUMLP.forward`` to every MLP, replaces
  ``modeling_<type>.apply_rotary_pos_emb`` (a module global) with ``liger_rotary_pos_emb``, swaps the module's
  RMSNorm and MLP classes for later instances, and, where ``fused_linear_cross_entropy`` is on (its default),
  replaces the model's ``forward`` with Liger's ``lce_forward``, whose loss goes from the hidden states through
  ``LigerFusedLinearCrossEntropyFunction``. Each kernel is an autograd function whose host code makes its outputs
  and what it saves with torch, then launches Triton.
- **TRL 1.16's** SFT, DPO, GRPO, KTO and RLOO trainers set ``fused_linear_cross_entropy`` off in their
  ``__init__`` (it would drop the fused LM head they put on the model: ``trl.trainer.utils.add_fused_lm_head``), so
  Liger brings only its layer kernels there, and the loss is TRL's own (memlab already follows it,
  :mod:`memlab.estimation.cuda.branches`). Liger's chunked losses (``LigerFusedLinearGRPOLoss``,
  ``LigerFusedLinearDPOLoss``...) are called by no TRL 1.16 trainer; TRL 0.26's GRPOTrainer called the GRPO one from
  its ``compute_liger_loss``, and a user's ``compute_loss`` may still. They are torch code that
  ``torch.compile``\\s part of itself on each call (0.8.x the loss arithmetic on log-probs, 0.6.x the whole chunk's
  forward and backward).

So a dry run does the same on its fake copy, and nothing else:

- :func:`liger_kernels` (entered around a trainer's dry runs: the trainer route, GRPO's own) reads
  ``use_liger_kernel`` and ``liger_kernel_config`` from ``trainer.args`` (a :class:`MemlabError` naming
  ``pip install liger-kernel`` where it is asked and not installed, before anything is built);
- :func:`on_fake_model` (entered by the one-device dry run around its plans, once its fake model is built) calls
  transformers' own ``apply_liger_kernel`` on that copy. What Liger changes in modules (their globals and classes)
  is put back at once, except functions such as ``apply_rotary_pos_emb``, which answer with Liger's in the dry run's
  thread only while it runs and with the model's own anywhere else (another thread's real training); Liger's kernels
  run their host code on the fake tensors, and their Triton launches are skipped and counted
  (:mod:`memlab.estimation.dryrun.triton_guard`: Liger's write only into what their host code made,
  :data:`~memlab.estimation.dryrun.triton_launches.KNOWN_KERNELS`);
- in every dry run, a ``torch.compile`` that Liger's chunked losses make returns their function uncompiled when it
  is given fake tensors (compiled code given a fake tensor reads its missing data: the process crashes), the compiled
  one otherwise. 0.8.x compiles only per-token arithmetic; 0.6.x compiles a whole chunk, which may hold less than
  it does uncompiled (inductor fuses what eager keeps): the note says so.

The figure is then the installed release's: its host code and its chunking ran. A release outside
:data:`MODELLED_LIGER` (those memlab's tests ran against watched steps) is still run as installed; the note names it
and the bound: a kernel of it that memlab's table does not know is counted by its source's bound (named in the
skipped kernels' note), so the figure is a lower bound where such a kernel takes memory of its own.

Example:
    >>> from types import SimpleNamespace
    >>> liger_asked(SimpleNamespace(args=SimpleNamespace(use_liger_kernel=False))) is None
    True
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import sys
import threading
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from memlab.errors import MemlabError
from memlab.estimation.dryrun.triton_guard import has_fake
from memlab.live.patching import patched

__all__ = [
    "MODELLED_LIGER",
    "LigerKernels",
    "LigerRun",
    "installed_liger",
    "liger_asked",
    "liger_kernels",
    "on_fake_model",
]

MODELLED_LIGER = ("0.6.4", "0.8.5")
"""The liger-kernel releases memlab's tests estimate against the same trainers' watched steps
(``tests/estimation/dryrun/test_liger.py``; 0.6.4 in a folder of its own)."""

_CHUNKED_LOSSES = "liger_kernel.chunked_loss."
"""Liger's chunked losses' modules, whose ``torch.compile`` a dry run answers (:func:`_eager_on_fakes`)."""

_state = threading.local()


@dataclass(frozen=True)
class LigerKernels:
    """What a trainer asks of Liger: ``config``, the keywords transformers passes to Liger
    (``args.liger_kernel_config``, ``{}`` for Liger's defaults), and the installed release.

    Example:
        >>> LigerKernels({"fused_linear_cross_entropy": False}, "0.8.5").modelled
        True
    """

    config: Mapping[str, Any]
    version: str

    @property
    def modelled(self) -> bool:
        return self.version in MODELLED_LIGER

    def version_note(self) -> str | None:
        """The note on a release memlab was not checked against (None for those it was)."""
        if self.modelled:
            return None
        return (f"liger-kernel {self.version} is not among the releases memlab checked ({', '.join(MODELLED_LIGER)}): "
                "its own code ran on the fake tensors as installed, but a Triton kernel of it that memlab's table "
                "does not know is counted by its source's bound, so the figure is a lower bound where such a kernel "
                "takes memory of its own")


def installed_liger() -> str | None:
    """The installed liger-kernel's version, None where it is not installed (read from its metadata: nothing is
    imported).

    Example:
        >>> installed_liger() is None or installed_liger()[0].isdigit()
        True
    """
    try:
        return importlib.metadata.version("liger-kernel")
    except importlib.metadata.PackageNotFoundError:
        return None


def liger_asked(trainer: Any) -> LigerKernels | None:
    """What ``trainer`` asks of Liger (its ``args.use_liger_kernel`` and ``liger_kernel_config``), None where it asks
    nothing.

    Raises:
        MemlabError: ``use_liger_kernel=True`` and liger-kernel is not installed (``train()`` fails there too).

    Example:
        >>> from types import SimpleNamespace
        >>> liger_asked(SimpleNamespace()) is None
        True
    """
    args = getattr(trainer, "args", None)
    if not getattr(args, "use_liger_kernel", False):
        return None
    version = installed_liger()
    if version is None:
        raise MemlabError(
            "the trainer has use_liger_kernel=True and liger-kernel is not installed, so its train() would fail "
            "(transformers applies Liger's kernels when training starts); pip install liger-kernel, or write "
            "use_liger_kernel=False in its config"
        )
    try:  # what transformers' apply_liger_kernel imports when train() starts
        import liger_kernel.transformers.monkey_patch  # noqa: F401
    except ImportError as error:
        import transformers

        raise MemlabError(
            f"the trainer has use_liger_kernel=True and liger-kernel {version} cannot patch a model under "
            f"transformers {transformers.__version__} ({type(error).__name__}: {error}), so its train() would fail "
            "the same way; pip install -U liger-kernel, or write use_liger_kernel=False in its config"
        ) from None
    return LigerKernels(dict(getattr(args, "liger_kernel_config", None) or {}), version)


@contextlib.contextmanager
def liger_kernels(trainer: Any) -> Iterator[LigerKernels | None]:
    """Within it, the one-device dry runs of this thread (:func:`on_fake_model`) put Liger's kernels on their fake
    model as ``trainer.train()`` puts them on its model, where the trainer asks for them. Nested calls keep the
    innermost trainer's ask.

    Raises:
        MemlabError: as :func:`liger_asked`, before anything is changed.

    Example:
        >>> from types import SimpleNamespace
        >>> with liger_kernels(SimpleNamespace()) as asked:
        ...     asked is None
        True
    """
    asked = liger_asked(trainer)
    before = getattr(_state, "asked", None)
    _state.asked = asked
    try:
        yield asked
    finally:
        _state.asked = before


@dataclass
class LigerRun:
    """What :func:`on_fake_model` did in one dry run: the kernels put on (``patched``: Liger's class name and how
    many modules, ``replaced``: module globals answered with Liger's), the release, and the compiled functions of
    Liger's chunked losses that ran uncompiled on fake tensors (``uncompiled``, as they run); :attr:`notes` says
    it."""

    asked: LigerKernels | None = None
    patched: dict[str, int] = field(default_factory=dict)
    replaced: list[str] = field(default_factory=list)
    uncompiled: set[str] = field(default_factory=set)

    @property
    def notes(self) -> tuple[str, ...]:
        said: list[str] = []
        if self.asked is not None:
            config = ", ".join(f"{key}={value}" for key, value in sorted(self.asked.config.items())) or "its defaults"
            # names, not counts: a model whose layers repeat is dry-run at a few layers and carried to all of them
            kernels = sorted(self.patched) + self.replaced
            said.append(f"use_liger_kernel: liger-kernel {self.asked.version}'s kernels put on the model as train() "
                        f"puts them ({config}): {', '.join(kernels) or 'none for this model type'}; their host code "
                        "ran on the fake tensors and their Triton launches were counted from it")
            version = self.asked.version_note()
            if version:
                said.append(version)
        if self.uncompiled:
            ran = ", ".join(sorted(self.uncompiled))
            said.append(f"Liger's chunked losses ran uncompiled on the fake tensors ({ran}: their torch.compile "
                        "cannot run on them): 0.8.x compiles only per-token arithmetic; where a "
                        "release compiles a whole chunk (0.6.x), the compiled chunk may hold less than this (inductor "
                        "fuses what eager keeps)")
        return tuple(said)


@contextlib.contextmanager
def on_fake_model(model: nn.Module) -> Iterator[LigerRun]:
    """Within it, ``model`` (a dry run's fake copy) runs Liger's kernels as the trainer of :func:`liger_kernels`
    asks (nothing where none is asked in this thread), and Liger's chunked losses run on fake tensors
    (:func:`_eager_on_fakes`). The module globals Liger replaces answer with Liger's in this thread only, and
    everything is put back after; the instance patches stay on the copy, which the dry run drops.

    Example:
        >>> with on_fake_model(nn.Linear(2, 2)) as run:
        ...     run.asked is None, run.patched
        (True, {})
    """
    run = LigerRun(asked=getattr(_state, "asked", None))
    with contextlib.ExitStack() as stack:
        if run.asked is not None:
            replaced = stack.enter_context(_applied(model, run.asked.config))
            run.patched = _patched_modules(model)
            run.replaced = [f"{name} -> {getattr(liger, '__name__', name)}" for name, liger in replaced.items()]
        stack.enter_context(_eager_on_fakes(run.uncompiled))
        _state.depth = getattr(_state, "depth", 0) + 1
        stack.callback(_leave)
        yield run


def _leave() -> None:
    _state.depth -= 1


def _in_dry_run() -> bool:
    return getattr(_state, "depth", 0) > 0


@contextlib.contextmanager
def _applied(model: nn.Module, config: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """transformers' ``apply_liger_kernel`` on ``model``, as ``Trainer.train()`` calls it; the module globals it
    changed put back, except functions, which dispatch by thread while entered (yielded: their names and Liger's)."""
    import liger_kernel.transformers  # noqa: F401 - imported before the snapshot: its imports are not its patches
    from transformers.integrations.liger import apply_liger_kernel

    modules = _patchable_modules()
    before = {name: dict(vars(module)) for name, module in modules.items()}
    try:
        apply_liger_kernel(model, dict(config))
    except BaseException:
        for (module_name, name), (original, _liger) in _changed_globals(modules, before).items():
            _put_back(modules[module_name], name, original)
        raise
    changed = _changed_globals(modules, before)
    functions: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        for (module_name, name), (original, liger) in changed.items():
            module = modules[module_name]
            if isinstance(liger, types.FunctionType) and callable(original):
                stack.enter_context(_dispatching(module, name, original, liger))
                functions[f"{module_name.rsplit('.', 1)[-1]}.{name}"] = liger
            else:  # a class swapped for later instances: the copy's are made
                _put_back(module, name, original)
        yield functions


def _put_back(module: types.ModuleType, name: str, original: Any) -> None:
    if original is _ABSENT:
        delattr(module, name)
    else:
        setattr(module, name, original)


_ABSENT = object()


def _patchable_modules() -> dict[str, types.ModuleType]:
    """The modules whose globals Liger's ``apply_liger_kernel_to_*`` functions set: transformers' (the modeling
    modules' functions and classes, ``transformers.loss``) and ``torch.nn.functional`` (``cross_entropy=True``)."""
    return {name: module for name, module in list(sys.modules.items())
            if isinstance(module, types.ModuleType)
            and (name.startswith("transformers.") or name == "torch.nn.functional")}


def _changed_globals(modules: Mapping[str, types.ModuleType], before: Mapping[str, Mapping[str, Any]]
                     ) -> dict[tuple[str, str], tuple[Any, Any]]:
    changed: dict[tuple[str, str], tuple[Any, Any]] = {}
    for module_name, module in modules.items():
        old, now = before[module_name], vars(module)
        for name in set(old) | set(now):
            was, value = old.get(name, _ABSENT), now.get(name, _ABSENT)
            if was is not value and value is not _ABSENT:
                changed[(module_name, name)] = (was, value)
    return changed


_dispatch_lock = threading.Lock()
_dispatchers: dict[tuple[int, str], list[Any]] = {}
"""Each module global answered by thread: [its original, the dispatcher set, how many dry runs hold it]."""


@contextlib.contextmanager
def _dispatching(module: types.ModuleType, name: str, original: Any, liger: Any) -> Iterator[None]:
    """``module.name`` answering with ``liger`` in a thread inside :func:`on_fake_model` and with ``original``
    anywhere else, until the last dry run holding it leaves."""
    key = (id(module), name)
    with _dispatch_lock:
        held = _dispatchers.get(key)
        if held is None:

            @functools.wraps(original)
            def dispatched(*args: Any, **kwargs: Any) -> Any:
                return (liger if _in_dry_run() else original)(*args, **kwargs)

            held = _dispatchers[key] = [original, dispatched, 0]
        held[2] += 1
        setattr(module, name, held[1])
    try:
        yield
    finally:
        with _dispatch_lock:
            held[2] -= 1
            if held[2] == 0:
                del _dispatchers[key]
                setattr(module, name, held[0])


def _patched_modules(model: nn.Module) -> dict[str, int]:
    """Liger's class names the copy's modules now answer to (``_get_name`` bound by Liger's patch), counted."""
    counts: dict[str, int] = {}
    for module in model.modules():
        own = vars(module).get("_get_name")
        if own is not None:
            name = str(own())
            if name.startswith("Liger"):
                counts[name] = counts.get(name, 0) + 1
    return counts


@contextlib.contextmanager
def _eager_on_fakes(uncompiled: set[str]) -> Iterator[None]:
    """While entered, each loaded module of Liger's chunked losses sees a ``torch`` whose ``compile`` returns a
    function that runs uncompiled when given a fake tensor (its name added to ``uncompiled``) and compiled otherwise
    (every release makes its ``torch.compile`` inside the loss's forward, through its module's ``torch``)."""
    losses = [module for name, module in list(sys.modules.items())
              if name.startswith(_CHUNKED_LOSSES) and isinstance(getattr(module, "torch", None), types.ModuleType)]
    with contextlib.ExitStack() as stack:
        for module in losses:
            stack.enter_context(patched(module, torch=_TorchEagerOnFakes(module.torch, uncompiled)))
        yield


class _TorchEagerOnFakes(types.ModuleType):
    """``torch`` as Liger's chunked losses see it in a dry run: the module itself but for ``compile``."""

    def __init__(self, torch_module: types.ModuleType, uncompiled: set[str]) -> None:
        super().__init__(torch_module.__name__)
        self._torch = torch_module
        self._uncompiled = uncompiled

    def __getattr__(self, name: str) -> Any:
        return getattr(self._torch, name)

    def compile(self, function: Callable[..., Any] | None = None, **options: Any) -> Any:
        if function is None:  # used as @torch.compile(...)
            return lambda inner: self.compile(inner, **options)
        compiled = self._torch.compile(function, **options)
        inner = getattr(function, "func", function)  # 0.8.x compiles a functools.partial
        name = str(getattr(function, "__name__", None) or getattr(inner, "__name__", "a loss"))

        @functools.wraps(function)
        def eager_on_fakes(*args: Any, **kwargs: Any) -> Any:
            if has_fake((*args, *kwargs.values())):
                self._uncompiled.add(name)
                return function(*args, **kwargs)
            return compiled(*args, **kwargs)

        return eager_on_fakes
