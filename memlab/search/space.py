"""The space fit searches: candidate plans at a fixed effective batch, and what one plan says about another.

Every combination of micro_batch (a divisor of ``batch_size``; accumulation makes up the rest), checkpointing,
precision, optimizer, offload (and, where it applies, the chunked loss). :func:`needs_at_least` says when a plan
needs at least another's memory whatever the model, so that one plan that does not fit rules out many.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any

from memlab.errors import MemlabError, unknown_name
from memlab.plan import LEVERS_LISTED, PLAN_FIELDS, Plan, parse_axes
from memlab.report import Trial
from memlab.techniques.adapters import with_adapter
from memlab.techniques.attention import FUSED_ATTENTION
from memlab.techniques.core.registry import REGISTRY, conflicts
from memlab.techniques.loss import LOSSES
from memlab.techniques.offload import NO_OFFLOAD, SEARCHED_OFFLOADS
from memlab.techniques.optimizer import OPTIMIZER_RANK, SEARCHED_OPTIMIZERS
from memlab.techniques.precision import FULL_PRECISION, half_precision

TECHNIQUES = tuple(name for name in PLAN_FIELDS if not REGISTRY[name].split)
"""The plan fields other than the batch split, in the order candidates are listed (every lever the registry does
not declare as cutting the batch: a new lever is an axis without an edit here)."""

TECHNIQUE_DEFAULTS = {name: getattr(Plan(), name) for name in TECHNIQUES}
"""Each technique's value in the plain plan."""

__all__ = [
    "OPTIMIZER_RANK", "SLOWER_WITH", "TECHNIQUES", "TECHNIQUE_DEFAULTS", "best_of", "candidate_plans", "default_space",
    "divisors", "faster_twins", "fits", "keep_rows", "micro_batch_of", "needs_at_least", "runs_as",
]


def divisors(number: int) -> list[int]:
    """The divisors of ``number``, largest first.

    Example:
        >>> divisors(12)
        [12, 6, 4, 3, 2, 1]
    """
    return [d for d in range(number, 0, -1) if number % d == 0]


def default_space(
    batch_size: int, device_type: str = "cpu", bf16_supported: bool = True, *, chunked_loss: bool = False,
    fused_attention: bool = False,
) -> dict[str, list[Any]]:
    """The axes ``fit`` searches by default on a device.

    micro_batch: every divisor of ``batch_size``; checkpointing off and on; precision fp32 and the device's fast
    half precision (bf16, or fp16 on a GPU without bf16); optimizer AdamW and 8-bit AdamW; offload only on CUDA
    (on a CPU there is nothing to move it to, so it can never help). The loss, full and chunked, only with
    ``chunked_loss=True``: the space knows nothing of the model, so the caller says whether the chunked loss applies
    (:func:`memlab.techniques.loss.chunked_loss_applies`: a causal LM with an LM head and the default loss). It keeps
    training the same model the same way, as the other axes do; Adafactor, adapters and pure bf16 weights change
    what is trained, and are searched only when asked for. The attention kernel, the model's own and sdpa, only with
    ``fused_attention=True``: where the model runs eager attention and sdpa can run
    (:func:`memlab.techniques.attention.fused_attention_instead`); it computes the same attention.

    Example:
        >>> default_space(4)
        {'micro_batch': [4, 2, 1], 'checkpointing': [False, True], 'precision': ['fp32', 'bf16'], \
'optimizer': ['adamw', 'adamw8bit'], 'offload': ['none']}
        >>> default_space(2, "cuda", bf16_supported=False)["precision"], default_space(2, "cuda")["offload"]
        (['fp32', 'fp16'], ['none', 'optimizer', 'all'])
        >>> default_space(2, chunked_loss=True)["loss"]
        ['full', 'chunked']
        >>> default_space(2, fused_attention=True)["attention"]
        [None, 'sdpa']
    """
    space: dict[str, list[Any]] = {
        "micro_batch": divisors(batch_size),
        "checkpointing": [False, True],
        "precision": [FULL_PRECISION, half_precision(device_type != "cuda" or bf16_supported)],
        "optimizer": list(SEARCHED_OPTIMIZERS),
        "offload": list(SEARCHED_OFFLOADS) if device_type == "cuda" else [NO_OFFLOAD],
    }
    if chunked_loss:
        space["loss"] = list(LOSSES)
    if fused_attention:
        space["attention"] = [None, FUSED_ATTENTION]
    return space


def candidate_plans(
    batch_size: int, space: Mapping[str, Sequence[Any]], *, batch_rows: int | None = None
) -> list[Plan]:
    """Every plan of ``space`` at the effective batch ``batch_size``, largest micro-batch first.

    ``space`` maps plan fields to the values to try; ``micro_batch`` values must divide ``batch_size`` (``None``
    means all of it) and ``accumulation`` follows from them. Fields not given keep the plain plan's value. When
    ``batch_rows`` equals ``batch_size``, the full-batch plan is written ``micro_batch=None`` (labelled "plain").

    Example:
        >>> [p.label() for p in candidate_plans(4, {"micro_batch": [4, 2], "checkpointing": [False, True]})]
        ['mb4x1', 'mb4x1 ckpt', 'mb2x2', 'mb2x2 ckpt']
        >>> candidate_plans(4, {"micro_batch": [3]})
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: micro_batch=3 does not divide batch_size=4; write divisors of 4: 4, 2, 1
    """
    for key in space:
        if key == "accumulation":
            raise MemlabError(
                "accumulation follows from batch_size / micro_batch; restrict micro_batch instead, "
                "e.g. space={'micro_batch': [8, 4]}"
            )
        if key not in PLAN_FIELDS:
            raise unknown_name(key, PLAN_FIELDS, "a plan setting", LEVERS_LISTED)
    if isinstance(space.get("micro_batch"), (str, bytes)):
        raise MemlabError("space values are lists; write for example space={'micro_batch': [8, 4]}")
    micro: list[int] = []
    for value in space.get("micro_batch", divisors(batch_size)):
        size = batch_size if value is None else value
        if isinstance(size, bool) or not isinstance(size, int) or size < 1 or batch_size % size:
            listed = ", ".join(str(d) for d in divisors(batch_size))
            raise MemlabError(
                f"micro_batch={value!r} does not divide batch_size={batch_size}; write divisors of {batch_size}: "
                f"{listed}"
            )
        if size not in micro:
            micro.append(size)
    axes: list[list[Any]] = []
    for name in TECHNIQUES:
        values = space.get(name, [TECHNIQUE_DEFAULTS[name]])
        if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
            raise MemlabError(f"space[{name!r}] must be a list; write for example {{{name!r}: [{values!r}]}}")
        axes.append(list(dict.fromkeys(values)))
    if not micro or not all(axes):
        raise MemlabError("the space is empty; give every axis at least one value")
    plans = []
    for size in micro:
        for values in _product(axes):
            settings = {
                "micro_batch": None if size == batch_size == batch_rows else size,
                "accumulation": batch_size // size,
                **dict(zip(TECHNIQUES, values, strict=True)),
            }
            # Settings that cannot go together (the registry's conflicts) are no candidate.
            if not conflicts(SimpleNamespace(**settings)):
                plans.append(Plan(**settings))
    if not plans:
        raise MemlabError(f"every plan of the space is refused: {conflicts(SimpleNamespace(**settings))[0]}")
    # A LoRA rank without an adapter is the same plan as the default rank's: each plan once.
    return list(dict.fromkeys(plans))


def _product(axes: list[list[Any]]) -> list[tuple[Any, ...]]:
    combinations: list[tuple[Any, ...]] = [()]
    for values in axes:
        combinations = [(*combination, value) for combination in combinations for value in values]
    return combinations


def runs_as(plan: Plan, device_type: str) -> Plan:
    """The plan that runs exactly as ``plan`` does on ``device_type``: on a CPU offload moves nothing and paged
    8-bit AdamW is the unpaged one, so those plans are measured once, as the plan without them.

    Example:
        >>> runs_as(Plan(offload="all", optimizer="paged_adamw8bit"), "cpu").label()
        'adamw8bit'
        >>> runs_as(Plan(offload="all"), "cuda").label()
        'offload-all'
    """
    if device_type != "cpu":
        return plan
    changes = {
        name: lever.on_cpu(getattr(plan, name)) for name, lever in REGISTRY.items() if lever.on_cpu is not None
    }
    return plan.replace(**changes)


SLOWER_WITH: tuple[tuple[str, Any, Any], ...] = tuple(
    (name, value, instead) for name in TECHNIQUES for value, instead in REGISTRY[name].slower
)
"""``(field, value, instead)``: a plan with ``value`` does the work of the plan with ``instead`` and more, so it is
never faster (each lever's ``slower`` in the registry): checkpointing runs each block's forward again, offload
copies over the bus, QLoRA dequantizes the base weights that LoRA keeps as they are, the chunked loss runs the head
again.

Example:
    >>> ("loss", "chunked", "full") in SLOWER_WITH
    True
"""


def faster_twins(plan: Plan, ranks: Iterable[int] = ()) -> list[Plan]:
    """The plans that do ``plan``'s work without one or more of :data:`SLOWER_WITH` (so are at least as fast), and,
    for an adapter plan, the same at each lower LoRA rank among ``ranks`` (smaller adapters, less work).

    Example:
        >>> [p.label() for p in faster_twins(Plan(checkpointing=True, loss="chunked"))]
        ['chunked-loss', 'ckpt', 'plain']
        >>> [p.label() for p in faster_twins(Plan(adapter="qlora"), ranks=[8, 16])]
        ['lora', 'qlora r8', 'lora r8']
    """
    twins: list[Plan] = []
    for name, value, instead in SLOWER_WITH:
        if getattr(plan, name) == value:
            twins += [twin.replace(**{name: instead}) for twin in [plan, *twins]]
    if with_adapter(plan):
        lower = sorted({rank for rank in ranks if rank < plan.lora_rank}, reverse=True)
        twins += [twin.replace(lora_rank=rank) for rank in lower for twin in [plan, *twins]]
    return list(dict.fromkeys(twins))


def micro_batch_of(plan: Plan, batch_size: int) -> int:
    """Rows per micro-batch of a candidate (``micro_batch=None`` means the whole effective batch)."""
    return plan.micro_batch or batch_size // plan.accumulation


def fits(trial: Trial, budget: int) -> bool:
    """True when the trial ran and its :attr:`~memlab.report.Trial.verdict_bytes` (what the card will show where
    that is known, else the allocated peak) are within ``budget``.

    Example:
        >>> trial = Trial(Plan(), "ok", 90, {}, None, None, None, "cuda:0", reserved_bytes=96, context_bytes=8)
        >>> fits(trial, 100), fits(trial, 104)
        (False, True)
    """
    return trial.status == "ok" and trial.verdict_bytes <= budget


def best_of(trials: Iterable[Trial], budget: int) -> Trial | None:
    """The fastest trial that fits (its host budget too; a tie goes to the lower peak), as :attr:`Report.best`
    chooses."""
    fitting = [t for t in trials if fits(t, budget) and t.host_fits and t.samples_per_s is not None]
    if not fitting:
        return None
    return max(fitting, key=lambda t: (t.samples_per_s or 0.0, -t.peak_bytes))


def needs_at_least(plan: Plan, other: Plan, batch_size: int) -> bool:
    """Whether ``plan`` needs at least the memory of ``other``, whatever the model (so if ``other`` does not fit,
    neither does ``plan``).

    Each lever compares as the registry declares it (``needs_at_least``): checkpointing only if ``other`` does, an
    optimizer that keeps at least as much state; a lever without a declaration compares only with its own value
    (so a new lever never rules out a plan unmeasured). ``plan`` needs at least ``other``'s micro-batch, and going
    from accumulation to none is never compared: without accumulation the gradients need not be held while
    activations are.

    Example:
        >>> small = Plan(micro_batch=2, accumulation=4, checkpointing=True)
        >>> needs_at_least(Plan(micro_batch=4, accumulation=2), small, 8)
        True
        >>> needs_at_least(Plan(micro_batch=4, accumulation=2, precision="bf16"), small, 8)
        False
    """
    for name in TECHNIQUES:
        mine, theirs = getattr(plan, name), getattr(other, name)
        if mine == theirs:
            continue
        compare = REGISTRY[name].needs_at_least
        if compare is None or not compare(mine, theirs):
            return False
    if plan.accumulation == 1 and other.accumulation > 1:
        return False
    return micro_batch_of(plan, batch_size) >= micro_batch_of(other, batch_size)


def keep_rows(plans: list[Plan], grid: list[str], rows: int, name: str) -> tuple[list[Plan], str | None]:
    """``--try micro_batch=...`` without ``accumulation``: each plan's accumulation is ``rows // micro_batch``, so
    that every plan trains the batch's ``rows`` per optimizer step (as fit does); the plans, and the note that says
    so (None when nothing changed). A micro_batch that does not divide ``rows`` is a MemlabError naming the
    divisors. ``%%memfit`` and ``memlab estimate`` both keep the effective batch through this one function.

    Example:
        >>> from memlab.plan import parse_grid
        >>> plans, note = keep_rows(parse_grid(["micro_batch=2,4"]), ["micro_batch=2,4"], 8, "batch")
        >>> [plan.label() for plan in plans], note
        (['mb2x4', 'mb4x2'], 'accumulation = 8 // micro_batch: every plan trains 8 rows per optimizer step')
    """
    axes = parse_axes(grid) if grid else {}
    if "micro_batch" not in axes or "accumulation" in axes:
        return plans, None
    divisors = [size for size in range(1, rows + 1) if rows % size == 0]
    kept = []
    for plan in plans:
        size = plan.micro_batch
        if size is not None and rows % size:
            raise MemlabError(
                f"micro_batch={size} does not divide the {rows} rows of {name}; write one of "
                f"{', '.join(map(str, divisors))} (or name accumulation in --try too)"
            )
        kept.append(plan if size is None else plan.replace(accumulation=rows // size))
    return kept, f"accumulation = {rows} // micro_batch: every plan trains {rows} rows per optimizer step"
