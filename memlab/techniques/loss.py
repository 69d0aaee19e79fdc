"""Chunked cross-entropy: a causal LM's head and loss over chunks of tokens, so the full logits never exist.

A causal LM's default loss computes ``logits = lm_head(hidden)`` for every token (tokens x vocabulary, in fp32
for the loss) and keeps them, and the log-softmax, for backward: with a large vocabulary that is most of the
activations. ``loss="chunked"`` runs the model's base (``model.base_model``: the decoder without its head) to the
last hidden states, then the head and the cross-entropy over :data:`CHUNKS` chunks of tokens, each chunk under
``torch.utils.checkpoint``: forward keeps no chunk's logits, and backward recomputes one chunk's logits at a time.
The loss is the model's own: labels shifted by one the Hugging Face way, ``-100`` ignored, the mean over the
tokens not ignored, plus, for a mixture-of-experts model asked for its router logits (``output_router_logits``),
the router's load-balancing loss times ``router_aux_loss_coef``, added as the model's forward adds it; so are the
gradients (within float tolerance). A model that adds a term memlab cannot reproduce is refused. The cost: the head
runs twice.

It applies to causal LMs that transformers knows as such (``AutoModelForCausalLM`` classes and their subclasses)
with an output head (``get_output_embeddings()``), trained with the default loss on dict batches with ``labels``.
The lever's declaration and exports are here too (the code export's loss: :func:`chunked_loss_code`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from memlab.errors import UnsupportedTechnique
from memlab.live.batch import Batch, LossFn, default_loss
from memlab.techniques.core.fragments import Accelerate, Code, Elsewhere, Export, Fragment, Keys, per_target
from memlab.techniques.core.lever import Lever, PlanLike
from memlab.techniques.core.technique import PlanFields, StepParts, Technique, Undo

__all__ = ["CHUNKED_LOSS", "CHUNKS", "DECLARATIONS", "FULL_LOSS", "IGNORE_INDEX", "LOSSES", "chunked_causal_lm_loss",
           "chunked_loss_applies", "chunked_loss_code", "loss_for_plan"]

FULL_LOSS = "full"
"""The ``loss`` value of the model's own loss."""

CHUNKED_LOSS = "chunked"
"""The ``loss`` value of the chunked cross-entropy."""

LOSSES = (FULL_LOSS, CHUNKED_LOSS)
"""Every ``loss`` value (its choices), which other modules ask instead of spelling them."""

CHUNKS = 8
"""Chunks of tokens the head and the loss are cut into (torchtune's ``CEWithChunkedOutputLoss`` uses 8 too)."""

IGNORE_INDEX = -100
"""The label the Hugging Face loss ignores."""

# Config attributes with which a model changes its logits after the head (softcapping, scaling); the chunked loss
# would skip that change, so it refuses such a model rather than compute another loss.
_LOGIT_CHANGES = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def loss_for_plan(model: nn.Module, plan: PlanFields, loss_fn: LossFn | None) -> LossFn | None:
    """The loss function a step of ``plan`` uses: ``loss_fn`` itself for ``loss="full"``; for ``"chunked"``, the
    chunked loss, after checking that it applies (an :class:`~memlab.errors.UnsupportedTechnique` saying what to
    write otherwise). ``loss_fn`` None or :func:`memlab.live.batch.default_loss` means the model's default loss.

    Example:
        >>> from memlab.plan import Plan
        >>> loss_for_plan(nn.Linear(2, 2), Plan(), None) is None
        True
        >>> loss_for_plan(nn.Linear(2, 2), Plan(loss="chunked"), None)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        memlab.errors.UnsupportedTechnique: loss='chunked' needs a causal LM with an LM head ...
    """
    if plan.loss == "full":
        return loss_fn
    problem = _why_not_chunked(model, loss_fn)
    if problem:
        raise UnsupportedTechnique(problem)
    return chunked_causal_lm_loss


def chunked_loss_applies(model: nn.Module, loss_fn: LossFn | None = None) -> bool:
    """Whether ``loss="chunked"`` can train ``model`` with ``loss_fn`` (None: the default loss).

    Example:
        >>> chunked_loss_applies(nn.Linear(2, 2))
        False
    """
    return not _why_not_chunked(model, loss_fn)


def chunked_causal_lm_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """The causal LM loss of ``model`` on ``batch`` (a dict with ``labels``), its head and cross-entropy computed
    over :data:`CHUNKS` chunks of tokens; equal to ``model(**batch).loss`` within float tolerance.

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> _ = torch.manual_seed(0)
        >>> model = LlamaForCausalLM(LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        ...                                      num_attention_heads=2, vocab_size=64))
        >>> ids = torch.randint(0, 64, (2, 12))
        >>> batch = {"input_ids": ids, "labels": ids}
        >>> torch.allclose(chunked_causal_lm_loss(model, batch), model(**batch).loss, atol=1e-6)
        True
    """
    if not isinstance(batch, Mapping):
        raise UnsupportedTechnique(
            f"loss='chunked' needs a dict batch with labels, not a {type(batch).__name__}; write loss='full'"
        )
    labels = batch.get("labels")
    if not isinstance(labels, torch.Tensor):
        raise UnsupportedTechnique(
            "loss='chunked' computes the causal LM loss from the batch's labels, and it has none; add "
            "batch['labels'] (e.g. a copy of input_ids) or write loss='full'"
        )
    inner = _unwrapped(model)
    head = inner.get_output_embeddings()
    inputs = {key: value for key, value in batch.items() if key != "labels"}
    router_logits = _asks_router_logits(inner, inputs)
    balance = _load_balancing_loss(inner) if router_logits else None
    if router_logits and balance is None:
        raise UnsupportedTechnique(
            f"{type(inner).__name__} adds a router's auxiliary loss that loss='chunked' does not reproduce; drop "
            "output_router_logits from the batch or write loss='full'"
        )
    if router_logits:
        inputs["output_router_logits"] = True
    outputs = inner.base_model(**inputs)
    hidden = outputs.last_hidden_state
    # Shifted the Hugging Face way: position t predicts label t + 1; the last position predicts nothing.
    shifted = nn.functional.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:].to(hidden.device)
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    flat_labels = shifted.reshape(-1)
    size = -(-flat_labels.shape[0] // CHUNKS)
    total = hidden.new_zeros((), dtype=torch.float32)
    # split, not slicing: its backward concatenates the chunks' gradients once, instead of a full-size zero
    # tensor per chunk.
    # early_stop=False: a chunk's recomputation runs to its end instead of stopping at its last saved tensor with
    # an exception thrown through cross_entropy's C++ (nothing is left to skip after that tensor). On an H100,
    # torch 2.11, that exception came out of a step under the allocator's history (memlab's CUDA tracked step) as
    # "SystemError: cross_entropy_loss returned NULL without setting an exception" (pytorch issue 179536).
    for part, part_labels in zip(flat_hidden.split(size), flat_labels.split(size), strict=True):
        total = total + checkpoint(_chunk_loss_sum, head, part, part_labels, use_reentrant=False, early_stop=False)
    counted = (flat_labels != IGNORE_INDEX).sum()
    loss = total / counted
    if balance is not None:
        # As the MoE causal LMs' forward does (Mixtral, Qwen2-MoE, OLMoE, ... share the form).
        aux = balance(outputs.router_logits, inner.num_experts, inner.num_experts_per_tok, inputs.get("attention_mask"))
        loss = loss + inner.router_aux_loss_coef * aux.to(loss.device)
    return loss


def _chunk_loss_sum(head: nn.Module, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    # Upcast to fp32 as transformers' ForCausalLMLoss does.
    logits = head(hidden).float()
    return nn.functional.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="sum")


def _why_not_chunked(model: nn.Module, loss_fn: LossFn | None) -> str:
    if loss_fn is not None and loss_fn is not default_loss:
        return (
            "loss='chunked' replaces the default loss model(**batch).loss, and a loss_fn was given; drop loss_fn "
            "(the batch needs labels) or write loss='full'"
        )
    inner = _unwrapped(model)
    if not _is_causal_lm(inner):
        return (
            f"loss='chunked' needs a causal LM with an LM head (such as AutoModelForCausalLM's); "
            f"{type(model).__name__} is not one: write loss='full'"
        )
    getter = getattr(inner, "get_output_embeddings", None)
    head = getter() if callable(getter) else None
    if not isinstance(head, nn.Module) or getattr(inner, "base_model", inner) is inner:
        return (
            f"loss='chunked' needs a causal LM with an LM head (model.get_output_embeddings()) on a base model; "
            f"{type(model).__name__} has none: write loss='full'"
        )
    config = getattr(inner, "config", None)
    for name in _LOGIT_CHANGES:
        value = getattr(config, name, None)
        if value not in (None, 1, 1.0):
            return (
                f"{type(model).__name__} changes its logits after the head ({name}={value}), which loss='chunked' "
                "does not reproduce; write loss='full'"
            )
    if _asks_router_logits(inner, {}) and _load_balancing_loss(inner) is None:
        return (
            f"{type(model).__name__} adds its router's auxiliary loss to the loss (output_router_logits=True) in a "
            "form loss='chunked' does not reproduce; write loss='full' (or set model.config.output_router_logits "
            "= False to train without that loss)"
        )
    return ""


def _asks_router_logits(model: Any, inputs: Mapping[str, Any]) -> bool:
    """Whether the forward computes router logits, and so adds the load-balancing loss to the loss."""
    asked = inputs.get("output_router_logits")
    if asked is None:
        asked = getattr(getattr(model, "config", None), "output_router_logits", False)
    return bool(asked)


def _load_balancing_loss(model: Any) -> Callable[..., torch.Tensor] | None:
    """The ``load_balancing_loss_func`` of the model's transformers module, when the model has what its forward
    passes it (``num_experts``, ``num_experts_per_tok``, ``router_aux_loss_coef``); else None."""
    if not all(hasattr(model, name) for name in ("num_experts", "num_experts_per_tok", "router_aux_loss_coef")):
        return None
    for cls in type(model).__mro__:
        found = getattr(sys.modules.get(cls.__module__), "load_balancing_loss_func", None)
        if callable(found):
            return found  # type: ignore[no-any-return]
    return None


def _unwrapped(model: nn.Module) -> Any:
    """The transformers model inside a peft wrapper (a model the user wrapped), else the model itself."""
    get_base_model = getattr(model, "get_base_model", None)
    if callable(get_base_model) and hasattr(model, "peft_config"):
        return get_base_model()
    return model


def _is_causal_lm(model: nn.Module) -> bool:
    """Whether transformers lists the model's class (or a class it derives from) as a causal LM."""
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        return False
    try:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    except ImportError:  # pragma: no cover - transformers is a dependency
        return False
    names: set[str] = set()
    for value in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values():
        names.update([value] if isinstance(value, str) else value)
    return any(cls.__name__ in names for cls in type(model).__mro__)


class Loss(Technique):
    """``loss``: the step's loss function (the chunked one for ``"chunked"``), checked before any other technique
    touches the model.

    Example:
        >>> from memlab.plan import Plan
        >>> from memlab.techniques.core.technique import StepParts
        >>> parts = StepParts(nn.Linear(2, 2), Plan(), torch.device("cpu"))
        >>> LOSS.put_on(parts); parts.loss_fn is None
        True
    """

    def put_on(self, parts: StepParts) -> Undo | None:
        parts.loss_fn = loss_for_plan(parts.model, parts.plan, parts.loss_fn)
        return None


LOSS = Loss()


# Liger Kernel's fused linear cross-entropy (the head and the loss in chunks of tokens) and none of its other kernels.
_LIGER_CHUNKED_LOSS = {
    "fused_linear_cross_entropy": True,
    "cross_entropy": False,
    "rope": False,
    "swiglu": False,
    "rms_norm": False,
}


def chunked_loss_code() -> tuple[str, ...]:
    """The lines of a ``compute_loss(model, micro)`` for ``loss="chunked"`` (what :mod:`memlab.techniques.loss`
    does), for the plain code and the accelerate script.

    Example:
        >>> chunked_loss_code()[-1]
        '    return total / (labels != -100).sum()'
    """
    return (
        "def chunk_loss(head, hidden, labels):",
        "    logits = head(hidden).float()",
        '    return torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100, reduction="sum")',
        "",
        "",
        "def compute_loss(model, micro):",
        f"    # Chunked cross-entropy: the LM head and the loss over {CHUNKS} chunks of tokens, each checkpointed,",
        "    # so that only one chunk's logits exist at a time (backward recomputes them); the same loss as",
        "    # model(**micro).loss.",
        '    inner = model.get_base_model() if hasattr(model, "peft_config") else model  # under peft adapters',
        '    inputs = {k: v for k, v in micro.items() if k != "labels"}',
        "    hidden = inner.base_model(**inputs).last_hidden_state",
        '    labels = torch.nn.functional.pad(micro["labels"], (0, 1), value=-100)[..., 1:]  # shifted by one',
        "    hidden, labels = hidden.reshape(-1, hidden.shape[-1]), labels.reshape(-1)",
        f"    size = -(-labels.shape[0] // {CHUNKS})",
        "    head = inner.get_output_embeddings()",
        "    total = sum(",
        "        # early_stop=False: the recomputation runs to its end, as memlab measured it",
        "        checkpoint(chunk_loss, head, h, y, use_reentrant=False, early_stop=False)",
        "        for h, y in zip(hidden.split(size), labels.split(size))",
        "    )",
        "    return total / (labels != -100).sum()",
    )


def _loss(target: str) -> Export:
    def fragment(plan: PlanLike) -> Fragment:
        chunked = plan.loss == "chunked"
        if target == "trainer":
            return Keys({"use_liger_kernel": True, "liger_kernel_config": dict(_LIGER_CHUNKED_LOSS)} if chunked else {})
        code = Code(imports=("from torch.utils.checkpoint import checkpoint",), loss=chunked_loss_code()) if chunked \
            else Code()
        if target == "code":
            return code
        if target == "accelerate":  # it calls the base model and the head itself: inside accelerate's wrapper
            return Accelerate(script=code + Code(loss_model="accelerator.unwrap_model(model)") if chunked else code)
        if target == "deepspeed" and chunked:
            return Elsewhere(
                "the chunked loss is not a DeepSpeed setting: with the Trainer pass plan.to_training_arguments() "
                "(use_liger_kernel), in your own loop compute the loss as plan.to_code() does"
            )
        return Elsewhere()

    return fragment


def loss_from_arguments(args: Any) -> str:
    """The loss a ``TrainingArguments`` trains with: chunked where Liger's fused linear cross-entropy is on
    (``use_liger_kernel``, unless its config turns that kernel off).

    Example:
        >>> from types import SimpleNamespace
        >>> loss_from_arguments(SimpleNamespace(use_liger_kernel=True)), loss_from_arguments(SimpleNamespace())
        ('chunked', 'full')
    """
    if not getattr(args, "use_liger_kernel", False):
        return "full"
    config = getattr(args, "liger_kernel_config", None) or {}
    # Liger's other kernels (RoPE, SwiGLU, RMSNorm) are not memlab levers and are left out of the plan.
    return "chunked" if config.get("fused_linear_cross_entropy", True) else "full"


DECLARATIONS = (
    Lever(
        "loss",
        "full",
        short="{}-loss",
        choices=LOSSES,
        help="chunked computes a causal LM's head and cross-entropy a chunk of tokens at a time: the full logits "
        "never exist at once (same loss); the head runs twice per chunk (default loss and LM head only)",
        technique=LOSS,
        slower=(("chunked", "full"),),
        activation_key=lambda value: value,
        speed={"chunked": (0.95, 0.95)},
        from_arguments=loss_from_arguments,
        exports=per_target(_loss),
    ),
)
"""The ``loss`` lever (:data:`memlab.techniques.core.registry.REGISTRY` gathers it)."""
