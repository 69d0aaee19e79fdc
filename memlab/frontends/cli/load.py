"""The load flags of ``memlab estimate``: how the user loads the model, one flag per ``from_pretrained`` /
``BitsAndBytesConfig`` keyword, read back as the ``load=`` of :func:`memlab.estimate` (and of
:func:`memlab.model_on_meta` for ``--trainer``). Both the estimate command and the trainer questions import it.
"""

from __future__ import annotations

import argparse
from typing import Any

_LOAD_EXAMPLE = (
    "how you load the model, as you pass it to from_pretrained (default: what the plan implies: weights=bf16 loads "
    "in bf16, adapter=qlora in 4-bit NF4 with bf16 compute (what it leaves unquantized in bf16 with weights=bf16), the "
    "rest as the installed transformers loads it: the "
    "checkpoint's own dtype since transformers 5, else fp32); e.g. --dtype bfloat16 --load-in-4bit "
    "--bnb-4bit-quant-type nf4 --bnb-4bit-compute-dtype bfloat16 --bnb-4bit-use-double-quant is "
    "from_pretrained(name, dtype=torch.bfloat16, quantization_config=BitsAndBytesConfig(load_in_4bit=True, "
    "bnb_4bit_quant_type='nf4', bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_use_double_quant=True))"
)
_DTYPE_NAMES = ("bfloat16", "float16", "float32", "bf16", "fp16", "fp32", "auto")


def add_load_arguments(parser: argparse.ArgumentParser) -> None:
    """The load flags: one per ``from_pretrained`` / ``BitsAndBytesConfig`` keyword (:func:`load_from_args`)."""
    group = parser.add_argument_group("load", _LOAD_EXAMPLE)
    group.add_argument("--dtype", "--torch-dtype", dest="dtype", choices=_DTYPE_NAMES, metavar="DTYPE", default=None,
                       help="from_pretrained(dtype=...): the dtype of the weights not quantized (--torch-dtype is "
                       f"the same, as transformers before 5 names it): {', '.join(_DTYPE_NAMES)}")
    group.add_argument("--load-in-4bit", action="store_true", help="BitsAndBytesConfig(load_in_4bit=True)")
    group.add_argument("--load-in-8bit", action="store_true", help="BitsAndBytesConfig(load_in_8bit=True)")
    group.add_argument("--bnb-4bit-quant-type", choices=("nf4", "fp4"), default=None,
                       help="BitsAndBytesConfig(bnb_4bit_quant_type=...) (bitsandbytes' default: fp4)")
    group.add_argument("--bnb-4bit-compute-dtype", choices=_DTYPE_NAMES[:-1], metavar="DTYPE", default=None,
                       help="BitsAndBytesConfig(bnb_4bit_compute_dtype=...) (bitsandbytes' default: float32)")
    group.add_argument("--bnb-4bit-use-double-quant", action="store_true",
                       help="BitsAndBytesConfig(bnb_4bit_use_double_quant=True)")
    group.add_argument("--bnb-4bit-quant-storage", choices=_DTYPE_NAMES[:-1], metavar="DTYPE", default=None,
                       help="BitsAndBytesConfig(bnb_4bit_quant_storage=...): the dtype the 4-bit weights are stored "
                       "in; the compute dtype (bfloat16) is what FSDP and ZeRO-3 need to shard them (same bytes)")
    group.add_argument("--llm-int8-skip-modules", metavar="NAME+NAME", default=None,
                       help="BitsAndBytesConfig(llm_int8_skip_modules=[...]): modules kept unquantized, e.g. lm_head")


def load_from_args(args: argparse.Namespace) -> dict[str, Any] | None:
    """The ``load=`` of :func:`memlab.estimate` that the load flags say; None where none is given. A 4-bit setting
    without ``--load-in-4bit`` is a MemlabError saying what to add.

    Example:
        >>> parser = argparse.ArgumentParser(prog="memlab estimate")
        >>> add_load_arguments(parser)
        >>> load_from_args(parser.parse_args(["--dtype", "bf16", "--load-in-4bit",
        ...                                   "--bnb-4bit-quant-type", "nf4"]))
        {'dtype': 'bf16', 'quantization_config': {'load_in_4bit': True, 'bnb_4bit_quant_type': 'nf4'}}
    """
    from memlab.errors import MemlabError

    config: dict[str, Any] = {}
    if getattr(args, "load_in_4bit", False):
        config["load_in_4bit"] = True
    if getattr(args, "load_in_8bit", False):
        config["load_in_8bit"] = True
    four_bit = {"bnb_4bit_quant_type": getattr(args, "bnb_4bit_quant_type", None),
                "bnb_4bit_compute_dtype": getattr(args, "bnb_4bit_compute_dtype", None),
                "bnb_4bit_use_double_quant": getattr(args, "bnb_4bit_use_double_quant", False) or None,
                "bnb_4bit_quant_storage": getattr(args, "bnb_4bit_quant_storage", None)}
    for key, value in four_bit.items():
        if value is not None:
            if not config.get("load_in_4bit"):
                raise MemlabError(f"--{key.replace('_', '-')} sets a 4-bit load; add --load-in-4bit")
            config[key] = value
    skip = getattr(args, "llm_int8_skip_modules", None)
    if skip:
        if not config:
            raise MemlabError("--llm-int8-skip-modules keeps modules out of a quantized load; add --load-in-4bit or "
                              "--load-in-8bit")
        config["llm_int8_skip_modules"] = [name for name in skip.split("+") if name]
    load: dict[str, Any] = {}
    if getattr(args, "dtype", None) is not None:
        load["dtype"] = args.dtype
    if config:
        load["quantization_config"] = config
    return load or None
