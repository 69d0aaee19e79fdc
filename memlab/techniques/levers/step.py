"""The declarations of the levers that change the optimizer step: precision, the optimizer, offload, the chunked
loss, the optimizer in backward and compile (techniques: :mod:`memlab.techniques.precision`,
:mod:`memlab.techniques.optimizer`, :mod:`memlab.techniques.offload`, :mod:`memlab.techniques.loss`,
:mod:`memlab.techniques.optimizer_in_backward`,
:mod:`memlab.techniques.compile`; facets: :mod:`memlab.techniques.lever`). How each optimizer is named
in each export is here too (:data:`OPTIMIZER_FORMS`), once.

Example:
    >>> [lever.name for lever in DECLARATIONS]
    ['precision', 'optimizer', 'offload', 'loss', 'optimizer_in_backward', 'compile']
    >>> OPTIMIZER_FORMS["adafactor"].trainer
    'adafactor'
"""

from __future__ import annotations

from dataclasses import dataclass

from memlab.techniques.compile import COMPILE, compile_conflicts, compile_export
from memlab.techniques.fragments import (
    Accelerate,
    Code,
    Elsewhere,
    Export,
    Fragment,
    Keys,
    concerns_adapters_only,
    per_target,
)
from memlab.techniques.lever import Lever, PlanLike
from memlab.techniques.loss import LOSS
from memlab.techniques.offload import DECLARATIONS as OFFLOAD_DECLARATIONS
from memlab.techniques.optimizer import OPTIMIZER
from memlab.techniques.optimizer_in_backward import IN_BACKWARD
from memlab.techniques.precision import PRECISION


@dataclass(frozen=True)
class OptimizerForm:
    """How one of memlab's optimizers is written in each export.

    Args:
        title: its name in words.
        trainer: the Trainer's ``optim`` name.
        imports: the import line code needs (empty: torch's own).
        make: the class as code calls it, after ``imports``.
        full_name: the class with its module, for messages.
        keywords: keywords code passes besides the parameters and ``lr``.
        deepspeed: DeepSpeed's own optimizer type, or empty where DeepSpeed takes it as a client optimizer.
    """

    title: str
    trainer: str
    imports: str
    make: str
    full_name: str
    keywords: str = ""
    deepspeed: str = ""


OPTIMIZER_FORMS = {
    # "adamw_torch_fused" is the Trainer's own default optim from torch 2.8: memlab's "adamw" is that optimizer.
    "adamw": OptimizerForm("AdamW", "adamw_torch_fused", "", "torch.optim.AdamW", "torch.optim.AdamW",
                           deepspeed="AdamW"),
    "adamw8bit": OptimizerForm("8-bit AdamW", "adamw_bnb_8bit", "import bitsandbytes as bnb", "bnb.optim.AdamW8bit",
                               "bitsandbytes.optim.AdamW8bit"),
    "paged_adamw8bit": OptimizerForm("paged 8-bit AdamW", "paged_adamw_8bit", "import bitsandbytes as bnb",
                                     "bnb.optim.PagedAdamW8bit", "bitsandbytes.optim.PagedAdamW8bit"),
    "adafactor": OptimizerForm("Adafactor", "adafactor", "from transformers.optimization import Adafactor",
                               "Adafactor", "transformers.optimization.Adafactor",
                               keywords="scale_parameter=False, relative_step=False"),
    # What a plain loop's torch.optim.AdamW(params) runs on CUDA. The Trainer's "adamw_torch" builds torch's AdamW
    # with its defaults, so foreach on CUDA too; DeepSpeed's own "AdamW" is its fused kernel, so DeepSpeed takes
    # this one as a client optimizer.
    "adamw_foreach": OptimizerForm("torch's foreach AdamW", "adamw_torch", "", "torch.optim.AdamW",
                                   "torch.optim.AdamW", keywords="foreach=True"),
}
"""Each optimizer's :class:`OptimizerForm`, by memlab's name."""

OPTIMIZER_RANK = {"paged_adamw8bit": -1, "adamw8bit": 0, "adamw": 1, "adamw_foreach": 2}
"""Lower rank = fewer optimizer bytes for the same parameters; optimizers not listed compare only with themselves.
Paged 8-bit AdamW ranks below the unpaged one: on CUDA its large states live outside PyTorch's allocator. The
foreach AdamW ranks above the fused one: the same state, and its update holds a temporary the size of the weights
(``torch._foreach_sqrt`` of the second moments) where the fused kernel holds none. Adafactor is not ranked: its
state is far smaller, but its update's temporaries can be larger than fused AdamW's."""


def _optimizer_needs_at_least(mine: str, theirs: str) -> bool:
    if mine not in OPTIMIZER_RANK or theirs not in OPTIMIZER_RANK:
        return False
    return OPTIMIZER_RANK[mine] >= OPTIMIZER_RANK[theirs]


def optimizer_code(plan: PlanLike, *, fused: bool = True) -> str:
    """The expression that builds the plan's optimizer over ``{params}`` with ``lr`` (a template the engines fill
    in), as memlab builds it: fused AdamW where ``{device}`` has the kernel (``fused=False``: torch's default, what
    the accelerate script's sharded parameters take), after the import line of :data:`OPTIMIZER_FORMS`.

    Example:
        >>> from memlab.plan import Plan
        >>> optimizer_code(Plan(optimizer="adafactor"))
        'Adafactor({params}, lr=lr, scale_parameter=False, relative_step=False)'
    """
    form = OPTIMIZER_FORMS[plan.optimizer]
    extra = f", {form.keywords}" if form.keywords else ""
    if plan.optimizer == "adamw" and fused:
        extra = ', fused={device}.type in ("cuda", "cpu")'
    return f"{form.make}({{params}}, lr=lr{extra})"


def _optimizer_for_deepspeed(plan: PlanLike) -> Fragment:
    form = OPTIMIZER_FORMS[plan.optimizer]
    if form.deepspeed:
        return Keys({"optimizer": {
            "type": form.deepspeed,
            "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
        }})
    keywords = f" ({form.keywords})" if form.keywords else ""
    comments = [
        f"{form.title} is not a DeepSpeed optimizer: create {form.full_name}{keywords} yourself and pass it "
        f"(Trainer(optimizers=(optimizer, None)), or TrainingArguments(optim={form.trainer!r}), or "
        "deepspeed.initialize(optimizer=optimizer))"
    ]
    keys: dict[str, object] = {"zero_allow_untested_optimizer": True}
    if plan.offloads_optimizer:
        keys["zero_force_ds_cpu_optimizer"] = False
        comments.append(
            "optimizer offload with a client optimizer: DeepSpeed's own CPU Adam is not used, so the "
            "update runs wherever that optimizer runs it"
        )
    return Keys({**keys, "_comment": "; ".join(comments)})


def _optimizer(target: str) -> Export:
    def fragment(plan: PlanLike) -> Fragment:
        form = OPTIMIZER_FORMS[plan.optimizer]
        imports = (form.imports,) if form.imports else ()
        if target == "trainer":
            return Keys({"optim": form.trainer})
        if target == "deepspeed":
            return _optimizer_for_deepspeed(plan)
        if target == "code":
            note = ("# Fused AdamW where torch has the kernel: the Trainer's default optim adamw_torch_fused",) if (
                plan.optimizer == "adamw") else ()
            return Code(imports=imports, before_optimizer=note, optimizer=optimizer_code(plan))
        if target == "accelerate":
            return Accelerate(script=Code(imports=imports, optimizer=optimizer_code(plan, fused=False)))
        return Elsewhere()

    return fragment


_AUTOCAST = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}


def _precision(target: str) -> Export:
    def fragment(plan: PlanLike) -> Fragment:
        half = plan.precision
        if target == "trainer":
            return Keys({"bf16": half == "bf16", "fp16": half == "fp16"})
        if target == "deepspeed":
            return Keys({"bf16": {"enabled": True}} if half == "bf16" else {
                "fp16": {"enabled": True, "loss_scale": 0}} if half == "fp16" else {})
        if target == "accelerate":  # accelerate's autocast and fp16 loss scaling come from the config
            # accelerate's mixed_precision="fp8" is bf16 autocast with float8 linear layers (the fp8 lever's)
            fp8 = getattr(plan, "fp8", False)
            return Accelerate(config={"mixed_precision": "fp8" if fp8 else {"fp32": "no"}.get(half, half)})
        if target != "code" or half == "fp32":
            return Code() if target == "code" else Elsewhere()
        autocast = Code(contexts=(f"torch.autocast(device.type, dtype={_AUTOCAST[half]})",))
        if half == "bf16":
            return autocast
        return autocast + Code(
            after_optimizer=("scaler = torch.amp.GradScaler(device.type)  # dynamic loss scaling for fp16",),
            backward="scaler.scale(loss).backward()",
            step=("scaler.step(optimizer)", "scaler.update()"),
        )

    return fragment


def _in_backward_conflicts(plan: PlanLike) -> str:
    if not plan.optimizer_in_backward:
        return ""
    if plan.accumulation > 1:
        return (
            "optimizer_in_backward steps in backward, so it cannot accumulate; write accumulation=1 (a larger "
            "micro_batch) or optimizer_in_backward=False"
        )
    if plan.offload in ("optimizer", "all"):
        return (
            "optimizer_in_backward steps each parameter on the device during backward, so it cannot offload the "
            f"optimizer (offload={plan.offload!r}); write offload='none' or 'activations', "
            "or optimizer_in_backward=False"
        )
    if plan.precision == "fp16":
        return (
            "optimizer_in_backward steps each parameter before the other gradients exist, so fp16's GradScaler "
            "cannot unscale them all first; write precision='bf16' or 'fp32', or optimizer_in_backward=False"
        )
    return ""


def _in_backward_elsewhere(target: str) -> Export:
    def refusal(plan: PlanLike) -> Fragment:
        if not plan.optimizer_in_backward:
            return Keys() if target in ("trainer", "deepspeed") else Accelerate()
        return (
            f"optimizer_in_backward=True is not expressible in {target}; use the code export (plan.to_code()), "
            "or export plan.replace(optimizer_in_backward=False)"
        )

    return refusal


def _in_backward_code(plan: PlanLike) -> Fragment:
    if not plan.optimizer_in_backward:
        return Code()
    form = OPTIMIZER_FORMS[plan.optimizer]
    extra = ', fused=device.type in ("cuda", "cpu")' if plan.optimizer == "adamw" else (
        f", {form.keywords}" if form.keywords else "")
    return Code(after_optimizer=(
        "# Optimizer in backward: each parameter has its own optimizer, stepped as soon as its gradient is",
        "# accumulated, so the gradients never all exist at once (`optimizer.step()` below finds none: a no-op)",
        f"optimizers = {{p: {form.make}([p], lr=lr{extra}) for p in params}}",
        "",
        "",
        "def step_in_backward(p):",
        "    optimizers[p].step()",
        "    optimizers[p].zero_grad(set_to_none=True)",
        "",
        "",
        "for p in params:",
        "    p.register_post_accumulate_grad_hook(step_in_backward)",
    ))


CHUNKS = 8
"""Chunks of tokens the chunked loss cuts the head and the cross-entropy into (torchtune's uses 8 too)."""

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
        "        checkpoint(chunk_loss, head, h, y, use_reentrant=False)",
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

DECLARATIONS = (
    Lever(
        "precision",
        "fp32",
        short="{}",
        choices=("fp32", "bf16", "fp16"),
        help="autocast compute dtype: bf16/fp16 halve activations and are faster on GPUs; fp16 scales the loss",
        technique=PRECISION,
        activation_key=lambda value: value,
        speed={"bf16": (1.6, 1.0), "fp16": (1.6, 0.3)},
        exports=per_target(_precision),
    ),
    Lever(
        "optimizer",
        "adamw",
        short="{}",
        choices=tuple(OPTIMIZER_FORMS),
        help="adamw keeps 8 bytes of state per weight; adamw8bit (bitsandbytes) about 2, at a small cost in accuracy; "
        "paged_adamw8bit the same, paged to CPU memory under pressure (CUDA only); adafactor factors its second "
        "moments (a row and a column per matrix, no first moment): far less state, updates differ from Adam's; "
        "adamw_foreach is the AdamW a plain loop builds on CUDA (foreach): adamw's state plus a temporary the size "
        "of the weights in its update (to estimate your own loop, never searched)",
        technique=OPTIMIZER,
        needs_at_least=_optimizer_needs_at_least,
        optimizer_state={"adamw8bit": 0.25, "paged_adamw8bit": 0.0, "adafactor": 0.0},
        speed={"adamw8bit": (0.97, 0.97), "paged_adamw8bit": (0.97, 0.97), "adafactor": (0.9, 0.9),
               "adamw_foreach": (0.98, 0.95)},
        # Adafactor's updates differ from Adam's: suggested, never searched by default. The foreach AdamW is the
        # user's own loop, to be estimated as it is, not a lever: more memory than the fused one and no faster, so
        # neither searched (search.space.default_space lists adamw and adamw8bit) nor suggested.
        suggest=("adafactor",),
        on_cpu=lambda value: "adamw8bit" if value == "paged_adamw8bit" else value,
        on_cpu_note="paged 8-bit AdamW pages only on CUDA; on a CPU it is the unpaged 8-bit AdamW",
        exports=per_target(_optimizer),
    ),
    *OFFLOAD_DECLARATIONS,  # in its own module (techniques/offload.py), in the Plan's field order here
    Lever(
        "loss",
        "full",
        short="{}-loss",
        choices=("full", "chunked"),
        help="chunked computes a causal LM's head and cross-entropy a chunk of tokens at a time: the full logits "
        "never exist at once (same loss); the head runs twice per chunk (default loss and LM head only)",
        technique=LOSS,
        slower=(("chunked", "full"),),
        activation_key=lambda value: value,
        speed={"chunked": (0.95, 0.95)},
        exports=per_target(_loss),
    ),
    Lever(
        "optimizer_in_backward",
        False,
        short="opt-in-bwd",
        help="each weight gets its own optimizer, stepped in backward as soon as its gradient exists: the gradients "
        "never all exist at once (about the largest weight's instead of all); no accumulation, fp16 or optimizer "
        "offload with it",
        technique=IN_BACKWARD,
        conflicts=_in_backward_conflicts,
        needs_at_least=lambda mine, theirs: not mine,
        family=True,
        least_grads={True: 0.0},
        exports={
            "trainer": _in_backward_elsewhere("TrainingArguments"),
            "deepspeed": _in_backward_elsewhere("a DeepSpeed config (ZeRO steps its optimizer after backward)"),
            "code": _in_backward_code,
            "peft": concerns_adapters_only,
            "accelerate": _in_backward_elsewhere("the accelerate script (sharded optimizers step after backward)"),
        },
    ),
    Lever(
        "compile",
        False,
        short="compiled",
        help="torch.compile on the model's forward (and backward): fused kernels, often less activation memory and "
        "faster steps; the first step compiles (seconds to minutes, reported apart from the speed)",
        technique=COMPILE,
        conflicts=compile_conflicts,
        activation_key=lambda value: value,
        speed={True: (1.2, 1.0)},
        exports=per_target(compile_export),
    ),
)
