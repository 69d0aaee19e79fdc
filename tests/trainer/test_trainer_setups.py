"""memlab on trainers as people set them up: TRL's SFTTrainer with packing, padding-free batches and a peft config,
a seq2seq trainer, a custom compute_loss, a trainer without train_dataset, and apply/watch/undo/remove in any
order. Tiny models on CPU."""

from __future__ import annotations

import dataclasses
import itertools
import sys
import warnings

import pytest
import torch

pytest.importorskip("trl")
pytest.importorskip("peft")
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import (  # noqa: E402
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    T5Config,
    T5ForConditionalGeneration,
    Trainer,
    TrainingArguments,
)

import memlab  # noqa: E402
from memlab import MemlabError, Plan  # noqa: E402
from memlab.live.batch import StepBatches  # noqa: E402
from memlab.trainer import apply_to_trainer, watch, worst_batch  # noqa: E402
from memlab.trainer.source import TrainerSource  # noqa: E402
from memlab.trainer.watch import batch_lengths  # noqa: E402
from memlab.trainer.worst_batch import trainer_batches  # noqa: E402

LENGTHS = [4, 6, 30, 5, 28, 4, 12, 9]
ROWS = 2


def tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"[PAD]": 0, "[UNK]": 1, "[EOS]": 2, **{f"w{i}": i + 3 for i in range(60)}}
    words = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=words, pad_token="[PAD]", unk_token="[UNK]", eos_token="[EOS]")


def llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=4, vocab_size=64,
                                        max_position_embeddings=128, pad_token_id=0))


def tokens() -> Dataset:
    return Dataset.from_dict({"input_ids": [[(i + j) % 60 + 3 for j in range(n)] for i, n in enumerate(LENGTHS)]})


def sft(tmp_path, **settings) -> trl.SFTTrainer:
    peft_config = settings.pop("peft_config", None)
    args = trl.SFTConfig(output_dir=str(tmp_path), report_to=[], use_cpu=True, save_strategy="no", max_steps=2,
                         per_device_train_batch_size=ROWS, disable_tqdm=True, **settings)
    return trl.SFTTrainer(model=llama(), args=args, train_dataset=tokens(), processing_class=tokenizer(),
                          peft_config=peft_config)


def measured_peak(source: TrainerSource, batch) -> int:
    trial = memlab.measure(source.model, batch, source.plan, loss_fn=source.loss_fn, steps=1, warmup=1, noise=0)
    assert trial.status == "ok", trial.error
    return trial.peak_bytes


def brute_force_peak(trainer) -> int:
    """The costliest micro-batch of every pair of examples, each collated through the trainer's own loader."""
    source = TrainerSource.from_trainer(trainer)
    dataset, best = trainer.train_dataset, 0
    for pair in itertools.combinations(range(len(dataset)), ROWS):
        loader = trainer.get_train_dataloader()
        subset = torch.utils.data.DataLoader(dataset.select(pair), batch_size=ROWS, collate_fn=loader.collate_fn)
        batch = next(iter(subset))  # one micro-batch, whole: a packed row is not cut
        best = max(best, measured_peak(source, StepBatches(lambda rows, steps, b=batch: [b] * steps, rows=ROWS)))
    return best


@pytest.mark.parametrize("setting", ["padding", "packing", "padding_free", "peft"])
def test_sft_worst_batch_is_the_costliest(tmp_path, setting):
    from peft import LoraConfig

    settings = {"padding": {}, "packing": {"packing": True, "max_length": 32},
                "padding_free": {"padding_free": True, "max_length": None},
                "peft": {"peft_config": LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])}}[setting]
    trainer = sft(tmp_path, **settings)
    trial = memlab.measure(trainer, steps=1, warmup=1, noise=0)
    assert trial.status == "ok", trial.error
    if setting == "peft":  # the user's own adapters are what trains, read back as the plan
        assert trial.plan.adapter == "lora" and trial.plan.lora_rank == 4
    assert abs(trial.peak_bytes - brute_force_peak(trainer)) <= 0.02 * trial.peak_bytes
    # Each micro-batch is collated whole: a packed or padding-free step holds the trainer's examples, not repeats.
    if setting in ("packing", "padding_free"):
        batches = trainer_batches(trainer)
        parts = batches.micro_batches(ROWS, 3)
        assert all(part["input_ids"].shape[0] == 1 and "position_ids" in part for part in parts)
        rows = [batch_lengths(part)[0] for part in parts]
        assert sum(len(r) for r in rows) >= 3 * ROWS  # every sequence its own, none cut
        assert trial.tokens_per_s is not None


def test_peft_model_other_rank_is_a_clear_message(tmp_path):
    from peft import LoraConfig

    trainer = sft(tmp_path, peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    own = TrainerSource.from_trainer(trainer).plan
    trial = memlab.measure(trainer, own.replace(lora_rank=8), steps=1, noise=0)
    assert trial.status == "error" and "lora_rank=4" in trial.error
    with pytest.raises(MemlabError, match="its own settings"):
        apply_to_trainer(trainer, own.replace(lora_rank=8))
    applied = apply_to_trainer(trainer, own)  # its own plan: nothing re-wrapped
    assert type(trainer.model).__name__.startswith("Peft")
    applied.undo()


def test_fit_over_a_peft_trainer_keeps_its_adapters(tmp_path):
    from peft import LoraConfig

    trainer = sft(tmp_path, peft_config=LoraConfig(r=4, lora_alpha=8, lora_dropout=0.05, target_modules="all-linear"))
    own = TrainerSource.from_trainer(trainer).plan
    report = memlab.fit(trainer, budget="1GiB", space={"micro_batch": [2, 1], "precision": ["fp32"],
                                                       "optimizer": ["adamw"], "checkpointing": [False]},
                        steps=1, noise=0, progress=False)
    assert report.trials and all(t.status == "ok" for t in report.trials)
    assert {(t.plan.adapter, t.plan.lora_rank, t.plan.lora_dropout) for t in report.trials} == {("lora", 4, 0.05)}
    assert own.lora_dropout == 0.05 and "lora r4" in report.best.plan.label()


def test_seq2seq_custom_loss_and_no_dataset(tmp_path):
    torch.manual_seed(0)
    model = T5ForConditionalGeneration(T5Config(d_model=16, d_ff=32, d_kv=8, num_layers=1, num_heads=2,
                                                vocab_size=64, decoder_start_token_id=0))
    # Inputs and labels differ in length: the worst batch counts both.
    data = Dataset.from_dict({"input_ids": [[5] * n for n in (4, 20, 5, 4, 6)],
                              "labels": [[6] * n for n in (4, 3, 5, 24, 6)]})

    def pad(examples):
        out = {}
        for name, fill in (("input_ids", 0), ("labels", -100)):
            longest = max(len(e[name]) for e in examples)
            out[name] = torch.tensor([e[name] + [fill] * (longest - len(e[name])) for e in examples])
        out["attention_mask"] = (out["input_ids"] != 0).long()
        return out

    class Custom(Seq2SeqTrainer):
        calls = 0

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            Custom.calls += 1
            out = model(**inputs)
            return out.loss * 2.0

    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, save_strategy="no",
                                    max_steps=1, per_device_train_batch_size=ROWS, disable_tqdm=True)
    trainer = Custom(model=model, args=args, train_dataset=data, data_collator=pad)
    worst = worst_batch(trainer)
    assert set(worst.indices) == {1, 3}  # the longest input and the longest labels, collated together
    trial = memlab.measure(trainer, steps=1, noise=0)
    assert trial.status == "ok" and Custom.calls > 0
    trainer.train_dataset = None  # a batch given is enough
    assert memlab.measure(trainer, worst.batch, steps=1, noise=0).status == "ok"


def _snapshot(trainer):
    params = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    return (dict(vars(trainer)), trainer.args.to_dict(), list(trainer.callback_handler.callbacks), params)


def _same(trainer, snapshot) -> bool:
    attributes, args, callbacks, params = snapshot
    now = _snapshot(trainer)
    # every attribute the same object again: the accelerator and its process-wide state are the user's own
    return (set(now[0]) == set(attributes) and all(now[0][k] is attributes[k] for k in attributes)
            and now[1] == args and now[2] == callbacks
            and all(torch.equal(now[3][n], p) for n, p in params.items()) and set(now[3]) == set(params))


def _plain(tmp_path) -> Trainer:
    def pad(examples):
        longest = max(len(e["input_ids"]) for e in examples)
        ids = torch.tensor([e["input_ids"] + [0] * (longest - len(e["input_ids"])) for e in examples])
        return {"input_ids": ids, "labels": ids.clone()}

    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, save_strategy="no",
                             max_steps=1, per_device_train_batch_size=ROWS, disable_tqdm=True)
    return Trainer(model=llama(), args=args, train_dataset=tokens(), data_collator=pad)


def test_apply_watch_undo_remove_in_every_order(tmp_path):
    trainer = _plain(tmp_path)
    snapshot = _snapshot(trainer)
    for order in itertools.permutations(["apply", "watch", "undo", "remove", "apply again"]):
        handles: dict[str, object] = {}
        for op in order:
            if op == "apply":
                handles["applied"] = apply_to_trainer(trainer, Plan(micro_batch=1, accumulation=2))
            elif op == "apply again":
                if "applied" in handles and handles["applied"].active:
                    state = _snapshot(trainer)
                    with pytest.raises(MemlabError, match="undo"):
                        apply_to_trainer(trainer, Plan(checkpointing=True))
                    assert _same(trainer, state)
            elif op == "watch":
                handles["watch"] = watch(trainer)
            elif op == "undo" and "applied" in handles:
                handles["applied"].undo()
            elif op == "remove" and "watch" in handles:
                handles["watch"].remove()
        if "applied" in handles:
            handles["applied"].undo()
        if "watch" in handles:
            handles["watch"].remove()
        assert _same(trainer, snapshot), order


def test_fit_apply_train_under_watch_keeps_the_budget(tmp_path):
    trainer = _plain(tmp_path)
    trainer.args.max_steps = -1
    trainer.args.num_train_epochs = 1
    source = TrainerSource.from_trainer(trainer)
    loader = trainer.get_train_dataloader()
    typical = measured_peak(source, next(iter(loader)))
    worst = memlab.measure(trainer, steps=1, noise=0).peak_bytes
    assert worst > typical
    budget = (typical + worst) // 2
    report = memlab.fit(trainer, budget=budget, space={"micro_batch": [2, 1], "checkpointing": [False, True]},
                        steps=1, noise=0, progress=False)
    assert report.best is not None and report.best.fits
    applied = apply_to_trainer(trainer, report.best.plan)
    watched = watch(trainer, budget=budget)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.train()
    finally:
        watched.remove()
        applied.undo()
    assert watched.steps and watched.peak_bytes <= budget


@pytest.mark.parametrize("case, match", [
    ("no input_ids", "no input_ids"),
    ("untokenized", "tokenize"),
    ("collator raises", "failed on examples"),
])
def test_bad_trainer_inputs(tmp_path, case, match):
    trainer = _plain(tmp_path)
    if case == "no input_ids":
        trainer.train_dataset = Dataset.from_dict({"ids": [[1, 2]] * 4})
        trainer.args.remove_unused_columns = False
        trainer.data_collator = lambda examples: {"ids": torch.tensor([e["ids"] for e in examples])}
    elif case == "untokenized":
        trainer.train_dataset = Dataset.from_dict({"text": ["a b"] * 4})
        trainer.args.remove_unused_columns = False
    else:
        trainer.data_collator = lambda examples: 1 / 0
    snapshot = _snapshot(trainer)
    with pytest.raises(MemlabError, match=match):
        memlab.measure(trainer, steps=1, noise=0)
    assert _same(trainer, snapshot)


def test_a_failing_rebuild_leaves_the_trainer_and_every_other_trainer_in_the_process_as_they_were(
    tmp_path, monkeypatch
):
    """issue 44: after memlab rebuilt one trainer's accelerator, a later trainer failed every trial with
    "'AcceleratorState' object has no attribute 'parallelism_config'" (accelerate's shared state reset, not put
    back)."""
    from accelerate.state import AcceleratorState, PartialState

    first = _plain(tmp_path / "first")
    own = {name: getattr(first, name) for name in ("train_dataset", "data_collator", "accelerator", "optimizer",
                                                   "lr_scheduler", "args", "model")}
    shared = (dict(PartialState._shared_state), dict(AcceleratorState._shared_state))
    snapshot = _snapshot(first)

    def fails(self):
        AcceleratorState._reset_state(reset_partial_state=True)  # half-way: the state already gone
        raise RuntimeError("the rebuild failed")

    monkeypatch.setattr(type(first), "create_accelerator_and_postprocess", fails)
    with pytest.raises(RuntimeError, match="the rebuild failed"):
        memlab.apply(first, memlab.Plan(accumulation=2))
    monkeypatch.undo()
    assert all(getattr(first, name) is value for name, value in own.items())
    assert _same(first, snapshot)
    assert (PartialState._shared_state, AcceleratorState._shared_state) == shared
    second = _plain(tmp_path / "second")
    trials = memlab.compare(second, plans=[memlab.Plan(), memlab.Plan(checkpointing=True)], steps=1, noise=0).trials
    assert [t.status for t in trials] == ["ok", "ok"], [t.error for t in trials]
    applied = memlab.apply(second, memlab.Plan(accumulation=2))  # a real rebuild, then undo: state back exactly
    applied.undo()
    assert (PartialState._shared_state, AcceleratorState._shared_state) == shared
    assert all(getattr(first, name) is value for name, value in own.items())
    assert memlab.measure(first, steps=1, noise=0).status == "ok"
    assert first.train_dataset is own["train_dataset"] and first.data_collator is own["data_collator"]


def test_a_plan_on_a_trainer_keeps_its_effective_batch(tmp_path):
    """issue 44: Plan() on a trainer with gradient_accumulation_steps=2 measured one per-device batch; issue 59:
    Plan() is the whole effective batch in one micro-batch, as on every object."""
    trainer = _plain(tmp_path)
    trainer.args = dataclasses.replace(trainer.args, per_device_train_batch_size=2, gradient_accumulation_steps=2)
    args = trainer.args
    own, split, named = memlab.compare(
        trainer, plans=[memlab.Plan(), memlab.Plan(accumulation=4), memlab.Plan(micro_batch=1)], steps=1, noise=0
    ).trials
    assert [t.status for t in (own, split, named)] == ["ok"] * 3, [t.error for t in (own, split, named)]
    assert (own.plan.micro_batch, own.plan.accumulation, own.rows_per_step) == (4, 1, 4)
    assert (split.plan.micro_batch, split.plan.accumulation, split.rows_per_step) == (1, 4, 4)
    assert (named.plan.micro_batch, named.plan.accumulation, named.rows_per_step) == (1, 1, 1)  # as it says
    with pytest.raises(MemlabError, match="accumulation=3 does not divide"):
        memlab.measure(trainer, memlab.Plan(accumulation=3), steps=1, noise=0)
    with memlab.apply(trainer, memlab.Plan.from_trainer(trainer).replace(checkpointing=True)) as applied:
        assert (trainer.args.per_device_train_batch_size, trainer.args.gradient_accumulation_steps) == (2, 2)
        assert applied.plan.accumulation == 2
    assert trainer.args is args


def test_undo_leaves_a_trainer_built_since_its_own_accelerate_state(tmp_path):
    """issue 71 item 12: in a notebook, a padding-free SFTTrainer built while a plan was on
    another trainer ended every trial of its fit in "'AcceleratorState' object has no attribute
    'parallelism_config'". The plan went on after an SFTConfig was made (any arguments reset accelerate's
    process-wide state), and undo() put that empty state back over the one the new trainer had set."""
    from accelerate.state import AcceleratorState

    first = _plain(tmp_path / "first")
    assert memlab.fit(first, budget="1GiB", space={"micro_batch": [ROWS, 1]}, steps=1, warmup=0, noise=0).best
    args = trl.SFTConfig(output_dir=str(tmp_path / "second"), report_to=[], use_cpu=True, save_strategy="no",
                         max_steps=1, per_device_train_batch_size=ROWS, disable_tqdm=True, padding_free=True,
                         max_length=None, bf16=False)
    applied = memlab.apply(first, memlab.Plan(micro_batch=1, accumulation=ROWS))
    first.train()
    second = trl.SFTTrainer(model=llama(), args=args, train_dataset=tokens(), processing_class=tokenizer())
    built = dict(AcceleratorState._shared_state)
    applied.undo()
    assert AcceleratorState._shared_state == built and second.accelerator.parallelism_config is None
    report = memlab.fit(second, budget="1GiB", space={"micro_batch": [ROWS, 1], "checkpointing": [False]}, steps=1,
                        warmup=0, noise=0)
    assert [t.status for t in report.trials] == ["ok"] * len(report.trials), [t.error for t in report.trials]
    assert memlab.measure(first, steps=1, noise=0).status == "ok"  # the first trainer reads the newer state


def test_arguments_made_after_a_trainer_was_built_leave_memlab_running_it(tmp_path):
    """Any arguments made (here a plan written back) empty accelerate's process-wide state, which a trainer built
    before reads: memlab measures and estimates it with its own state, and puts the emptied one back."""
    from accelerate.state import AcceleratorState, PartialState

    padding_free = sft(tmp_path / "padding-free", padding_free=True, max_length=None, bf16=False)
    trl.SFTConfig(output_dir=str(tmp_path / "written back"), use_cpu=True, report_to=[],
                  **Plan(micro_batch=1, accumulation=2).to_training_arguments())
    emptied = (dict(PartialState._shared_state), dict(AcceleratorState._shared_state))
    assert not emptied[1]
    for trial in (memlab.measure(padding_free, steps=1, warmup=0, noise=0), memlab.estimate(padding_free)):
        assert trial.status == "ok", trial.error
    assert (PartialState._shared_state, AcceleratorState._shared_state) == emptied


@pytest.mark.slow
def test_arguments_made_after_trainers_were_built_leave_memlab_running_them(tmp_path):
    """issue 84 item 12: with a packing and a padding-free SFTTrainer built, both estimated, the first fitted and its
    plan written back (SFTConfig(**best.to_training_arguments())), every trial of the second's fit was
    "'AcceleratorState' object has no attribute 'parallelism_config'". Any arguments made reset accelerate's
    process-wide state, which every trainer built before reads (its own train() fails the same way): memlab now runs
    a trainer's step with the trainer's own state and puts the process's back after. A GRPOTrainer's generation read
    the emptied state too."""
    from accelerate.state import AcceleratorState, PartialState
    from trl_trainers import make_grpo_trainer

    packed = sft(tmp_path / "packed", packing=True, max_length=32, bf16=False)
    padding_free = sft(tmp_path / "padding-free", padding_free=True, max_length=None, bf16=False)
    grpo = make_grpo_trainer(tmp_path)
    assert memlab.estimate(packed).status == memlab.estimate(padding_free).status == "ok"
    fast = dict(steps=1, warmup=0, noise=0, progress=False)
    best = memlab.fit(packed, budget="1GiB", max_trials=4, **fast).best
    assert best is not None
    trl.SFTConfig(output_dir=str(tmp_path / "written back"), use_cpu=True, report_to=[],
                  **best.plan.to_training_arguments())
    emptied = (dict(PartialState._shared_state), dict(AcceleratorState._shared_state))
    assert not emptied[1]  # what transformers leaves: the trainers built before read an empty state
    report = memlab.fit(padding_free, budget="1GiB", max_trials=4, **fast)
    assert [t.status for t in report.trials] == ["ok"] * len(report.trials), [t.error for t in report.trials]
    for trial in (memlab.estimate(padding_free), memlab.measure(grpo, steps=1, warmup=0, noise=0)):
        assert trial.status == "ok", trial.error
    assert (PartialState._shared_state, AcceleratorState._shared_state) == emptied  # put back as it was


def test_watch_reads_a_packed_steps_lengths_only_after_the_step_ended(tmp_path, monkeypatch):
    # On a GPU a length read is a host read of a device tensor: made mid-step, it waits for the backward just queued.
    watch_module = sys.modules["memlab.trainer.watch"]  # the package's name `watch` is the function

    trainer = sft(tmp_path, packing=True, max_length=32)
    calls: list[bool] = []
    read = watch_module.batch_lengths

    def spy(inputs):
        calls.append(watched._memory.probe is None)  # the step's probe (its synchronize, on CUDA) has ended
        return read(inputs)

    monkeypatch.setattr(watch_module, "batch_lengths", spy)
    watched = watch(trainer)
    try:
        trainer.train()
    finally:
        watched.remove()
    assert calls and all(calls)
    packed = [sum(step.lengths) for step in watched.steps]
    assert len(watched.steps) == 2 and all(0 < total <= ROWS * 32 for total in packed)
    assert all(len(step.lengths) >= ROWS for step in watched.steps)  # each packed row holds whole sequences
