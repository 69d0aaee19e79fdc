"""The declarations of the levers that change the optimizer step: precision, the optimizer, offload, the chunked
loss and the optimizer in backward (techniques: :mod:`memlab.techniques.precision`,
:mod:`memlab.techniques.optimizer`, :mod:`memlab.techniques.offload`, :mod:`memlab.techniques.loss`,
:mod:`memlab.techniques.optimizer_in_backward`; facets: :mod:`memlab.techniques.lever`). How each optimizer is named
in each export is here too (:data:`OPTIMIZER_FORMS`), once.

Example:
    >>> [lever.name for lever in DECLARATIONS]
    ['precision', 'optimizer', 'offload', 'loss', 'optimizer_in_backward']
    >>> OPTIMIZER_FORMS["adafactor"].trainer
    'adafactor'
"""

from __future__ import annotations

from dataclasses import dataclass

from memlab.techniques.lever import TARGETS, Lever, PlanLike, Refusal, carried, concerns_adapters_only
from memlab.techniques.loss import LOSS
from memlab.techniques.offload import OFFLOAD
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


def _activation_offload_for_the_trainer(plan: PlanLike) -> str:
    if not plan.offloads_activations or plan.checkpointing:
        return ""
    return (
        f"offload={plan.offload!r} without checkpointing has no Trainer form: the Trainer offloads only "
        "checkpointed activations; write checkpointing=True with it, or use plan.to_code() (save_on_cpu)"
    )


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


def _in_backward_elsewhere(target: str) -> Refusal:
    def refusal(plan: PlanLike) -> str:
        if not plan.optimizer_in_backward:
            return ""
        return (
            f"optimizer_in_backward=True is not expressible in {target}; use the code export (plan.to_code()), "
            "or export plan.replace(optimizer_in_backward=False)"
        )

    return refusal


def _in_backward_code(plan: PlanLike) -> list[str]:
    if not plan.optimizer_in_backward:
        return []
    form = OPTIMIZER_FORMS[plan.optimizer]
    extra = ', fused=device.type in ("cuda", "cpu")' if plan.optimizer == "adamw" else (
        f", {form.keywords}" if form.keywords else "")
    return [
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
    ]


CHUNKS = 8
"""Chunks of tokens the chunked loss cuts the head and the cross-entropy into (torchtune's uses 8 too)."""

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
        exports=dict(dict.fromkeys(TARGETS, carried), peft=concerns_adapters_only),
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
        exports=dict(dict.fromkeys(TARGETS, carried), peft=concerns_adapters_only),
    ),
    Lever(
        "offload",
        "none",
        short="offload-{}",
        choices=("none", "optimizer", "activations", "all"),
        help="moves optimizer state and/or saved activations to CPU memory: less GPU memory, slower steps",
        technique=OFFLOAD,
        slower=(("optimizer", "none"), ("activations", "none"), ("all", "none")),
        activation_key=lambda value: value in ("activations", "all"),
        # Offloaded optimizer state is not on the device at all.
        optimizer_state={"optimizer": 0.0, "all": 0.0},
        speed={"optimizer": (0.7, 0.7), "activations": (0.6, 0.6), "all": (0.5, 0.5)},
        on_cpu=lambda value: "none",
        exports={
            "trainer": _activation_offload_for_the_trainer,
            "deepspeed": carried,
            "code": carried,
            "peft": concerns_adapters_only,
            "accelerate": carried,
        },
    ),
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
        exports=dict(dict.fromkeys(TARGETS, carried), peft=concerns_adapters_only),
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
        code=_in_backward_code,
        needs_at_least=lambda mine, theirs: not mine,
        family=True,
        least_grads={True: 0.0},
        exports={
            "trainer": _in_backward_elsewhere("TrainingArguments"),
            "deepspeed": _in_backward_elsewhere("a DeepSpeed config (ZeRO steps its optimizer after backward)"),
            "code": carried,
            "peft": concerns_adapters_only,
            "accelerate": _in_backward_elsewhere("the accelerate script (sharded optimizers step after backward)"),
        },
    ),
)
