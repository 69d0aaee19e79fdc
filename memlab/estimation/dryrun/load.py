"""The load: how the user's own ``from_pretrained`` materialises the weights, made on a dry run's fake model before
anything of the step is placed on the (modelled) GPU.

No user loads a 7B model in fp32 to cast it afterwards: they write ``from_pretrained(name, dtype=torch.bfloat16)``,
let transformers 5 load the checkpoint's own dtype, or pass a ``BitsAndBytesConfig``. A dry run of a config or a name
builds the model's shapes in fp32 (:func:`memlab.estimation.configs.meta_model`); :func:`apply_load` then gives the
fake weights the dtypes and layouts that load gives them, so that the allocated peak, the reserve and the card figure
are those of the user's run:

- ``dtype`` (``torch_dtype`` before transformers 5, accepted too): every floating parameter in that dtype, but the
  model's ``_keep_in_fp32_modules`` under fp16 and its ``_keep_in_fp32_modules_strict`` under fp16 or bf16, as
  transformers keeps them; buffers keep the dtype the model's code gives them (a rotary ``inv_freq`` stays fp32);
  ``"auto"`` is the dtype the config records for the checkpoint, else fp32. Without a dtype, the installed
  transformers' default (:func:`default_dtype`): ``"auto"`` since transformers 5; fp32 before (fp16 with a
  bitsandbytes quantization, as its quantizer sets it);
- ``quantization_config`` (a ``BitsAndBytesConfig`` or its dict): ``load_in_4bit`` puts in 4-bit the layers
  transformers' bitsandbytes integration replaces (:func:`memlab.techniques.adapters.quantized_targets`: every
  ``nn.Linear`` and GPT-2-style ``Conv1D`` but the output head, the tied and last modules, the
  ``_keep_in_fp32_modules`` and the ``llm_int8_skip_modules``; ``bnb_4bit_quant_type`` NF4 or FP4: the same bytes;
  ``bnb_4bit_use_double_quant``; computing in ``bnb_4bit_compute_dtype``), laid out as bitsandbytes holds it
  (:class:`~memlab.estimation.dryrun.adapters.FakeNF4Linear`); ``load_in_8bit`` in LLM.int8
  (:class:`~memlab.estimation.dryrun.adapters.FakeInt8Linear`).

Without ``load=`` (or with ``load={}``), the load is the one the plan implies (:func:`implied_load`):
``weights="bf16"`` loads in bf16, ``adapter="qlora"`` loads with ``BitsAndBytesConfig(load_in_4bit=True,
bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_use_double_quant=True)`` and the rest in
bf16 with ``weights="bf16"``, else as transformers loads it by default, anything else as transformers loads it by
default. A live model (a meta model
too) is already loaded: it is estimated as it is, with its own dtypes, quantized layers, adapters and attention
implementation, and ``load=`` is refused for it unless it is on the meta device (its shapes, loaded as ``load=``
says).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from memlab.errors import MemlabError
from memlab.estimation.configs import (
    checkpoint_dtype,
    dtype_keyword,
    is_transformers_config,
    load_config,
    transformers_version,
)
from memlab.estimation.dryrun.adapters import FakeInt8Linear, FakeNF4Linear
from memlab.live.structure import ModuleStructure
from memlab.plan import Plan
from memlab.techniques.adapters import quantized_targets

__all__ = ["DTYPES", "Load", "apply_load", "default_dtype", "implied_load", "model_on_meta", "parse_load", "plan_loads",
           "staging_bytes", "staging_note"]

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}
"""The dtype names ``load=`` and the command line accept, as torch and transformers spell them and as memlab does."""

_DTYPE_CODE = {torch.float32: "torch.float32", torch.bfloat16: "torch.bfloat16", torch.float16: "torch.float16"}
_KEYS = ("dtype", "torch_dtype", "quantization_config")
_QUANTIZATION_KEYS = (
    "load_in_4bit", "load_in_8bit", "bnb_4bit_quant_type", "bnb_4bit_compute_dtype", "bnb_4bit_use_double_quant",
    "llm_int8_skip_modules", "bnb_4bit_quant_storage", "quant_method", "llm_int8_threshold",
    "llm_int8_enable_fp32_cpu_offload", "llm_int8_has_fp16_weight", "_load_in_4bit", "_load_in_8bit",
)

Undo = Callable[[], None]


@dataclass(frozen=True)
class Load:
    """How the weights are loaded: ``dtype`` (None: ``"auto"``, the dtype the config records, else fp32),
    ``quantize`` (``"none"``, ``"nf4"``, ``"fp4"`` or ``"int8"``), the 4-bit ``compute_dtype`` and ``double_quant``,
    the ``skip_modules`` kept unquantized (None: transformers' own choice only), whether the user gave it
    (``given``) or the plan implied it, and whether the dtype is the installed transformers' default
    (``default``: no dtype written).

    Example:
        >>> print(Load(torch.bfloat16).code())
        from_pretrained(name, dtype=torch.bfloat16)
    """

    dtype: torch.dtype | None = torch.float32
    quantize: str = "none"
    compute_dtype: torch.dtype = torch.float32
    double_quant: bool = False
    skip_modules: tuple[str, ...] | None = None
    given: bool = False
    default: bool = False

    def code(self) -> str:
        """The ``from_pretrained`` call that loads this way, as the user writes it (``dtype=``, or ``torch_dtype=``
        for a transformers before 4.56)."""
        written = None if self.default else "\"auto\"" if self.dtype is None else _DTYPE_CODE[self.dtype]
        words = [] if written is None else [f"{dtype_keyword()}={written}"]
        if self.quantize in ("nf4", "fp4"):
            config = (f'load_in_4bit=True, bnb_4bit_quant_type="{self.quantize}", '
                      f"bnb_4bit_compute_dtype={_DTYPE_CODE[self.compute_dtype]}, "
                      f"bnb_4bit_use_double_quant={self.double_quant}")
        elif self.quantize == "int8":
            config = "load_in_8bit=True"
        else:
            config = ""
        if config and self.skip_modules:
            config += f", llm_int8_skip_modules={list(self.skip_modules)}"
        if config:
            words.append(f"quantization_config=BitsAndBytesConfig({config})")
        return f"from_pretrained(name, {', '.join(words)})" if words else "from_pretrained(name)"

    def staging_bytes(self, model: nn.Module) -> int:
        """:func:`staging_bytes` of this load: the most host memory it needs at once on the way to the GPU."""
        return staging_bytes(model, self)

    def staging_note(self) -> str:
        """:func:`staging_note` of this load."""
        return staging_note(self)

    def note(self, loaded: torch.dtype | None = None) -> str:
        """What an estimate says of the load it assumed; ``loaded``: the dtype it gave the weights not quantized,
        said where the call leaves it to transformers (``"auto"``, or its default)."""
        whose = "the load given (load=)" if self.given else "the load the plan implies"
        how = ""
        if loaded is not None and (self.default or self.dtype is None):
            version = ".".join(str(part) for part in transformers_version())
            which = "the weights not quantized" if self.quantize != "none" else "the weights"
            how = f" (transformers {version}: {which} in {_DTYPE_CODE.get(loaded, str(loaded))})"
        return f"weights materialised as {self.code()} loads them{how}: {whose}"


def default_dtype(quantized: bool = False) -> torch.dtype | None:
    """The dtype the installed transformers' ``from_pretrained`` gives weights when no dtype is written: None
    (``"auto"``: the checkpoint's own, as its config records it) since transformers 5; before, fp32, or fp16 with a
    bitsandbytes quantization (its quantizer's ``update_dtype``).

    Example:
        >>> default_dtype() is None  # transformers 5
        True
    """
    if transformers_version() >= (5, 0):
        return None
    return torch.float16 if quantized else torch.float32


def implied_load(plan: Plan) -> Load:
    """The load a plan implies when the user says none: ``weights="bf16"`` loads in bf16 (with ``adapter="qlora"``
    the weights not quantized, as its name says), ``adapter="qlora"`` 4-bit NF4 (double quantization, computing in
    bf16, or in fp16 where the plan autocasts in fp16),
    anything else as transformers loads it by default (:func:`default_dtype`).

    Example:
        >>> implied_load(Plan(weights="bf16")).dtype, implied_load(Plan(adapter="qlora")).quantize
        (torch.bfloat16, 'nf4')
        >>> print(implied_load(Plan()).code())
        from_pretrained(name)
        >>> implied_load(Plan(weights="bf16", adapter="qlora")).dtype
        torch.bfloat16
        >>> implied_load(Plan(precision="fp16", adapter="qlora")).compute_dtype  # a T4's QLoRA
        torch.float16
    """
    bf16 = plan.weights == "bf16"
    if plan.adapter == "qlora":  # computing in the plan's autocast dtype: fp16 where it autocasts in fp16 (a T4)
        compute = torch.float16 if getattr(plan, "precision", None) == "fp16" else torch.bfloat16
        return Load(torch.bfloat16 if bf16 else default_dtype(quantized=True), "nf4", compute,
                    double_quant=True, default=not bf16)
    if bf16:
        return Load(torch.bfloat16)
    return Load(default_dtype(), default=True)


def parse_load(load: Mapping[str, Any] | None, plan: Plan | None) -> Load:
    """The :class:`Load` of ``load`` (the keyword arguments the user passes to ``from_pretrained``: ``dtype``, or
    ``torch_dtype`` as before transformers 5, ``quantization_config`` as a ``BitsAndBytesConfig`` or its dict) for
    ``plan``; the plan's :func:`implied_load` when None or empty. Without a dtype the weights not quantized get the
    installed transformers' default (:func:`default_dtype`). Bad values and loads the plan cannot train raise a
    MemlabError saying what to write.

    Example:
        >>> load = parse_load({"dtype": "bfloat16", "quantization_config": {"load_in_4bit": True}},
        ...                   Plan(adapter="lora"))
        >>> load.dtype, load.quantize, load.compute_dtype, load.double_quant
        (torch.bfloat16, 'fp4', torch.float32, False)
    """
    if load is not None and not isinstance(load, Mapping):
        raise MemlabError(
            f"load={load!r} is not a dict; write the from_pretrained keywords you use, e.g. "
            "load={'dtype': torch.bfloat16} or load={'quantization_config': BitsAndBytesConfig(...)}"
        )
    if not load:
        return implied_load(plan or Plan())
    unknown = [key for key in load if key not in _KEYS]
    if unknown:
        raise MemlabError(
            f"load= has {unknown[0]!r}, which does not change memory; write only dtype (or torch_dtype) and "
            "quantization_config, e.g. load={'dtype': torch.bfloat16}"
        )
    if "torch_dtype" in load and "dtype" in load:
        raise MemlabError("load= has both torch_dtype and dtype; write one of them (dtype)")
    name = "torch_dtype" if "torch_dtype" in load else "dtype"
    dtype = _dtype(load.get(name), name, auto=True)
    config = _quantization(load.get("quantization_config"))
    four = bool(config.get("load_in_4bit") or config.get("_load_in_4bit"))
    eight = bool(config.get("load_in_8bit") or config.get("_load_in_8bit"))
    if four and eight:
        raise MemlabError("quantization_config has load_in_4bit and load_in_8bit; write one of them")
    quantize = "none"
    if four:
        quantize = str(config.get("bnb_4bit_quant_type") or "fp4")
        if quantize not in ("nf4", "fp4"):
            raise MemlabError(f"bnb_4bit_quant_type={quantize!r} is not one bitsandbytes has; write 'nf4' or 'fp4'")
    elif eight:
        quantize = "int8"
    skip = config.get("llm_int8_skip_modules")
    if skip is not None and (isinstance(skip, str) or not all(isinstance(name, str) for name in skip)):
        raise MemlabError(f"llm_int8_skip_modules={skip!r}; write a list of module names, e.g. ['lm_head']")
    written = "torch_dtype" in load or "dtype" in load
    parsed = Load(
        dtype if written else default_dtype(quantized=quantize != "none"),
        quantize,
        _dtype(config.get("bnb_4bit_compute_dtype"), "bnb_4bit_compute_dtype") or torch.float32,
        bool(config.get("bnb_4bit_use_double_quant", False)),
        None if skip is None else tuple(skip),
        given=True,
        default=not written,
    )
    if plan is not None:  # None: an inference plan, which trains nothing
        _check_with_plan(parsed, plan)
    return parsed


def _dtype(value: Any, name: str, auto: bool = False) -> torch.dtype | None:
    if value is None or (auto and value == "auto"):
        return None
    if isinstance(value, torch.dtype):
        if value in _DTYPE_CODE:
            return value
    elif isinstance(value, str) and value.removeprefix("torch.") in DTYPES:
        return DTYPES[value.removeprefix("torch.")]
    raise MemlabError(
        f"{name}={value!r} is not a dtype memlab estimates; write dtype=torch.bfloat16, torch.float16 or "
        "torch.float32" + (" (or 'auto')" if auto else "")
    )


def _quantization(config: Any) -> dict[str, Any]:
    if config is None:
        return {}
    if not isinstance(config, Mapping):
        if type(config).__name__ != "BitsAndBytesConfig":
            raise MemlabError(
                f"quantization_config is a {type(config).__name__}; memlab estimates bitsandbytes' loads: write a "
                "BitsAndBytesConfig(load_in_4bit=True, ...) or its dict"
            )
        config = {key: getattr(config, key) for key in _QUANTIZATION_KEYS if hasattr(config, key)}
    unknown = [key for key in config if key not in _QUANTIZATION_KEYS]
    if unknown:
        raise MemlabError(
            f"quantization_config has {unknown[0]!r}; write BitsAndBytesConfig's keywords, such as load_in_4bit, "
            "bnb_4bit_quant_type, bnb_4bit_compute_dtype, bnb_4bit_use_double_quant, llm_int8_skip_modules"
        )
    if config.get("quant_method") not in (None, "bitsandbytes"):
        raise MemlabError(f"quant_method={config['quant_method']!r}: memlab estimates bitsandbytes' loads only; "
                          "write a BitsAndBytesConfig")
    return dict(config)


def _check_with_plan(load: Load, plan: Plan) -> None:
    if load.quantize != "none" and plan.adapter == "none":
        raise MemlabError(
            f"a model loaded in {load.quantize} trains adapters only; write adapter='lora' (peft on the quantized "
            "base) or adapter='qlora', or a load without quantization_config"
        )
    if plan.adapter == "qlora" and load.quantize == "int8":
        raise MemlabError(
            "adapter='qlora' holds the base in 4-bit, and this load is load_in_8bit; write adapter='lora' for LoRA "
            "on the 8-bit base, or load_in_4bit=True"
        )


def load_dtype(model: nn.Module, load: Load) -> torch.dtype:
    """The dtype ``load`` gives ``model``'s unquantized weights: its own, or for ``"auto"`` the config's, else fp32.

    Example:
        >>> load_dtype(nn.Linear(2, 2), Load(None))
        torch.float32
    """
    if load.dtype is not None:
        return load.dtype
    named = checkpoint_dtype(getattr(model, "config", None))
    return named if named in _DTYPE_CODE else torch.float32


def apply_load(model: nn.Module, load: Load, mode: Any, device: torch.device) -> Undo:
    """Give the fake ``model`` the dtypes and quantized layers ``load`` gives it (see the module's docstring); the
    returned function puts the model back as it was. ``mode`` is the fake mode of the model's tensors and ``device``
    their device.

    Example:
        >>> from memlab.estimation.dryrun.fake import FakeMode, fake_copy
        >>> mode = FakeMode()
        >>> model = fake_copy(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2)), mode, torch.device("cpu"))
        >>> undo = apply_load(model, Load(torch.bfloat16), mode, torch.device("cpu"))
        >>> model[0].weight.dtype, undo(), model[0].weight.dtype
        (torch.bfloat16, None, torch.float32)
    """
    dtype = load_dtype(model, load)
    structure = ModuleStructure.capture(model)
    kept: list[tuple[torch.Tensor, torch.Tensor]] = []

    from memlab.inference.weights import HELD_AS_LOADED  # here: inference builds on the estimation's runner

    def undo() -> None:
        for tensor, original in reversed(kept):
            tensor.data = original
        kept.clear()
        structure.restore()
        vars(model).pop(HELD_AS_LOADED, None)

    try:
        keep = _kept_in_fp32(model, dtype, load.quantize != "none")
        seen: set[int] = set()
        for name, module in model.named_modules():
            target = torch.float32 if any(f".{k}." in f".{name}." for k in keep) else dtype
            for tensor in module._parameters.values():
                if tensor is None or id(tensor) in seen or not tensor.is_floating_point() or tensor.dtype == target:
                    continue
                seen.add(id(tensor))
                kept.append((tensor, tensor.data))
                with mode:
                    tensor.data = tensor.data.to(target)
        if load.quantize != "none":
            _quantize(model, load, mode, device, keep)
        setattr(model, HELD_AS_LOADED, True)
    except BaseException:
        undo()
        raise
    return undo


def model_on_meta(model_or_config: Any, /, **load: Any) -> nn.Module:
    """The model of a config (or a name, as :func:`memlab.estimation.configs.load_config` reads it, or the config of
    a model on the meta device) built on the meta device as ``from_pretrained(name, **load)`` would load it, with no
    memory and nothing downloaded but the config: every weight in the dtype the load gives it (``dtype``, or
    ``torch_dtype``; the modules transformers keeps in fp32 kept so), and for a ``quantization_config``
    (``BitsAndBytesConfig(load_in_4bit=True, ...)`` or ``load_in_8bit``) transformers' own quantizer puts
    bitsandbytes' layers in place of the layers it quantizes, as ``from_pretrained`` does before it reads a weight,
    and marks the model loaded so (``is_loaded_in_4bit``, ``hf_quantizer``). peft, TRL and transformers then treat
    it as the quantized model the load gives them (TRL casts a 4-bit model's adapters to bf16 itself), and
    :func:`memlab.trainer_on_meta` builds a trainer around it for :func:`memlab.estimate`. A model given is never
    changed: its config is built again. Bad keywords are one MemlabError saying what to write.

    Example:
        >>> import torch
        >>> from transformers import BitsAndBytesConfig, LlamaConfig
        >>> config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
        ...                      vocab_size=128)
        >>> policy = model_on_meta(config, dtype=torch.float16,
        ...                        quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4"))
        >>> type(policy.model.layers[0].mlp.up_proj).__name__, policy.is_loaded_in_4bit, policy.lm_head.weight.dtype
        ('Linear4bit', True, torch.float16)
    """
    from memlab.estimation.configs import meta_model

    parsed = parse_load(load, None)
    if isinstance(model_or_config, nn.Module):
        if not _on_meta(model_or_config):
            raise MemlabError(f"this {type(model_or_config).__name__} is already loaded (its weights are in memory); "
                              "build its trainer as usual and estimate it, or pass its config: "
                              "memlab.model_on_meta(model.config, **load)")
        model_or_config = getattr(model_or_config, "config", None)
        if model_or_config is None:
            raise MemlabError("model_on_meta builds a transformers model from its config, and this module has none; "
                              "pass a config or a model name")
    config = model_or_config if is_transformers_config(model_or_config) else load_config(model_or_config)
    model = meta_model(config)
    dtype = loaded_dtype(config, parsed)
    keep = _kept_in_fp32(model, dtype, parsed.quantize != "none")
    for name, module in model.named_modules():
        target = torch.float32 if any(f".{k}." in f".{name}." for k in keep) else dtype
        for parameter in module._parameters.values():
            if parameter is not None and parameter.is_floating_point() and parameter.dtype != target:
                parameter.data = parameter.data.to(target)
    model.config.dtype = dtype  # as from_pretrained records it
    if parsed.quantize != "none":
        _quantize_on_meta(model, load["quantization_config"], dtype)
    return model


def _quantize_on_meta(model: nn.Module, quantization_config: Any, dtype: torch.dtype) -> None:
    """transformers' bitsandbytes quantizer on a model on the meta device, as ``from_pretrained`` runs it around the
    weights it reads (which a meta model never has): its layers replaced, the model marked quantized."""
    from transformers import BitsAndBytesConfig
    from transformers.quantizers import AutoHfQuantizer

    if isinstance(quantization_config, Mapping):
        quantization_config = BitsAndBytesConfig(**quantization_config)
    quantizer = AutoHfQuantizer.from_config(quantization_config, pre_quantized=False)
    quantizer.preprocess_model(model=model, dtype=dtype, device_map=None)
    if not any(type(module).__module__.startswith("bitsandbytes") for module in model.modules()):
        bits = "4-bit" if getattr(quantization_config, "load_in_4bit", False) else "8-bit"
        raise MemlabError(f"a {bits} load quantizes no layer of this {type(model).__name__} (bitsandbytes replaces "
                          "linear layers, and transformers keeps its head and skip modules out); drop "
                          "quantization_config and train it as it is, or with LoRA adapters on it")
    model.hf_quantizer = quantizer
    quantizer.postprocess_model(model)


def _kept_in_fp32(model: nn.Module, dtype: torch.dtype, quantized: bool) -> set[str]:
    """The modules transformers keeps in fp32 for ``dtype``: ``_keep_in_fp32_modules`` under fp16 (and, before
    transformers 5, when quantizing), ``_keep_in_fp32_modules_strict`` under fp16 and bf16."""
    keep: set[str] = set()
    if dtype == torch.float16 or (quantized and transformers_version() < (5, 0)):
        keep |= set(getattr(model, "_keep_in_fp32_modules", None) or ())
    if dtype in (torch.float16, torch.bfloat16):
        keep |= set(getattr(model, "_keep_in_fp32_modules_strict", None) or ())
    return keep


def _quantize(model: nn.Module, load: Load, mode: Any, device: torch.device, keep: set[str]) -> None:
    for name in quantized_targets(model, load.skip_modules):
        if any(f".{k}." in f".{name}." for k in keep):
            continue
        original = model.get_submodule(name)
        if load.quantize == "int8":
            weight: Any = original.weight
            layer: nn.Module = FakeInt8Linear(original, weight.dtype, mode, device)
        else:
            layer = FakeNF4Linear(original, load.compute_dtype, mode, device, double_quant=load.double_quant)
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, layer)


def plan_loads(model_or_config: Any, plans: Sequence[Any], load: Mapping[str, Any] | None) -> list[Load | None]:
    """Each plan's :class:`Load` for a dry run of ``model_or_config``: for a config or a name, ``load`` (or the
    plan's implied one); for a model, None: it is estimated as it is (its dtypes, quantized layers, adapters), and
    ``load=`` is refused for it, saying what to write, unless it is on the meta device (its shapes are then loaded
    as ``load=`` says). This is the one place an estimate, fit's suggestions, the command line and inference read
    how a model is loaded.

    Example:
        >>> plan_loads(nn.Linear(2, 2), [Plan(weights="bf16")], None)
        [None]
        >>> plan_loads(nn.Linear(2, 2, device="meta"), [Plan()], {"dtype": torch.bfloat16})[0].dtype
        torch.bfloat16
    """
    if isinstance(model_or_config, nn.Module):
        if load is not None and not _on_meta(model_or_config):
            raise MemlabError(
                "load= says how a model is loaded, and this model is already loaded (its weights are in memory); "
                "drop load=, or estimate its config with it: memlab.estimate(model.config, batch, plan, load=...)"
            )
        if load is None:
            return [None for _ in plans]
    return [parse_load(load, plan if isinstance(plan, Plan) else None) for plan in plans]


def loaded_dtype(model_or_config: Any, load: Load) -> torch.dtype:
    """The dtype ``load`` gives the weights it does not quantize, for a config, a name or a (meta) model: its own
    dtype, or for ``"auto"`` the one the config records, else fp32.

    Example:
        >>> from transformers import LlamaConfig
        >>> loaded_dtype(LlamaConfig(dtype="bfloat16"), Load(None))
        torch.bfloat16
    """
    if load.dtype is not None:
        return load.dtype
    if isinstance(model_or_config, nn.Module):
        return load_dtype(model_or_config, load)
    config = load_config(model_or_config) if not is_transformers_config(model_or_config) else model_or_config
    named = checkpoint_dtype(config)
    return named if named in _DTYPE_CODE else torch.float32


def _on_meta(model: nn.Module) -> bool:
    return any(parameter.device.type == "meta" for parameter in model.parameters())


def live_load_note(model: nn.Module, plan: Any) -> str | None:
    """What a CUDA estimate of a live ``model`` says where ``plan`` casts or quantizes it for the trial: the figure is
    that of the model loaded so (the set-up's leftovers are given back before the first step, as a measured trial
    does), and how to load it to get that figure. None where the plan keeps the model as it is.

    Example:
        >>> print(live_load_note(nn.Linear(2, 2), Plan(weights="bf16")))  # doctest: +ELLIPSIS
        the live model is cast to bf16 for this plan, and what the fp32 copy held is given back before the first \
step: the card figure is that of the model loaded with from_pretrained(name, dtype=torch.bfloat16)...
    """
    dtypes = {parameter.dtype for parameter in model.parameters() if parameter.is_floating_point()}
    loaded_in_4bit = any(isinstance(module, FakeNF4Linear) and not isinstance(module, FakeInt8Linear)
                         or type(module).__name__ in ("Linear4bit", "LinearNF4", "LinearFP4")
                         for module in model.modules())
    if getattr(plan, "adapter", "none") == "qlora" and loaded_in_4bit:
        return None  # loaded in 4-bit by the user already: the step changes nothing of the load
    if getattr(plan, "adapter", "none") == "qlora":
        done, load = "quantized to 4-bit", implied_load(plan)
    elif getattr(plan, "weights", "fp32") == "bf16" and dtypes - {torch.bfloat16}:
        done, load = "cast to bf16", Load(torch.bfloat16)
    else:
        return None
    before = "/".join(sorted(str(dtype).removeprefix("torch.") for dtype in dtypes)) or "full-precision"
    before = before.replace("float32", "fp32").replace("bfloat16", "bf16").replace("float16", "fp16")
    return (
        f"the live model is {done} for this plan, and what the {before} copy held is given back before the first "
        f"step: the card figure is that of the model loaded with {load.code()}; a model cast or quantized in place "
        "keeps those segments reserved until torch.cuda.empty_cache()"
    )


_WEIGHT_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def inference_loads(
    model_or_config: Any, plans: Sequence[Any], load: Mapping[str, Any] | None
) -> tuple[list[Any], list[Load | None]]:
    """Inference plans and their loads for a dry run with ``load=``: the weights as the load materialises them
    (quantized by its ``quantization_config``), each plan running in the dtype the load gives the weights it does
    not quantize. A plan's own ``quantize=`` or a ``weights=`` other than that dtype (or the default ``"fp32"``)
    contradicts the load: a MemlabError says which to drop. Without ``load=``: the plans as given, no loads.

    Example:
        >>> from transformers import LlamaConfig
        >>> from memlab.plan import InferencePlan
        >>> plans, loads = inference_loads(LlamaConfig(), [InferencePlan()], {"dtype": torch.bfloat16})
        >>> plans[0].weights, loads[0].dtype
        ('bf16', torch.bfloat16)
    """
    if load is None:
        return list(plans), []
    loads = plan_loads(model_or_config, plans, load)
    held = []
    for plan, loaded in zip(plans, loads, strict=True):
        assert loaded is not None  # a live model refuses load= in plan_loads
        name = _WEIGHT_NAMES[loaded_dtype(model_or_config, loaded)]
        if plan.quantize != "none":
            raise MemlabError(
                f"load= says how the weights are loaded, and the plan quantizes them too (quantize={plan.quantize!r}); "
                "write the quantization once: drop quantize= from the InferencePlan, or put it in load= as "
                "quantization_config=BitsAndBytesConfig(...)"
            )
        if plan.weights not in ("fp32", name):
            raise MemlabError(
                f"load= loads the weights in {name}, and the plan holds them in {plan.weights}; drop weights= from "
                f"the InferencePlan (the load decides), or write load={{'dtype': ...}} for {plan.weights}"
            )
        held.append(plan.replace(weights=name) if hasattr(plan, "replace") else plan)
    return held, loads


def staging_bytes(model: nn.Module, load: Load) -> int:
    """The most host memory ``load`` needs at once on its way to the GPU (a load's CPU staging, DESIGN.md 2.4), read
    off ``model`` before :func:`apply_load` (its shapes, as built). transformers 5 opens every checkpoint shard
    memory-mapped (``safe_open(..., backend="mmap")``: file pages the kernel may drop, not counted) and copies each
    tensor out of it (``core_model_loading._materialize_copy``) to the device its ``device_map`` names:

    - quantized (``quantization_config`` with bitsandbytes): its quantizer places the model on the GPU
      (``update_device_map``) and, quantizing on the fly, loads without the thread pool, one tensor after another:
      the largest checkpoint tensor in the checkpoint's dtype (the config's, else fp32) is in host memory at once;
    - not quantized, as :meth:`Load.code` writes it (no ``device_map``): every weight and buffer is materialised in
      host memory in the dtype the load gives it, before the model is moved to the GPU (``model.to``, or the
      Trainer): the whole model at once.

    Example:
        >>> model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
        >>> staging_bytes(model, Load(torch.bfloat16)), staging_bytes(model, Load(None, "nf4"))
        (180, 256)
    """
    if load.quantize != "none":
        stored = checkpoint_dtype(getattr(model, "config", None)) or torch.float32
        return max((tensor.numel() for tensor in model.parameters()), default=0) * stored.itemsize
    dtype = load_dtype(model, load)
    keep = _kept_in_fp32(model, dtype, False)
    total, seen = 0, set()
    for name, module in model.named_modules():
        target = torch.float32 if any(f".{k}." in f".{name}." for k in keep) else dtype
        tensors = [(tensor, True) for tensor in module._parameters.values()]
        for tensor, loaded in [*tensors, *((tensor, False) for tensor in module._buffers.values())]:
            if tensor is None or id(tensor) in seen:
                continue
            seen.add(id(tensor))  # buffers keep the dtype the model's code gives them (a rotary inv_freq stays fp32)
            size = target.itemsize if loaded and tensor.is_floating_point() else tensor.element_size()
            total += tensor.numel() * size
    return total


HOST_OF_LOAD = "the host memory the plan needs at once (host_bytes; --host-budget judges it) is the load's"
"""How :func:`staging_note` begins."""


def staging_note(load: Load) -> str:
    """What an estimate says where its load's CPU staging (:func:`staging_bytes`) is more than the step keeps in host
    memory, and so is its ``host_bytes``. No number: the dry runs a deep model is carried from must say the same.

    Example:
        >>> staging_note(Load(torch.bfloat16))
        "the host memory the plan needs at once (host_bytes; --host-budget judges it) is the load's: every weight as \
from_pretrained(name, dtype=torch.bfloat16) materialises it in host memory (no device_map) before the model is \
moved to the GPU, more than the step keeps there"
    """
    if load.quantize != "none":
        how = ("the largest checkpoint tensor, read from the memory-mapped checkpoint into host memory before it is "
               "quantized on the GPU (transformers quantizes on the fly one tensor at a time)")
    else:
        how = (f"every weight as {load.code()} materialises it in host memory (no device_map) before the model is "
               "moved to the GPU")
    return (f"{HOST_OF_LOAD}: {how}, more than the step keeps there")
