"""The trainer section of the GPU acceptance run (see :mod:`benchmarks.gpu_acceptance`): memlab on trainers as
people run them, on the GPU.

Two trainers on the same Llama shape (this section runs the first; the ``sft_peft`` part,
:mod:`benchmarks.gpu_sections_peft`, runs the second with the helpers here):

- a plain transformers ``Trainer`` whose dataset is a plain torch Dataset of random token rows of uneven lengths (a
  quarter of them four times as long as the rest), padded per batch;
- TRL's ``SFTTrainer`` with ``packing=True`` (rows packed to ``max_length`` tokens, padding-free, as TRL packs) and
  ``peft_config=LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules="all-linear")``, in bf16 on a GPU
  (issue 40). TRL and ``datasets`` are not in the GPU image: carry their wheels (see
  :mod:`benchmarks.gpu_acceptance`); where either does not import, its checks say why (None).

For each: ``memlab.fit(trainer, budget=...)`` on a budget between the trainer's own plan and a checkpointed,
accumulated one, then a real ``trainer.train()`` of the chosen plan under ``memlab.watch(trainer, budget=...)``:
every step within the budget. Then ``watch``'s overhead per step: ``train()`` with and without ``watch``, in
alternating order, each step timed between two ``on_step_end`` callbacks of a timer added last (synchronised with
the GPU); on CUDA ``watch`` reads each step's peak from the caching allocator (``max_memory_allocated``, reset at
the step's start), the probe a user gets. The goal is an overhead under 3% (ratio of the median step times < 1.03),
judged on a GPU only: on the CPU ``watch`` reads each step with memlab's tracker, which costs more by design. No
figure is drawn (plotly is not in the GPU image).
"""

from __future__ import annotations

import dataclasses
import random
import statistics
import tempfile
import warnings
from typing import Any

import torch

from benchmarks import common
from benchmarks.gpu_common import (
    SIZES,
    Checks,
    Llama,
    build_llama,
    card_figures,
    is_cuda,
    trial_row,
)

OVERHEAD_GOAL = 1.03
LORA = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "target_modules": "all-linear"}
"""The SFT trainer's ``LoraConfig``: a recipe's adapters on every linear layer, with dropout."""


class TokenRows(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """``count`` examples of random tokens, a quarter of them ``longest`` tokens long and the rest a quarter of
    that: a dataset whose worst batch costs far more than a typical one."""

    def __init__(self, *, vocab: int, count: int, longest: int, seed: int = 4) -> None:
        generator = torch.Generator().manual_seed(seed)
        lengths = [longest if index % 4 == 3 else max(2, longest // 4) for index in range(count)]
        self.rows = [torch.randint(1, vocab, (n,), generator=generator) for n in lengths]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.rows[index]}


def pad(examples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Pad to the longest example; padding is not learned (label -100)."""
    longest = max(len(example["input_ids"]) for example in examples)
    ids = torch.zeros(len(examples), longest, dtype=torch.long)
    labels = torch.full((len(examples), longest), -100, dtype=torch.long)
    for row, example in enumerate(examples):
        n = len(example["input_ids"])
        ids[row, :n] = example["input_ids"]
        labels[row, :n] = example["input_ids"]
    return {"input_ids": ids, "labels": labels}


def make_trainer(shape: Llama, spec: dict[str, Any], device: torch.device, folder: str) -> Any:
    """The plain Trainer: a Llama of ``shape``, random rows of uneven lengths padded per batch."""
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(
        output_dir=folder, report_to=[], save_strategy="no", max_steps=spec["steps"],
        per_device_train_batch_size=shape.rows, logging_steps=1, disable_tqdm=True, learning_rate=1e-4, seed=0,
        use_cpu=not is_cuda(device), dataloader_num_workers=0,
    )
    data = TokenRows(vocab=shape.vocab, count=spec["examples"], longest=spec["longest"])
    return Trainer(model=build_llama(shape, device), args=args, train_dataset=data, data_collator=pad)


def sft_missing() -> str | None:
    """Why the SFT trainer cannot run here (TRL, ``datasets`` or peft does not import), or None."""
    for module in ("trl", "datasets", "peft"):
        try:
            __import__(module)
        except Exception as error:  # noqa: BLE001 - a broken install is as missing as an absent one
            return (f"{module} does not import ({type(error).__name__}: {str(error)[:200]}); carry its wheel: see "
                    "benchmarks/gpu_acceptance.py")
    return None


def word_tokenizer() -> Any:
    """A word-level tokenizer made here (nothing downloaded): the SFT trainer's ``processing_class``, which gives it
    the pad and end-of-sequence tokens (ids 0 and 2); the dataset is tokenized already."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, "[EOS]": 2, **{f"w{i}": i + 3 for i in range(61)}}
    words = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=words, pad_token="[PAD]", unk_token="[UNK]", eos_token="[EOS]")


def make_sft_trainer(shape: Llama, spec: dict[str, Any], device: torch.device, folder: str) -> Any:
    """TRL's SFTTrainer: the same Llama, random token rows packed to ``max_length`` (TRL's packing, padding-free),
    LoRA adapters from ``peft_config`` with dropout 0.05, bf16 on a GPU."""
    import trl
    from datasets import Dataset
    from peft import LoraConfig

    sft = spec["sft"]
    args = trl.SFTConfig(
        output_dir=folder, report_to=[], save_strategy="no", max_steps=sft["steps"],
        per_device_train_batch_size=shape.rows, logging_steps=1, disable_tqdm=True, learning_rate=1e-4, seed=0,
        use_cpu=not is_cuda(device), dataloader_num_workers=0, bf16=is_cuda(device), packing=True,
        max_length=sft["max_length"],
    )
    rows = TokenRows(vocab=shape.vocab, count=sft["examples"], longest=sft["longest"]).rows
    data = Dataset.from_dict({"input_ids": [row.tolist() for row in rows]})
    model: Any = build_llama(shape, device)
    model.config.pad_token_id = 0
    return trl.SFTTrainer(model=model, args=args, train_dataset=data, processing_class=word_tokenizer(),
                          peft_config=LoraConfig(task_type="CAUSAL_LM", **LORA))


def verdict(trial: Any) -> int:
    """The figure a budget verdict judges: the card figure where this memlab has one, else the allocated peak."""
    return int(getattr(trial, "verdict_bytes", trial.peak_bytes))


def fit_then_train(trainer: Any, rows: int, steps: int, checks: Checks, label: str, *,
                   narrow: bool = False, max_trials: int | None = None) -> dict[str, Any]:
    """``fit(trainer, budget=...)`` on a budget halfway between the trainer's own plan and a checkpointed one that
    accumulates micro-batches of 2, then ``trainer.train()`` of the chosen plan under ``watch``: the figures, and
    the checks added to ``checks`` (their names start with ``label``). The search varies the micro-batch and
    checkpointing, and the other axes of fit's default space; ``narrow`` (the CPU sizes, which exercise the code)
    keeps the trainer's own precision and optimizer; ``max_trials`` caps the plans fit measures."""
    import memlab
    from memlab.errors import MemlabWarning
    from memlab.trainer.source import TrainerSource

    fast: dict[str, Any] = {"steps": 1, "warmup": 1, "noise": 0, "progress": False}
    own = TrainerSource.from_trainer(trainer).plan  # the trainer's own settings (its adapters, its precision)
    plain = memlab.measure(trainer, plan=own, **fast)  # no batch: the dataset's worst
    small = memlab.measure(trainer, plan=own.replace(micro_batch=2, accumulation=rows // 2, checkpointing=True),
                           **fast)
    budget = (verdict(plain) + verdict(small)) // 2
    space: dict[str, list[Any]] = {"micro_batch": sorted({rows, rows // 2, 2}, reverse=True),
                                   "checkpointing": [False, True]}
    if narrow:
        space.update(precision=[own.precision], optimizer=[own.optimizer])
    report = memlab.fit(trainer, budget=budget, space=space, **fast,
                        **({} if max_trials is None else {"max_trials": max_trials}))
    best = report.best
    checks.add(f"{label}: fit(trainer) found a plan within the budget", best is not None and best.fits,
               budget=budget, plain=verdict(plain), small=verdict(small),
               best=None if best is None else best.plan.label(), own=own.label())
    watched_steps: list[Any] = []
    peak = None
    caught: list[Any] = []
    if best is not None:
        # The plan on the trainer until the block ends (undone then), every warning kept to be counted.
        checks.add(f"{label}: fit(trainer) picked what the Trainer's switch can run (every block or none)",
                   type(best.plan.checkpointing) is bool, checkpointing=best.plan.checkpointing)
        with memlab.apply(trainer, best.plan), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            watched = memlab.watch(trainer, budget=budget, show=False)
            try:
                trainer.train()
            finally:
                watched.remove()
        peak = watched.peak_bytes
        timeline = getattr(watched, "timeline", None)  # issue 45: the costliest step's, from the allocator's history
        timeline_peak = None if timeline is None else timeline.peak.bytes
        checks.add(f"{label}: watch kept its costliest step's timeline, its peak the watched peak",
                   timeline_peak is not None and peak is not None and timeline_peak == peak,
                   timeline_peak=timeline_peak, watched_peak=peak,
                   timeline_label=None if timeline is None else timeline.label)
        watched_steps = [dataclasses.asdict(step) if dataclasses.is_dataclass(step) and not isinstance(step, type)
                         else str(step) for step in watched.steps]
        checks.add(f"{label}: trainer.train() ran its {steps} steps under watch", len(watched.steps) == steps,
                   steps=len(watched.steps))
        checks.add(f"{label}: every watched step stayed within the budget", peak is not None and peak <= budget,
                   peak=peak, budget=budget)
    # watch warns once where a step comes within 10% of the budget, by design; any other warning is a fault.
    near = peak is not None and peak >= 0.9 * budget
    warned = [str(w.message)[:300] for w in caught if issubclass(w.category, MemlabWarning)]
    unexpected = [message for message in warned if not (near and "within 10%" in message)]
    checks.add(f"{label}: memlab warned of nothing but a step within 10% of the budget",
               not unexpected if best is not None else None, warnings=warned, near_budget=near)
    return {
        "own_plan": own.label(), "plain": trial_row(plain), "small": trial_row(small), "budget_bytes": budget,
        "fit": {"best": None if best is None else trial_row(best), "trials": [trial_row(t) for t in report.trials]},
        "watched_peak_bytes": peak, "watched_steps": watched_steps[:20],
        "best_card": card_figures(best) if best else None,
    }


def watch_overhead(trainer: Any, budget: int | None, spec: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """Median seconds per step of ``trainer.train()`` with and without ``memlab.watch`` (``spec``: rounds, steps per
    train(), warm-up steps dropped from each), sides alternating in order round by round; the ratio watch / plain."""
    from benchmarks.watch_overhead import timed_train

    saved = trainer.args.max_steps
    trainer.args.max_steps = spec["steps"]
    times: dict[str, list[list[float]]] = {"plain": [], "watch": []}
    try:
        for number in range(spec["rounds"]):
            for side in ("plain", "watch") if number % 2 == 0 else ("watch", "plain"):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    steps, _ = timed_train(trainer, spec["warmup"], watch=side == "watch", budget=budget)
                times[side].append(steps)
    finally:
        trainer.args.max_steps = saved
    medians = {side: common.median([t for block in blocks for t in block]) for side, blocks in times.items()}
    plain, watched_median = medians["plain"], medians["watch"]
    ratio = None if not plain or watched_median is None else round(watched_median / plain, 4)
    return {"rounds": spec["rounds"], "steps_per_train": spec["steps"], "warmup_dropped": spec["warmup"],
            "step_time_s_median": {side: common.rounded(value, 6) for side, value in medians.items()},
            "ratio": ratio, "goal": OVERHEAD_GOAL,
            "probe": "the caching allocator (max_memory_allocated)" if is_cuda(device) else "memlab's tracker",
            "step_times_s": {side: [[round(t, 6) for t in block] for block in blocks]
                             for side, blocks in times.items()}}


def ratio_interval(plain: list[float], watched: list[float], confidence: float = 0.95,
                   resamples: int = 2000) -> tuple[float, float]:
    """The interval that holds the ratio of the two sides' median step times with ``confidence``: the bootstrap's
    (each side's steps drawn again with replacement, ``resamples`` times, with a fixed seed), percentiles of the
    ratios. Written here because the one library with it (scipy.stats.bootstrap) is not in the GPU image."""
    draw = random.Random(0)
    ratios = sorted(statistics.median(draw.choices(watched, k=len(watched)))
                    / statistics.median(draw.choices(plain, k=len(plain))) for _ in range(resamples))
    tail = round((1 - confidence) / 2 * resamples)
    return ratios[tail], ratios[resamples - 1 - tail]


def overhead_check(checks: Checks, label: str, overhead: dict[str, Any], device: torch.device) -> None:
    """The watch's overhead judged on the ratio's own 95% interval (:func:`ratio_interval`): under the goal it
    passes, over it fails, and across it the steps' spread cannot tell (on an H200, 0.12 s steps of a 0.5B LoRA step
    spread from 0.09 to 0.16 s): not judged, said so."""
    ratio = overhead["ratio"]
    times = {side: [t for block in blocks for t in block] for side, blocks in overhead["step_times_s"].items()}
    interval = None
    if len(times.get("plain", [])) > 1 and len(times.get("watch", [])) > 1:
        low, high = ratio_interval(times["plain"], times["watch"])
        interval = [round(low, 4), round(high, 4)]
    passed: bool | None = None
    why = None
    if not is_cuda(device):
        why = "judged on a GPU: on the CPU watch reads each step with the tracker"
    elif interval is None:
        why = "too few steps to judge"
    elif interval[1] < OVERHEAD_GOAL:
        passed = True
    elif interval[0] >= OVERHEAD_GOAL:
        passed = False
    else:
        why = (f"the ratio's 95% interval {interval[0]}..{interval[1]} holds the goal {OVERHEAD_GOAL}: the steps' own "
               "spread is wider than what is judged")
    checks.add(f"{label}: watch's overhead per step under 3%", passed, ratio=ratio,
               medians=overhead["step_time_s_median"], interval=interval, why=why)


def section_trainer(size: str, device: torch.device) -> dict[str, Any]:
    """11. ``fit(trainer, budget=...)``, then ``trainer.train()`` of the chosen plan under ``watch``: within the
    budget at every step, for a plain Trainer; ``watch``'s overhead per step. (TRL's SFTTrainer with a peft config
    is the ``sft_peft`` part's: :mod:`benchmarks.gpu_sections_peft`.)"""
    spec = SIZES[size]["trainer"]
    shape: Llama = spec["shape"]
    checks = Checks()
    with tempfile.TemporaryDirectory(prefix="memlab-trainer-") as folder:
        trainer = make_trainer(shape, spec, device, folder)
        plain = fit_then_train(trainer, shape.rows, spec["steps"], checks, "Trainer", narrow=size != "full")
        overhead = watch_overhead(trainer, plain["budget_bytes"], spec["overhead"], device)
        overhead_check(checks, "Trainer", overhead, device)
        del trainer
        common.release(device)
    return {
        "model": dataclasses.asdict(shape), "dataset": {"examples": spec["examples"], "longest": spec["longest"]},
        **plain, "overhead": overhead, "checks": checks.items,
    }


def trainer_dropout(trainer: Any) -> float | None:
    """The ``lora_dropout`` memlab reads from ``trainer``'s own settings."""
    from memlab.trainer.source import TrainerSource

    return getattr(TrainerSource.from_trainer(trainer).plan, "lora_dropout", None)
