"""The FSDP2 units of a model, as accelerate's ``fsdp2_prepare_model`` makes them (accelerate 1.15): each repeated
block, the input embeddings, the tail (final norm and head), then the root. The FSDP2 dry run
(:mod:`memlab.estimation.sharded.fsdp2`) and the exported accelerate script shard with them; the composed estimates
count their all-gathers (:mod:`memlab.estimation.sharded.composed`)."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

__all__ = ["fsdp2_layout", "shard_units"]


def shard_units(model: nn.Module, layer_classes: Sequence[str] | None = None) -> list[nn.Module]:
    """The blocks that become FSDP units first, as accelerate's ``TRANSFORMER_BASED_WRAP`` picks them: every module
    whose class is in ``layer_classes`` (accelerate's ``fsdp_transformer_layer_cls_to_wrap``), else in the model's
    ``_no_split_modules`` (Hugging Face models), else the repeated blocks memlab checkpoints
    (:func:`memlab.techniques.checkpointing.repeated_blocks`: what a user names for a model without
    ``_no_split_modules``, BERT's ``BertLayer``). Innermost first, as accelerate walks the model bottom up.

    Example:
        >>> import torch
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> with torch.device("meta"):
        ...     model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=3,
        ...                                          num_attention_heads=2, vocab_size=256))
        >>> sorted({type(unit).__name__ for unit in shard_units(model)}), len(shard_units(model))
        (['LlamaDecoderLayer'], 3)
    """
    names = set(layer_classes or getattr(model, "_no_split_modules", None) or ())
    units = [m for m in model.modules() if m is not model and type(m).__name__ in names]
    if not units and not layer_classes:
        from memlab.techniques.checkpointing import repeated_blocks

        units = [m for m in repeated_blocks(model) if m is not model]
    depth = {id(m): name.count(".") for name, m in model.named_modules()}
    return sorted(units, key=lambda m: -depth.get(id(m), 0))


def fsdp2_layout(model: nn.Module, layer_classes: Sequence[str] | None = None) -> list[tuple[list[nn.Module], bool]]:
    """The FSDP2 units accelerate's ``fsdp2_prepare_model`` (accelerate 1.15) makes, in its order, each with its
    ``reshard_after_forward``, before the root: each block of :func:`shard_units` (``True``); the input embeddings
    as a unit of their own unless tied to the output ones (``True``); then the tail, the final norm and the output
    head (with the input embeddings where the two are tied, so that the shared weight sits in one group), kept
    gathered after forward (``False``). The root (the whole model) comes last, with FSDP2's default. A module
    holding a weight tied to another group's joins that group (BERT's head joins its ``BertEmbeddings`` block). A
    weight tied to more holders than the two (T5's and BART's encoder and decoder ``embed_tokens``) stays with the
    root, where accelerate 1.15's layout fails (FSDP2 refuses one weight in two groups).

    Example:
        >>> from transformers import BertConfig, BertForMaskedLM
        >>> bert = BertForMaskedLM(BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2,
        ...                                   num_attention_heads=2, intermediate_size=32))
        >>> [([type(m).__name__ for m in unit], reshard) for unit, reshard in fsdp2_layout(bert)][-1]
        (['BertEmbeddings', 'BertLMPredictionHead'], True)
    """
    layout: list[tuple[list[nn.Module], bool]] = [([unit], True) for unit in shard_units(model, layer_classes)]
    inside = {id(m) for units, _ in layout for unit in units for m in unit.modules()}

    def get(name: str) -> nn.Module | None:
        method = getattr(model, name, None)
        try:
            module = method() if callable(method) else None
        except (NotImplementedError, AttributeError):
            return None
        return module if isinstance(module, nn.Module) else None

    embed, head = get("get_input_embeddings"), get("get_output_embeddings")
    # Tied: a parameter both hold (accelerate compares the two .weight attributes, which misses BERT's, whose input
    # embeddings are its BertEmbeddings module; the tied weight must sit in one group either way)
    shared = {id(p) for p in embed.parameters()} if embed is not None else set()
    tied = head is not None and any(id(p) in shared for p in head.parameters())
    # T5 and BART: the encoder's and decoder's embed_tokens hold the input embeddings' weight too, and the model's
    # own `shared` embedding never runs forward. accelerate 1.15 shards embed (and a tied head) in a group of their
    # own and leaves the others to the root, which FSDP2 refuses (one weight in two groups); all of them in one group
    # leave a member that never runs, which FSDPMemTracker fails on. The root holds them all, the weight once.
    others = [m for m in model.modules() if m is not model and m is not embed and m is not head
              and id(m) not in inside and any(id(p) in shared for p in m.parameters(recurse=False))]
    if embed is not None and not tied and id(embed) not in inside and not others:
        layout.append(([embed], True))
    if tied and embed is not None and head is not None and id(embed) in inside:
        # the input embeddings sit in a block (BERT's BertEmbeddings is one of its _no_split_modules): the head
        # joins that block's group, or the tied weight would be in two groups (torch refuses it)
        owner = next(units for units, _ in layout if any(embed is m for unit in units for m in unit.modules()))
        owner.append(head)
    tail = [m for m in (_final_norm(model), *((embed, head) if tied else (head,))) if m is not None
            and id(m) not in inside and not (tied and id(embed) in inside and m is head)
            and not (others and (m is embed or (tied and m is head)))]
    if tail:
        layout.append((tail, False))
    return [(_widened(units, model), reshard) for units, reshard in layout]


def _widened(units: list[nn.Module], model: nn.Module) -> list[nn.Module]:
    """``units`` with each module replaced by its nearest ancestor (below the root) that registers one of its
    parameters itself (BERT's ``decoder.bias`` is ``cls.predictions.bias``): FSDP2 refuses a parameter that two
    groups hold."""
    parents = {id(child): parent for parent in model.modules() for child in parent.children()}
    owners: dict[int, list[nn.Module]] = {}
    for module in model.modules():
        for parameter in module.parameters(recurse=False):
            owners.setdefault(id(parameter), []).append(module)
    widened: list[nn.Module] = []
    for unit in units:
        ancestors, module = [], unit
        while id(module) in parents and parents[id(module)] is not model:
            module = parents[id(module)]
            ancestors.append(module)
        holders = [owner for p in unit.parameters() for owner in owners.get(id(p), ())]
        outer = [a for a in ancestors if any(a is h for h in holders)]
        widened.append(outer[-1] if outer else unit)
    return [m for i, m in enumerate(widened) if not any(m is n for n in widened[:i])]


def _final_norm(model: nn.Module) -> nn.Module | None:
    """The last norm among the base model's children (accelerate's ``_find_final_norm``)."""
    prefix = getattr(model, "base_model_prefix", "")
    base = getattr(model, prefix, None) if prefix else model
    if not isinstance(base, nn.Module):
        return None
    norms = [m for _, m in base.named_children() if "Norm" in type(m).__name__]
    return norms[-1] if norms else None
