"""Which model a dry run is about: a name read as a transformers config (a built-in shape, a local file or the
Hub), the model of a config built on the ``meta`` device (no memory), its parameter counts, and a batch of shapes
from ``ROWSxTOKENS``."""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from memlab.errors import MemlabError, nearest
from memlab.live.quiet import without_paths
from memlab.live.sharding import whole_shape

__all__ = [
    "KNOWN_SHAPES",
    "built_from",
    "checkpoint_dtype",
    "dtype_keyword",
    "is_transformers_config",
    "frozen_count",
    "layer_counts",
    "load_config",
    "meta_model",
    "model_on_meta",
    "one_line",
    "parse_batch_shape",
    "persistent_count",
    "transformers_version",
]


def _llama(hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int) -> dict[str, Any]:
    return dict(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=32000)


# Model shapes that need no download: name -> (config class name, keyword arguments).
KNOWN_SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama-7b": ("LlamaConfig", _llama(4096, 11008, 32, 32, 32)),
    "llama-13b": ("LlamaConfig", _llama(5120, 13824, 40, 40, 40)),
    "llama-70b": ("LlamaConfig", _llama(8192, 28672, 80, 64, 8)),
    # Llama 3 8B: grouped-query attention (8 KV heads) and a 128,256-token vocabulary (its logits weigh)
    "llama-3-8b": ("LlamaConfig", {**_llama(4096, 14336, 32, 32, 8), "vocab_size": 128256,
                                   "rope_theta": 500000.0, "max_position_embeddings": 8192}),
    "gpt2": ("GPT2Config", {}),
}
"""Built-in shapes for ``estimate`` and ``memlab estimate`` (Llama 2 7B/13B/70B, Llama 3 8B, GPT-2 small)."""
KNOWN_SHAPES["llama-8b"] = KNOWN_SHAPES["llama-3-8b"]  # the name people type for it

_HUB_PROBE_TIMEOUT_S = 5.0
"""Seconds the Hub has to answer for a model's config.json before memlab says it is offline."""


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
            problem = "offline?" if isinstance(error, OSError) else one_line(error)
    raise MemlabError(
        f"could not fetch the config of {name} ({problem}); pass a transformers config or --config path/to/config.json"
        f"{_built_in_hint(name)}"
    )


def _built_in_hint(name: str) -> str:
    """For a name that may be a mistyped built-in shape: the built-in names and the closest one, else ``""``.

    Example:
        >>> _built_in_hint("lama-7b")
        ', or a built-in shape (llama-7b, llama-13b, llama-70b, llama-3-8b, gpt2, llama-8b): did you mean llama-7b?'
        >>> _built_in_hint("meta-llama/Llama-2-7b-hf")
        ''
    """
    closest = nearest(name, KNOWN_SHAPES, most=1)
    if not closest and "/" in name:
        return ""
    hint = f", or a built-in shape ({', '.join(KNOWN_SHAPES)})"
    return f"{hint}: did you mean {closest[0]}?" if closest else hint


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


def one_line(error: BaseException) -> str:
    """An error as one line for a trial or a message: its type and the first line of its text, the machine's paths
    cut to their last part (:func:`~memlab.live.quiet.without_paths`).

    Example:
        >>> one_line(ValueError("\\n  shapes differ\\n  (2, 3) vs (3, 2)"))
        'ValueError: shapes differ'
        >>> one_line(OSError("no file /home/ada/.cache/huggingface/hub/config.json"))
        'OSError: no file config.json'
    """
    first = next((line.strip() for line in without_paths(str(error)).splitlines() if line.strip()), "")
    return f"{type(error).__name__}: {first}"


def is_transformers_config(value: Any) -> bool:
    """Whether ``value`` is a transformers config (a ``PretrainedConfig``), without importing transformers.

    Example:
        >>> is_transformers_config(load_config("gpt2")), is_transformers_config({"hidden_size": 8})
        (True, False)
    """
    return any(cls.__name__ == "PretrainedConfig" or cls.__name__ == "PreTrainedConfig" for cls in type(value).__mro__)


def meta_model(config: Any) -> nn.Module:
    """The model of a transformers config on the meta device (no memory), its shapes in fp32.

    The class is the first of ``config.architectures`` that transformers has, else ``AutoModelForCausalLM``, else
    ``AutoModelForSeq2SeqLM`` (an encoder-decoder's config), else ``AutoModel``. ``estimate`` accepts the result
    like any model. The config is copied, never changed, and the model's config keeps the dtype the checkpoint
    recorded (``dtype``, ``torch_dtype`` before transformers 5), which a load of ``dtype="auto"`` reads
    (:func:`memlab.estimation.dryrun.load.load_dtype`).

    Example:
        >>> model = meta_model(load_config("llama-7b"))
        >>> type(model).__name__, model.lm_head.weight.device.type, sum(p.numel() for p in model.parameters())
        ('LlamaForCausalLM', 'meta', 6738415616)
    """
    import copy

    import transformers

    if not is_transformers_config(config):
        raise MemlabError(f"{type(config).__name__} is not a transformers config; pass one, or a name such as llama-7b")
    recorded = checkpoint_dtype(config)
    config = copy.deepcopy(config)  # transformers writes the dtype it builds in onto the config
    model: nn.Module | None = None
    import_modeling(config)
    with torch.device("meta"):
        for name in getattr(config, "architectures", None) or ():
            cls: Any = getattr(transformers, str(name), None)
            if isinstance(cls, type) and issubclass(cls, nn.Module) and hasattr(cls, "_from_config"):
                model = cls._from_config(config, **{dtype_keyword(): torch.float32})
                break
        # A head that trains (a loss from labels): causal LM, else sequence-to-sequence LM (T5, BART), else the bare
        # model.
        for auto in (transformers.AutoModelForCausalLM, transformers.AutoModelForSeq2SeqLM):
            if model is not None:
                break
            with contextlib.suppress(ValueError):
                model = auto.from_config(config, **{dtype_keyword(): torch.float32})
        if model is None:
            model = transformers.AutoModel.from_config(config, **{dtype_keyword(): torch.float32})
    built = getattr(model, "config", None)
    if built is not None:
        with contextlib.suppress(AttributeError, TypeError, ValueError):
            setattr(built, dtype_keyword(), recorded)
    _BUILT[model] = config
    return model


def import_modeling(config: Any) -> None:
    """Import the modeling module of ``config``'s model type (``transformers.models.gpt2.modeling_gpt2``), as building
    its model would, before :func:`meta_model` enters the ``meta`` device: a process's first modeling import imports
    ``torch._dynamo``, which fails inside ``torch.device("meta")`` on older torch (2.8: "Could not find LlamaModel
    neither in transformers.models.llama nor in transformers"). A model type transformers has no module of (remote
    code) is left to the build.

    Example:
        >>> import sys
        >>> import_modeling(load_config("gpt2"))
        >>> "transformers.models.gpt2.modeling_gpt2" in sys.modules
        True
    """
    import importlib

    from transformers.models.auto.configuration_auto import model_type_to_module_name

    model_type = getattr(config, "model_type", None)
    if not isinstance(model_type, str) or not model_type:
        return
    name = model_type_to_module_name(model_type)
    with contextlib.suppress(ImportError):
        importlib.import_module(f"transformers.models.{name}.modeling_{name}")


_BUILT: weakref.WeakKeyDictionary[nn.Module, Any] = weakref.WeakKeyDictionary()


def built_from(model: nn.Module) -> Any | None:
    """The config :func:`meta_model` built ``model`` from (a copy); None for any other model.

    Example:
        >>> config = load_config("gpt2")
        >>> built_from(meta_model(config)).n_layer, built_from(nn.Linear(2, 2))
        (12, None)
    """
    return _BUILT.get(model)


def checkpoint_dtype(config: Any) -> torch.dtype | None:
    """The dtype a transformers config records for its checkpoint (``dtype``, or ``torch_dtype`` before
    transformers 5), as a torch dtype; None where it records none (a config built in code without one).

    Example:
        >>> from transformers import LlamaConfig
        >>> checkpoint_dtype(LlamaConfig(dtype="bfloat16")), checkpoint_dtype(load_config("llama-7b"))
        (torch.bfloat16, None)
    """
    for attribute in ("dtype", "torch_dtype"):
        with contextlib.suppress(Exception):  # transformers 5 warns on torch_dtype; a config may lack both
            value = vars(config).get(attribute) if attribute == "torch_dtype" else getattr(config, attribute, None)
            if isinstance(value, str):
                value = getattr(torch, value.removeprefix("torch."), None)
            if isinstance(value, torch.dtype):
                return value
    return None


def transformers_version() -> tuple[int, int]:
    """The installed transformers' (major, minor) version.

    Example:
        >>> transformers_version() >= (4, 45)
        True
    """
    from importlib import metadata

    from packaging.version import Version

    release = Version(metadata.version("transformers")).release
    return release[0], release[1] if len(release) > 1 else 0


def dtype_keyword() -> str:
    """The keyword ``from_pretrained`` and ``from_config`` take a dtype by in the installed transformers: ``dtype``
    since 4.56 (``torch_dtype`` is deprecated there), ``torch_dtype`` before.

    Example:
        >>> dtype_keyword()
        'dtype'
    """
    return "dtype" if transformers_version() >= (4, 56) else "torch_dtype"


def model_on_meta(model_or_config: Any) -> nn.Module:
    """The model on the ``meta`` device: a live model itself (one whose parameters ZeRO-3 partitioned: a copy on the
    meta device with each parameter whole, :func:`memlab.live.sharding.whole_shape`), a config's or a name's built by
    :func:`meta_model`.

    Example:
        >>> model_on_meta("gpt2").transformer.wte.weight.device.type
        'meta'
    """
    if isinstance(model_or_config, nn.Module):
        if any(getattr(parameter, "ds_shape", None) is not None for parameter in model_or_config.parameters()):
            return _whole_on_meta(model_or_config)
        return model_or_config
    if isinstance(model_or_config, (str, os.PathLike)):
        model_or_config = load_config(model_or_config)
    return meta_model(model_or_config)



def _whole_on_meta(model: nn.Module) -> nn.Module:
    """A copy of ``model`` on the meta device, each parameter and buffer at its whole shape (ties kept)."""
    import copy

    memo: dict[int, Any] = {}
    for tensor in (*model.parameters(), *model.buffers()):
        if id(tensor) not in memo:
            whole = torch.empty(whole_shape(tensor), dtype=tensor.dtype, device="meta")
            memo[id(tensor)] = nn.Parameter(whole, requires_grad=tensor.requires_grad) if isinstance(
                tensor, nn.Parameter) else whole
    with torch.no_grad():
        return copy.deepcopy(model, memo)

def layer_counts(model_or_config: Any) -> tuple[int, int]:
    """``(trainable parameters, the largest layer's own parameters)`` as DeepSpeed counts them
    (``model_to_params`` and ``estimate_zero3_model_states_mem_needs_all_live``: tied weights once; a layer's own
    parameters, ``recurse=False``).

    Example:
        >>> layer_counts(nn.Sequential(nn.Linear(10, 10), nn.Linear(10, 2)))
        (132, 110)
    """
    model = model_on_meta(model_or_config)
    seen: dict[int, int] = {}
    for parameter in model.parameters():
        if parameter.requires_grad:
            seen[id(parameter)] = parameter.numel()
    largest = max((sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()), default=0)
    return sum(seen.values()), largest


def frozen_count(model_or_config: Any) -> int:
    """Parameters that do not train (a LoRA run's frozen base), tied weights once: ZeRO holds their weights and
    nothing else.

    Example:
        >>> model = nn.Sequential(nn.Linear(10, 10), nn.Linear(10, 2))
        >>> model[0].requires_grad_(False)  # doctest: +ELLIPSIS
        Linear(...)
        >>> frozen_count(model), layer_counts(model)
        (110, (22, 110))
    """
    model = model_on_meta(model_or_config)
    frozen = {id(p): p.numel() for p in model.parameters() if not p.requires_grad}
    return sum(frozen.values())


def persistent_count(model_or_config: Any, threshold: int) -> int:
    """Elements of the parameters ZeRO-3 keeps whole on every rank: those of at most ``threshold`` elements
    (``stage3_param_persistence_threshold``; DeepSpeed 0.19's ``mark_persistent_parameters`` and ``zero.Init``:
    ``ds_numel <= threshold``), trained or frozen, tied weights once.

    Example:
        >>> model = nn.Sequential(nn.Linear(10, 10), nn.Linear(10, 2))  # weights of 100 and 20, biases of 10 and 2
        >>> persistent_count(model, 100), persistent_count(model, 99)
        (132, 32)
    """
    model = model_on_meta(model_or_config)
    sizes = {id(p): p.numel() for p in model.parameters()}
    return sum(size for size in sizes.values() if size <= threshold)


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
    if len(shape) == 2 and min(shape) < 1:
        raise MemlabError(f"batch {text!r}: rows and tokens must be positive; write for example --batch 1x512")
    if len(shape) != 2:
        raise MemlabError(f"batch {text!r} is not ROWSxTOKENS; write for example --batch 1x512")
    return {name: shape for name in names}
