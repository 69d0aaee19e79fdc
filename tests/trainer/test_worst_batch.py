"""From an OOM in ``trainer.train()`` to a plan that fits: ``memlab.fit(trainer)`` measures the train dataset's worst
batch, so the plan it picks stays under the budget for a whole epoch, while the plan picked from a typical batch
goes over it on the long tail (the issue's must-show, on CPU, with transformers' Trainer and TRL's SFTTrainer)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

pytest.importorskip("datasets")
from datasets import Dataset  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments  # noqa: E402

import memlab  # noqa: E402
from memlab.errors import MemlabWarning  # noqa: E402
from memlab.trainer import TrainerSource  # noqa: E402

SHORT, LONG, ROWS = 12, 192, 4  # most examples are short; a few are 16x longer
LENGTHS = [SHORT] * 28 + [LONG] * 4
FAST: dict[str, Any] = {"steps": 1, "warmup": 0, "noise": 0, "progress": False}
SPACE = {"micro_batch": [4, 2, 1], "checkpointing": [False, True]}
TYPICAL_SPACE = {"micro_batch": [4], "checkpointing": [False]}


def tiny_model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=4, vocab_size=64, max_position_embeddings=256)
    return LlamaForCausalLM(config)


def pad(examples: list[dict]) -> dict[str, torch.Tensor]:
    longest = max(len(e["input_ids"]) for e in examples)
    ids = torch.zeros(len(examples), longest, dtype=torch.long)
    labels = torch.full((len(examples), longest), -100, dtype=torch.long)
    for row, example in enumerate(examples):
        n = len(example["input_ids"])
        ids[row, :n] = torch.tensor(example["input_ids"])
        labels[row, :n] = ids[row, :n]
    return {"input_ids": ids, "labels": labels}


def make_trainer(tmp_path: Any) -> Trainer:
    data = Dataset.from_dict({"input_ids": [[(i + j) % 63 + 1 for j in range(n)] for i, n in enumerate(LENGTHS)]})
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, save_strategy="no",
                             num_train_epochs=1, per_device_train_batch_size=ROWS, disable_tqdm=True,
                             learning_rate=1e-3, seed=0)
    return Trainer(model=tiny_model(), args=args, train_dataset=data, data_collator=pad)


def train_watched(trainer: Any, plan: memlab.Plan, budget: int) -> tuple[int, int]:
    """Train the plan for one epoch under memlab.watch: the watched peak and how many warnings memlab gave. The
    trainer comes back afterwards."""
    applied = memlab.apply(trainer, plan)
    watched = memlab.watch(trainer, budget=budget)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.train()
    finally:
        watched.remove()
        applied.undo()
    assert watched.peak_bytes is not None and len(watched.steps) == len(LENGTHS) // ROWS
    return watched.peak_bytes, sum(issubclass(w.category, MemlabWarning) for w in caught)


@pytest.mark.slow
def test_fit_on_the_worst_batch_stays_under_the_budget_where_a_typical_batch_pick_does_not(tmp_path: Any) -> None:
    trainer = make_trainer(tmp_path)
    source = TrainerSource.from_trainer(trainer)
    typical = pad([trainer.train_dataset[i] for i in range(ROWS)])
    plain = memlab.Plan()
    typical_peak = memlab.measure(trainer, typical, plain, **FAST).peak_bytes
    worst_trial = memlab.measure(trainer, plain, **FAST)  # no batch: the dataset's worst
    assert "worst batch" in " ".join(worst_trial.notes) and str(LONG) in " ".join(worst_trial.notes)
    assert worst_trial.peak_bytes > 1.5 * typical_peak
    budget = (typical_peak + worst_trial.peak_bytes) // 2

    from_worst = memlab.fit(trainer, budget=budget, space=SPACE, **FAST).best
    # Sized by a typical batch, the trainer's own setting fits, and is what a search there keeps: over SPACE the pick
    # among the plans that fit a typical batch is the fastest, which a busy machine's timings decide (the floor
    # stack's run at load 4 picked mb1x4, which fits the worst batch too), so the typical search is given the one.
    from_typical = memlab.fit(trainer, typical, budget=budget, space=TYPICAL_SPACE, **FAST).best
    assert from_worst is not None and from_typical is not None
    assert from_worst.plan != from_typical.plan
    assert from_worst.rows_per_step == from_typical.rows_per_step == source.effective_batch

    under, _ = train_watched(trainer, from_worst.plan, budget)
    over, warned = train_watched(trainer, from_typical.plan, budget)
    assert under <= budget < over, (under, budget, over, from_worst.plan.label(), from_typical.plan.label())
    assert warned == 1  # once, however many steps went past the budget


def make_sft_trainer(tmp_path: Any) -> Any:
    trl = pytest.importorskip("trl")
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = [f"short text number {i % 7} here and there more words" for i in range(28)]
    texts += [" ".join(f"long{j % 40}" for j in range(LONG - 2))] * 4
    words = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    words.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]", "[EOS]"]))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, pad_token="[PAD]", unk_token="[UNK]",
                                        eos_token="[EOS]")
    config = trl.SFTConfig(output_dir=str(tmp_path), report_to=[], use_cpu=True, save_strategy="no",
                           num_train_epochs=1, per_device_train_batch_size=ROWS, disable_tqdm=True, seed=0,
                           max_length=256)
    model = tiny_model()
    model.resize_token_embeddings(len(tokenizer))
    return trl.SFTTrainer(model=model, args=config, train_dataset=Dataset.from_dict({"text": texts}),
                          processing_class=tokenizer)


@pytest.mark.slow
def test_the_same_with_trl_sft_trainer(tmp_path: Any) -> None:
    sft = make_sft_trainer(tmp_path)
    source = TrainerSource.from_trainer(sft)
    columns = ["input_ids"]
    typical = sft.data_collator([{k: sft.train_dataset[i][k] for k in columns} for i in range(ROWS)])
    typical = {k: v for k, v in typical.items() if isinstance(v, torch.Tensor)}
    plain = memlab.Plan()
    typical_peak = memlab.measure(sft, typical, plain, **FAST).peak_bytes
    worst_peak = memlab.measure(sft, plain, **FAST).peak_bytes
    assert worst_peak > 1.5 * typical_peak
    budget = (typical_peak + worst_peak) // 2
    from_worst = memlab.fit(sft, budget=budget, space=SPACE, **FAST).best
    from_typical = memlab.fit(sft, typical, budget=budget, space=TYPICAL_SPACE, **FAST).best  # as above
    assert from_worst is not None and from_typical is not None and from_worst.plan != from_typical.plan
    assert from_worst.rows_per_step == source.effective_batch
    under, _ = train_watched(sft, from_worst.plan, budget)
    over, _ = train_watched(sft, from_typical.plan, budget)
    assert under <= budget < over, (under, budget, over, from_worst.plan.label(), from_typical.plan.label())


def test_fit_on_a_trainer_searches_only_what_the_trainer_can_run(tmp_path: Any) -> None:
    """The Trainer's checkpointing switch covers every block or none: fit(trainer) never picks checkpointing=k (a plan
    neither apply(trainer) nor to_training_arguments() could carry), while the same search on the model does."""
    trainer = make_trainer(tmp_path)
    batch = pad([trainer.train_dataset[i] for i in range(len(LENGTHS) - ROWS, len(LENGTHS))])  # the long rows
    space = {"micro_batch": [ROWS], "checkpointing": [False, True], "precision": ["fp32"], "optimizer": ["adamw"]}
    plain = memlab.measure(trainer, batch, memlab.Plan(), **FAST).peak_bytes
    every = memlab.measure(trainer, batch, memlab.Plan(checkpointing=True), **FAST).peak_bytes
    budget = (plain + every) // 2

    on_model = memlab.fit(trainer.model, batch, budget=budget, space=space, **FAST)
    assert any(type(t.plan.checkpointing) is int for t in on_model.trials)  # the model alone: blocks searched
    on_trainer = memlab.fit(trainer, batch, budget=budget, space=space, **FAST)
    assert on_trainer.best is not None and on_trainer.best.plan.checkpointing is True
    assert not any(type(t.plan.checkpointing) is int for t in on_trainer.trials)
    assert on_trainer.best.plan.to_training_arguments()  # what fit(trainer) picks, the Trainer's arguments carry
    with memlab.apply(trainer, on_trainer.best.plan):
        assert getattr(trainer.args, "activation_checkpointing", False) or trainer.args.gradient_checkpointing

    args = trainer.args
    with pytest.raises(memlab.MemlabError, match=r"every block or none.*checkpointing=True"):
        memlab.apply(trainer, memlab.Plan(checkpointing=1))
    assert trainer.args is args and not hasattr(trainer, "_memlab_applied")
    with pytest.raises(memlab.MemlabError, match=r"space=\{'checkpointing': \[False, True\]\}"):
        memlab.fit(trainer, batch, budget=budget, space={**space, "checkpointing": [1]}, **FAST)


def test_fit_on_a_trainer_for_cuda_searches_no_optimizer_offload(tmp_path: Any, monkeypatch: Any) -> None:
    """On CUDA fit's default space offloads the optimizer, which a live trainer cannot run (memlab.apply refuses it:
    DeepSpeed): on an H100, fit(sft_trainer) picked offload='all' and apply refused its own answer. A trainer's search
    leaves it out unless the space asks for it; the model's own search keeps it."""
    from memlab.search.fitting import space as fit_space

    on_cuda = fit_space.default_space
    monkeypatch.setattr(fit_space, "default_space",
                        lambda batch_size, device_type, *args, **kwargs: on_cuda(batch_size, "cuda", *args, **kwargs))
    trainer = make_trainer(tmp_path)
    space = {"micro_batch": [ROWS], "checkpointing": [False], "precision": ["fp32"], "optimizer": ["adamw"]}
    def searched_offloads(report: Any) -> set[str]:
        return {t.plan.offload for t in report.trials} | {plan.offload for plan, _ in report.skipped}

    searched = memlab.fit(trainer, budget="1GiB", space=space, dry_run=True, **FAST)
    assert searched_offloads(searched) == {"none"}
    assert searched.best is not None
    with memlab.apply(trainer, searched.best.plan):
        pass
    asked = memlab.fit(trainer, budget="1GiB", space={**space, "offload": ["none", "optimizer"]}, dry_run=True, **FAST)
    assert searched_offloads(asked) == {"none", "optimizer"}
    batch = pad([trainer.train_dataset[i] for i in range(ROWS)])
    on_model = memlab.fit(trainer.model, batch, budget="1GiB", space=space, dry_run=True, **FAST)
    assert searched_offloads(on_model) == {"none", "optimizer", "all"}
