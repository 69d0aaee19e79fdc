"""Dry runs: the memory of a training step predicted on fake tensors, without the hardware and without the weights.

``estimate`` runs one steady-state training step of a plan exactly as :func:`memlab.measure` does (the same
:class:`~memlab.runner.step.TrainingStep`, the same :class:`~memlab.measure.tracker.MemoryTracker`, the same warm-up and
baseline, through :class:`~memlab.runner.trial.TrialRunner` with a :class:`~memlab.measure.probes.FakeProbe`, which
never
reads or caps a real allocator and times nothing), but on tensors of PyTorch's ``FakeTensorMode``: they have
shapes, dtypes, devices and storages, and no data. So nothing is computed, no memory is taken, and a 7B model's
step is predicted in seconds on a laptop.

How the model gets onto fake tensors:

- a live ``nn.Module`` is copied with ``copy.deepcopy`` whose memo already maps every parameter, buffer and tensor
  attribute to a fake twin (``FakeTensorMode.from_tensor``: no data is copied; tied weights and views stay shared).
  The live model, its gradients, hooks and flags are never touched;
- a transformers config is built on the ``meta`` device (the class named in ``config.architectures``, else
  ``AutoModelForCausalLM``; fp32 weights whatever ``config.dtype`` says, as memlab trains with fp32 master weights),
  then moved onto fake tensors the same way;
- a model name is read through ``AutoConfig.from_pretrained`` (a local path to a config, a built-in shape such as
  ``"llama-7b"``, or a Hub name: from the local Hugging Face cache when it is there, else fetched when the Hub
  answers; offline, a misspelt, gated or private name fails at once, in one line).

What an estimate cannot see (each Trial's ``notes`` say so for the first point, and for the last two where they
apply):

- allocator rounding and fragmentation, kernel workspaces (memory an operator takes and gives back inside
  itself), the CUDA context, and memory held outside the step;
- values: code that reads a tensor's value (``.item()``, ``if tensor:``) reads 0 on fake tensors, so
  data-dependent branches take one side. Hugging Face models build their attention mask explicitly on fake tensors
  (they cannot see that it is all ones), a few bytes per token pair more than the real run;
- CUDA, when this PyTorch cannot reach a GPU: a ``"cuda"`` estimate then runs CPU kernels under CPU autocast rules
  (and AdamW's fused update, as the Trainer builds it on CUDA); CPU offload cannot be shown then;
- bitsandbytes, where its operators cannot run on fake tensors: its 8-bit state is then computed from its known
  size (:func:`adamw8bit_state_bytes`).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from memlab.errors import MemlabError
from memlab.estimation.adapters import attach_fake_adapter
from memlab.measure.probes import FakeProbe
from memlab.measure.tracker import CATEGORIES
from memlab.options import RunOptions
from memlab.plan import Plan, parse_budget
from memlab.report import Report, Trial
from memlab.runner.batch import Batch, LossFn
from memlab.runner.module_state import trainable_parameters
from memlab.runner.quiet import quiet
from memlab.runner.trial import TrialRunner, check_plans
from memlab.techniques.offload import NOTHING_TO_MOVE

if TYPE_CHECKING:
    from memlab.inference.plan import InferencePlan

__all__ = [
    "BLIND_SPOTS",
    "KNOWN_SHAPES",
    "adamw8bit_state_bytes",
    "estimate",
    "estimate_inference",
    "estimate_plans",
    "fake_batch",
    "load_config",
    "meta_model",
    "parse_batch_shape",
]

BLIND_SPOTS = (
    "estimated on fake tensors: allocator rounding, fragmentation, kernel workspaces, CUDA context not included"
)
_CPU_KERNELS = (
    "no CUDA here: estimated with CPU kernels and CPU autocast rules (and AdamW's fused update, as on CUDA); "
    "CUDA's attention kernels may differ"
)
_CPU_KERNELS_INFERENCE = "no CUDA here: estimated with CPU kernels; CUDA's attention kernels may differ"
_NO_OFFLOAD = "offload needs CUDA to be estimated: shown as no change"
_BNB_COMPUTED = (
    "bitsandbytes cannot run on fake tensors here: its 8-bit state is computed from its known size "
    "(2 bytes per parameter, fp32 moments below 4096 elements)"
)

# Model shapes that need no download: name -> (config class name, keyword arguments).
KNOWN_SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama-7b": (
        "LlamaConfig",
        dict(
            hidden_size=4096,
            intermediate_size=11008,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=32,
            vocab_size=32000,
        ),
    ),
    "llama-13b": (
        "LlamaConfig",
        dict(
            hidden_size=5120,
            intermediate_size=13824,
            num_hidden_layers=40,
            num_attention_heads=40,
            num_key_value_heads=40,
            vocab_size=32000,
        ),
    ),
    "llama-70b": (
        "LlamaConfig",
        dict(
            hidden_size=8192,
            intermediate_size=28672,
            num_hidden_layers=80,
            num_attention_heads=64,
            num_key_value_heads=8,
            vocab_size=32000,
        ),
    ),
    "gpt2": ("GPT2Config", {}),
}
"""Built-in shapes for ``estimate`` and ``memlab estimate`` (Llama 2 7B/13B/70B, GPT-2 small)."""

_INTEGER_NAMES = ("input_ids", "labels", "decoder_input_ids", "attention_mask", "token_type_ids", "position_ids")

# bitsandbytes' 8-bit optimizers: tensors below this many elements keep fp32 state; 8-bit state is quantized in
# blocks of this many elements, each with a float32 absmax; one 256-entry float32 map per moment is shared.
_BNB_MIN_8BIT_SIZE = 4096
_BNB_BLOCK = 256
_BNB_QMAP_BYTES = 2 * 256 * 4


# --- public API ------------------------------------------------------------------------------------------------------


def estimate(
    model_or_config: Any,
    batch: Any,
    plan: Plan | InferencePlan | None = None,
    *,
    loss_fn: LossFn | None = None,
    budget: int | str | None = None,
    lr: float = 1e-5,
    device: str | torch.device | None = None,
    gpus: int = 1,
    strategy: str = "none",
) -> Trial:
    """Predict the memory of one steady-state training step of ``plan``, on fake tensors (nothing runs for real).

    The result has the semantics of :func:`memlab.measure`: ``peak_bytes`` and a ``breakdown`` by category
    (params, grads, optimizer, activations, other) at the moment of the peak, with the optimizer state already
    there. It is a :class:`~memlab.report.Trial` with ``estimated=True``, no timings, and ``notes`` saying what an
    estimate cannot see. Against a ``budget`` it "fits" when the predicted peak is within it (``trial.fits``).

    Args:
        model_or_config: a live ``nn.Module`` (copied onto fake tensors, never touched; a model on the ``meta``
            device, such as :func:`meta_model` builds, works too), a transformers config
            (built on fake tensors, nothing downloaded), or a name: a path to a ``config.json`` or its folder, a
            built-in shape from :data:`KNOWN_SHAPES` (``"llama-7b"``), or a Hub name (the cached config, else the
            network; see :func:`load_config`).
        batch: tensors as for ``measure`` (a dict, a tensor, a tuple), or a dict of shapes such as
            ``{"input_ids": (1, 512), "labels": (1, 512)}`` (``*_ids``, ``labels`` and ``attention_mask`` are
            int64, other names float32).
        plan: the plan (default: the plain ``Plan()``).
        loss_fn: ``loss_fn(model, batch) -> scalar``, as for ``measure`` (default ``model(**batch).loss``).
        budget: bytes or a size such as ``"24GiB"``; the trial records it, and ``fits`` compares against it.
        lr: the optimizer's learning rate (it does not change memory).
        device: the device to predict for: ``"cpu"`` or ``"cuda"``. Default: the live model's device, and for a
            config, a name or a model on the meta device ``"cuda"``, even on a machine without one (the trial's
            ``device`` and notes say so).
        gpus: the number of GPUs training is sharded over (default 1); more than 1 needs a ``strategy``.
        strategy: ``"none"`` (one GPU), ``"fsdp2"``, ``"zero2"`` or ``"zero3"``: the answer is then per GPU, for
            ``batch`` as each GPU's micro-batch, as a :class:`memlab.estimation.sharded.ShardedTrial` (see
            :mod:`memlab.estimation.sharded` for how each strategy is estimated).

    An :class:`memlab.InferencePlan` estimates inference instead (one forward, or a generation, as
    ``memlab.measure`` runs it; see :func:`estimate_inference`): an :class:`~memlab.report.InferenceTrial` whose
    breakdown has the KV cache apart, and whose ``kv_cache_end_bytes`` is the cache of the context the batch
    shape gives (``{"input_ids": (rows, context)}``), plus ``new_tokens - 1`` when generating.

    Example:
        >>> from transformers import LlamaConfig
        >>> config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        ...                      num_attention_heads=2, vocab_size=256)
        >>> trial = estimate(config, {"input_ids": (2, 32), "labels": (2, 32)}, Plan(checkpointing=True),
        ...                  device="cpu", budget="64MiB")
        >>> trial.status, trial.estimated, trial.fits, sum(trial.breakdown.values()) == trial.peak_bytes
        ('ok', True, True, True)
    """
    plan = Plan() if plan is None else plan
    if _is_inference(plan):
        if isinstance(plan, (list, tuple)):
            raise MemlabError(
                "estimate takes one plan, and this is a list; write memlab.estimate(model, batch, "
                "memlab.InferencePlan(...)) for each, or estimate_plans(model, batch, [...]) for all (from "
                "memlab.estimate import estimate_plans)"
            )
        if gpus != 1 or strategy != "none":
            raise MemlabError("an InferencePlan is estimated on one device; drop gpus= and strategy=")
        inference = cast("InferencePlan", plan)
        return estimate_inference(model_or_config, batch, [inference], loss_fn=loss_fn, budget=budget,
                                  device=device)[0]
    training = cast(Plan, plan)  # anything else than a Plan is refused by estimate_plans, with what to write
    if gpus != 1 or strategy != "none":
        from memlab.estimation.sharded import check_sharding, sharded_estimate

        gpus, strategy = check_sharding(gpus, strategy)
        if strategy != "none":
            return sharded_estimate(model_or_config, batch, training, gpus=gpus, strategy=strategy, loss_fn=loss_fn,
                                    budget=budget, lr=lr, device=device)
    return estimate_plans(model_or_config, batch, [training], loss_fn=loss_fn, budget=budget, lr=lr, device=device)[0]


def estimate_plans(
    model_or_config: Any,
    batch: Any,
    plans: Sequence[Plan] | Plan | Sequence[InferencePlan] | InferencePlan,
    *,
    loss_fn: LossFn | None = None,
    budget: int | str | None = None,
    lr: float = 1e-5,
    device: str | torch.device | None = None,
) -> Report:
    """:func:`estimate` for several plans, building the fake model once: a Report of estimated Trials.

    The keywords are :func:`estimate`'s.

    A plan that fails on fake tensors is an ``"error"`` trial; the others still run.

    Example:
        >>> model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
        >>> report = estimate_plans(model, torch.randn(8, 16), [Plan(), Plan(checkpointing=True)],
        ...                         loss_fn=lambda m, b: m(b).mean())
        >>> [t.status for t in report], [t.estimated for t in report]
        (['ok', 'ok'], [True, True])
    """
    if _is_inference(plans):
        return estimate_inference(model_or_config, batch, plans, loss_fn=loss_fn, budget=budget,  # type: ignore[arg-type]
                                  device=device)
    plans = check_plans(plans)  # type: ignore[arg-type]
    options = RunOptions(loss_fn=loss_fn, lr=lr, steps=1, warmup=1)  # validates before anything is built
    limit = parse_budget(budget)
    model, fake, mode, target, kernels = _fake_setup(model_or_config, batch, device, options.verbose)
    runner = TrialRunner(model, fake, options, probe=FakeProbe(kernels, target=target))
    trials = []
    with quiet(options.verbose), mode, runner.session():
        for plan in plans:
            if plan.adapter != "none":
                trial = _adapter_trial(runner, model, plan, mode, kernels)
                trials.append(_as_estimate(trial, target, kernels, limit))
                continue
            trial = runner.run(plan)
            if trial.status == "error" and plan.optimizer in ("adamw8bit", "paged_adamw8bit"):
                trial = _computed_8bit_trial(runner, plan, trial, model)
            trials.append(_as_estimate(trial, target, kernels, limit))
    return Report(trials, budget=limit)


def estimate_inference(
    model_or_config: Any,
    batch: Any,
    plans: Sequence[InferencePlan] | InferencePlan,
    *,
    loss_fn: LossFn | None = None,
    budget: int | str | None = None,
    device: str | torch.device | None = None,
) -> Report:
    """Inference plans estimated on fake tensors: the same :class:`~memlab.inference.run.InferenceRunner` as
    ``memlab.measure`` (the same steps, tracker and categories) with a :class:`~memlab.measure.probes.FakeProbe`.

    ``batch`` may be shapes, ``{"input_ids": (rows, context)}``. Quantized weights cannot run bitsandbytes on fake
    tensors: each quantized layer holds bitsandbytes' bytes (:func:`memlab.inference.weights.quantized_bytes`)
    and makes its full weight for the product, as bitsandbytes does on CPU. ``loss_fn`` must be None (inference
    computes no loss); the other keywords are :func:`estimate`'s.

    Example:
        >>> from transformers import LlamaConfig
        >>> from memlab.inference.plan import InferencePlan
        >>> from memlab.inference.kv import kv_cache_bytes
        >>> config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        ...                      num_key_value_heads=2, vocab_size=256)
        >>> trial = estimate_inference(config, {"input_ids": (4, 1024)}, InferencePlan(weights="bf16"), device="cpu")[0]
        >>> trial.kv_cache_end_bytes == kv_cache_bytes(config, tokens=1024, batch=4, dtype="bf16"), trial.estimated
        (True, True)
    """
    from memlab.inference.run import InferenceRunner, check_inference_options, check_inference_plans

    inference_plans = check_inference_plans(plans)
    options = RunOptions(loss_fn=loss_fn, steps=1, warmup=0, noise=0)
    check_inference_options(options)
    limit = parse_budget(budget)
    model, fake, mode, target, kernels = _fake_setup(model_or_config, batch, device, options.verbose)
    runner = InferenceRunner(model, fake, options, probe=FakeProbe(kernels, target=target))
    for plan in inference_plans:
        runner.check(plan)
    trials: list[Trial] = []
    with quiet(options.verbose), mode, runner.session():
        for plan in inference_plans:
            trial = runner.run(plan)
            if plan.quantize != "none":
                trial = dataclasses.replace(trial, notes=(*trial.notes, f"{plan.quantize} weights counted from "
                                                          "bitsandbytes' layout"))
            estimated = _as_estimate(trial, target, kernels, limit)
            # The training note on CPU kernels names autocast and AdamW; inference has neither.
            notes = tuple(_CPU_KERNELS_INFERENCE if note == _CPU_KERNELS else note for note in estimated.notes)
            trials.append(dataclasses.replace(estimated, notes=notes))
    return Report(trials, budget=limit)


def _fake_setup(
    model_or_config: Any, batch: Any, device: str | torch.device | None, verbose: bool
) -> tuple[nn.Module, Any, _FakeMode, torch.device, torch.device]:
    """The fake model and batch of a dry run, the fake mode they live in, the device answered for, and the device
    whose kernels run the fake step (the CPU's when the answer is for a GPU this machine does not have)."""
    target = _target_device(model_or_config, device)
    kernels = target if target.type != "cuda" or torch.cuda.is_available() else torch.device("cpu")
    mode = _FakeMode()
    # Quiet from the start: building the model and importing bitsandbytes (for QLoRA) log too, not only the steps.
    with quiet(verbose):
        model = _fake_model(model_or_config, mode, kernels)
    return model, fake_batch(batch, mode, kernels), mode, target, kernels


def _is_inference(plans: Any) -> bool:
    from memlab.inference.plan import InferencePlan

    if isinstance(plans, InferencePlan):
        return True
    return isinstance(plans, (list, tuple)) and any(isinstance(plan, InferencePlan) for plan in plans)


def _adapter_trial(
    runner: TrialRunner, model: nn.Module, plan: Plan, mode: FakeTensorMode, device: torch.device
) -> Trial:
    """A dry run of an adapter plan: the adapters are put on the fake model here (see
    :mod:`memlab.estimation.adapters`), and the runner trains what they leave trainable."""
    try:
        undo = attach_fake_adapter(model, plan, mode, device)
    except Exception as error:  # noqa: BLE001 - reported as the plan's estimate, like any failure of a plan
        return Trial(plan, "error", 0, {c: 0 for c in CATEGORIES}, None, None, None, str(device),
                     error=f"{type(error).__name__}: {_first_line(error)}")
    try:
        trial = runner.run(plan.replace(adapter="none"))
    finally:
        undo()
    note = "4-bit weights counted from bitsandbytes' NF4 layout" if plan.adapter == "qlora" else ""
    return dataclasses.replace(trial, plan=plan, notes=(*trial.notes, *([note] if note else [])))


def fake_batch(batch: Any, mode: FakeTensorMode, device: str | torch.device = "cpu") -> Batch:
    """The batch on fake tensors of ``mode`` on ``device``: tensors are faked, shapes become fake tensors.

    A shape is a tuple, list or ``torch.Size`` of ints; its dtype comes from its name (``*_ids``, ``labels``,
    ``attention_mask``: int64; others float32).

    Example:
        >>> batch = fake_batch({"input_ids": (2, 8), "pixel_values": (2, 3, 4, 4)}, FakeTensorMode())
        >>> batch["input_ids"].dtype, tuple(batch["pixel_values"].shape)
        (torch.int64, (2, 3, 4, 4))
    """
    device = torch.device(device)

    def convert(name: str, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return _fake_tensor(value, mode, device)
        if _is_shape(value):
            dtype = torch.int64 if _is_integer_name(name) else torch.float32
            with mode:
                return torch.zeros(tuple(int(v) for v in value), dtype=dtype, device=device)
        return value

    if isinstance(batch, Mapping):
        return {key: convert(str(key), value) for key, value in batch.items()}
    if isinstance(batch, torch.Tensor):
        return _fake_tensor(batch, mode, device)
    if isinstance(batch, (tuple, list)) and not _is_shape(batch):
        values = [convert("", value) for value in batch]
        return type(batch)(*values) if hasattr(batch, "_fields") else type(batch)(values)
    raise MemlabError(
        f"a batch of type {type(batch).__name__} cannot be estimated; pass tensors, or shapes such as "
        '{"input_ids": (1, 512), "labels": (1, 512)}'
    )


def parse_batch_shape(text: str, names: Sequence[str] = ("input_ids", "labels")) -> dict[str, tuple[int, ...]]:
    """``"1x512"`` -> ``{"input_ids": (1, 512), "labels": (1, 512)}`` (rows x tokens), for the command line.

    Example:
        >>> parse_batch_shape("4x128")
        {'input_ids': (4, 128), 'labels': (4, 128)}
        >>> parse_batch_shape("4 by 128")
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: batch '4 by 128' is not ROWSxTOKENS; write for example --batch 1x512
    """
    parts = text.lower().replace("*", "x").split("x")
    try:
        shape = tuple(int(part) for part in parts)
    except ValueError:
        shape = ()
    if len(shape) != 2 or min(shape) < 1:
        raise MemlabError(f"batch {text!r} is not ROWSxTOKENS; write for example --batch 1x512")
    return {name: shape for name in names}


def load_config(name: str | os.PathLike[str]) -> Any:
    """A transformers config from a name: a path to a config (file or folder), a :data:`KNOWN_SHAPES` entry, or
    a Hub name (``AutoConfig.from_pretrained``: the cached config if there is one, else fetched; a MemlabError in
    one line, within seconds, when it cannot be had: offline, ``HF_HUB_OFFLINE=1``, misspelt, gated, private).

    Example:
        >>> load_config("llama-7b").hidden_size
        4096
    """
    import transformers

    text = os.fspath(name)
    if os.path.exists(text):
        try:
            return transformers.AutoConfig.from_pretrained(text)
        except Exception as error:  # noqa: BLE001 - any failure to read a local config is the user's to fix
            raise MemlabError(
                f"could not read a transformers config from {text} ({type(error).__name__}); "
                "pass a config.json with a model_type, or its folder"
            ) from None
    if text.lower() in KNOWN_SHAPES:
        class_name, keywords = KNOWN_SHAPES[text.lower()]
        return getattr(transformers, class_name)(**keywords)
    return _hub_config(text)


def _hub_config(name: str) -> Any:
    """The config of the Hub model ``name``: from the local Hugging Face cache when it is there, else fetched.

    Before fetching, one request with no retries and a short timeout (``HF_HUB_ETAG_TIMEOUT`` seconds if set, else
    :data:`_HUB_PROBE_TIMEOUT_S`) checks that the Hub answers for ``name``: offline (or with ``HF_HUB_OFFLINE=1``),
    misspelt, gated or private names fail at once, in one line, instead of after the Hub client's retries.
    """
    import transformers

    with contextlib.suppress(Exception):  # not in the cache (or unreadable there): ask the Hub
        return transformers.AutoConfig.from_pretrained(name, local_files_only=True)
    problem = _hub_problem(name)
    if problem is None:
        try:
            return transformers.AutoConfig.from_pretrained(name)
        except Exception as error:  # noqa: BLE001 - whatever went wrong, the remedy is the same
            problem = "offline?" if isinstance(error, OSError) else f"{type(error).__name__}: {_first_line(error)}"
    raise MemlabError(
        f"could not fetch the config of {name} ({problem}); pass a transformers config or --config path/to/config.json"
    )


_HUB_PROBE_TIMEOUT_S = 5.0
"""Seconds the Hub has to answer for a model's config.json before memlab says it is offline."""


def _hub_problem(name: str) -> str | None:
    """Why the Hub cannot give ``name``'s config.json, in a few words; None when it can (one request, no retries).

    Example:
        >>> _hub_problem("not a model name!")
        'not a Hub model name'
    """
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url, utils

    try:
        url = hf_hub_url(name, "config.json")
    except utils.HFValidationError:
        return "not a Hub model name"
    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set and it is not in the Hugging Face cache"
    timeout = float(os.environ.get("HF_HUB_ETAG_TIMEOUT") or _HUB_PROBE_TIMEOUT_S)
    try:
        get_hf_file_metadata(url, timeout=timeout)
    except utils.GatedRepoError:
        return "gated: accept its licence on the Hub and log in with `hf auth login`"
    except utils.RepositoryNotFoundError:
        return "no such model on the Hub, or a private one: check the name, or log in with `hf auth login`"
    except utils.EntryNotFoundError:
        return "it has no config.json on the Hub"
    except Exception:  # noqa: BLE001 - no network, no DNS, a timeout, offline mode, the Hub down
        return "offline?"
    return None


def _first_line(error: BaseException) -> str:
    return next((line.strip() for line in str(error).splitlines() if line.strip()), "")


def adamw8bit_state_bytes(parameters: Sequence[torch.Tensor]) -> int:
    """Bytes of ``bitsandbytes.optim.AdamW8bit`` state for ``parameters`` (what it holds after its first step).

    Tensors of 4096 elements or more keep two uint8 moments (2 bytes per element) and a float32 absmax per
    256-element block for each moment; smaller tensors keep two float32 moments (8 bytes per element). The two
    256-entry float32 quantization maps are shared by all tensors.

    Example:
        >>> adamw8bit_state_bytes([torch.empty(4096), torch.empty(10)])  # 8192 + 2 * 4 * 16 + 8 * 10 + 2048
        10448
    """
    total = 0
    quantized = False
    for parameter in parameters:
        count = parameter.numel()
        if count >= _BNB_MIN_8BIT_SIZE:
            quantized = True
            blocks = -(-count // _BNB_BLOCK)
            total += 2 * count + 2 * 4 * blocks
        else:
            total += 8 * count
    return total + (_BNB_QMAP_BYTES if quantized else 0)


# --- the dry run -----------------------------------------------------------------------------------------------------


_ONEDNN_LSTM = 2  # mkldnn_rnn_layer's mode for an LSTM
_ONEDNN_LSTM_WORKSPACE_FLOATS = 15.6
"""Floats of oneDNN's LSTM training workspace per hidden unit, time step and row (the upper end measured)."""


class _FakeMode(FakeTensorMode):
    """``FakeTensorMode`` that runs what the real kernels run where PyTorch's fake rules are stricter or blind:

    - reading a value that was never computed gives 0 instead of an error (values known to fake tensors, such as
      AdamW's step counter, are read as they are);
    - ``nonzero`` (a data-dependent shape; DeBERTa uses it) answers its largest possible result, every element
      nonzero, so the estimate leans high rather than failing;
    - ``_grouped_mm`` (mixture-of-experts layers) accepts float32, as the CPU kernel does, where its fake rule asks
      for bf16: it is computed on bf16 twins and its result has the inputs' dtype;
    - oneDNN's LSTM layer (``mkldnn_rnn_layer``) keeps a workspace for backward that its fake rule leaves empty:
      it is given the size the real kernel takes, :data:`_ONEDNN_LSTM_WORKSPACE_FLOATS` floats per hidden unit,
      time step and row (measured on torch 2.13 from 64 to 1024 hidden units: 15.0 to 15.6).
    """

    def __init__(self) -> None:
        super().__init__(allow_non_fake_inputs=True)

    def __torch_dispatch__(
        self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if func is torch.ops.aten._local_scalar_dense.default:
            tensor = args[0]
            if not (isinstance(tensor, FakeTensor) and tensor.constant is not None):
                if tensor.dtype == torch.bool:
                    return False
                return 0.0 if tensor.dtype.is_floating_point or tensor.dtype.is_complex else 0
        if func is torch.ops.aten.nonzero.default:
            tensor = args[0]
            with self:
                return torch.empty((tensor.numel(), tensor.dim()), dtype=torch.int64, device=tensor.device)
        if func is torch.ops.aten.mkldnn_rnn_layer.default and args[9] == _ONEDNN_LSTM and args[15]:
            results: tuple[torch.Tensor, ...] = super().__torch_dispatch__(func, types, args, kwargs)  # type: ignore[assignment]
            output, hidden, cell, workspace = results
            if workspace.numel() == 0:
                floats = int(_ONEDNN_LSTM_WORKSPACE_FLOATS * args[0].shape[0] * args[0].shape[1] * args[10])
                with self:
                    workspace = torch.empty(floats * 4, dtype=torch.uint8, device=workspace.device)
            return output, hidden, cell, workspace
        if func is torch.ops.aten._grouped_mm.default and args[0].dtype != torch.bfloat16:
            dtype = kwargs.get("out_dtype") or args[0].dtype
            with self:
                twins = [a.to(torch.bfloat16) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                         for a in args]
                return func(*twins, **{**kwargs, "out_dtype": None}).to(dtype)
        return super().__torch_dispatch__(func, types, args, kwargs)


def _computed_8bit_trial(runner: TrialRunner, plan: Plan, failed: Trial, model: nn.Module) -> Trial:
    """The 8-bit plan from the AdamW plan's estimate, its optimizer state replaced by the known 8-bit size."""
    adamw = runner.run(plan.replace(optimizer="adamw"))
    if adamw.status != "ok":
        return failed
    state = adamw8bit_state_bytes(trainable_parameters(model))
    breakdown = dict(adamw.breakdown)
    peak = adamw.peak_bytes - breakdown["optimizer"] + state
    breakdown["optimizer"] = state
    return dataclasses.replace(
        adamw, plan=plan, peak_bytes=peak, breakdown=breakdown, notes=(*adamw.notes, _BNB_COMPUTED)
    )


def _as_estimate(trial: Trial, target: torch.device, kernels: torch.device, budget: int | None) -> Trial:
    notes = [BLIND_SPOTS]
    if kernels != target:
        notes.append(_CPU_KERNELS)
        if getattr(trial.plan, "offload", "none") != "none":
            notes.append(_NO_OFFLOAD)
    for note in trial.notes:
        # Notes about the CPU the kernels ran on do not apply to the CUDA device the estimate is for.
        if kernels != target and (note == NOTHING_TO_MOVE or note.startswith("fp16 on CPU")):
            continue
        notes.append(note)
    return dataclasses.replace(
        trial,
        device=str(target) if kernels != target else trial.device,
        step_time_s=None,
        samples_per_s=None,
        tokens_per_s=None,
        budget=budget,
        reserved_bytes=None,
        rss_bytes=None,
        notes=tuple(dict.fromkeys(notes)),
        estimated=True,
    )


def _target_device(model_or_config: Any, device: str | torch.device | None) -> torch.device:
    if device is not None:
        target = torch.device(device)
    elif isinstance(model_or_config, nn.Module):
        target = next((p.device for p in model_or_config.parameters()), torch.device("cpu"))
        if target.type == "meta":
            target = torch.device("cuda")
    else:
        # "Will it fit before I buy the GPU" is a question about a GPU, whether or not this machine has one.
        target = torch.device("cuda")
    if target.type not in ("cpu", "cuda"):
        raise MemlabError(f"device={str(target)!r} cannot be estimated; write device='cuda' or device='cpu'")
    if target.type == "cuda" and target.index is None and torch.cuda.is_available():
        target = torch.device("cuda", torch.cuda.current_device())
    return target


# --- fake models -----------------------------------------------------------------------------------------------------


def _fake_model(model_or_config: Any, mode: FakeTensorMode, device: torch.device) -> nn.Module:
    if isinstance(model_or_config, nn.Module):
        try:
            return _fake_copy(model_or_config, mode, device)
        except MemlabError:
            raise
        except Exception as error:  # noqa: BLE001 - tensor subclasses, objects deepcopy cannot copy...
            raise MemlabError(
                f"could not copy the {type(model_or_config).__name__} onto fake tensors "
                f"({type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}); "
                "pass its transformers config (model.config) instead"
            ) from None
    if isinstance(model_or_config, (str, os.PathLike)):
        model_or_config = load_config(model_or_config)
    if _is_transformers_config(model_or_config):
        return _fake_copy(meta_model(model_or_config), mode, device)
    raise MemlabError(
        f"cannot estimate a {type(model_or_config).__name__}; pass an nn.Module, a transformers config, "
        'or a name such as "llama-7b" or a path to a config.json'
    )


def _fake_copy(model: nn.Module, mode: FakeTensorMode, device: torch.device) -> nn.Module:
    """A deep copy of ``model`` whose tensors are fake (no data copied); the model itself is not touched."""
    memo: dict[int, Any] = {}
    for module in model.modules():
        for tensor in [*module._parameters.values(), *module._buffers.values(), *vars(module).values()]:
            if isinstance(tensor, torch.Tensor) and id(tensor) not in memo:
                fake = _fake_tensor(tensor, mode, device)
                if isinstance(tensor, nn.Parameter):
                    fake = nn.Parameter(fake, requires_grad=tensor.requires_grad)
                memo[id(tensor)] = fake
    with torch.no_grad():
        return copy.deepcopy(model, memo)


def _fake_tensor(tensor: torch.Tensor, mode: FakeTensorMode, device: torch.device) -> torch.Tensor:
    """A fake twin of ``tensor`` on ``device``: same shape, strides, dtype; no data."""
    if isinstance(tensor, FakeTensor) and tensor.fake_mode is mode and tensor.device == device:
        return tensor
    detached = tensor.detach()
    if detached.device == device and not isinstance(detached, FakeTensor):
        return mode.from_tensor(detached)  # views and tied storages stay shared
    with mode:
        return torch.empty_strided(detached.size(), detached.stride(), dtype=detached.dtype, device=device)


def _is_transformers_config(value: Any) -> bool:
    return any(cls.__name__ == "PretrainedConfig" or cls.__name__ == "PreTrainedConfig" for cls in type(value).__mro__)


def meta_model(config: Any) -> nn.Module:
    """The model of a transformers config on the meta device (no memory), in fp32.

    The class is the first of ``config.architectures`` that transformers has, else ``AutoModelForCausalLM``, else
    ``AutoModel``. ``estimate`` accepts the result like any model.

    Example:
        >>> model = meta_model(load_config("llama-7b"))
        >>> type(model).__name__, model.lm_head.weight.device.type, sum(p.numel() for p in model.parameters())
        ('LlamaForCausalLM', 'meta', 6738415616)
    """
    import transformers

    if not _is_transformers_config(config):
        raise MemlabError(f"{type(config).__name__} is not a transformers config; pass one, or a name such as llama-7b")

    with torch.device("meta"):
        for name in getattr(config, "architectures", None) or ():
            cls: Any = getattr(transformers, str(name), None)
            if isinstance(cls, type) and issubclass(cls, nn.Module) and hasattr(cls, "_from_config"):
                return cls._from_config(config, dtype=torch.float32)
        try:
            return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        except ValueError:
            return transformers.AutoModel.from_config(config, dtype=torch.float32)


def _is_shape(value: Any) -> bool:
    shape = (
        isinstance(value, (tuple, list, torch.Size))
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        and len(value) > 0
    )
    if shape and min(value) < 1:
        raise MemlabError(f"shape {tuple(value)} has a size below 1; write sizes >= 1, such as (1, 512)")
    return shape


def _is_integer_name(name: str) -> bool:
    name = name.strip("'\"")
    return name in _INTEGER_NAMES or name.endswith("_ids") or name.endswith("labels") or name.endswith("_mask")
