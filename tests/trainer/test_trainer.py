"""memlab.trainer on real (tiny) transformers Trainers and TRL's SFTTrainer, on CPU."""

from __future__ import annotations

import dataclasses
import itertools
import warnings

import pytest
import torch

pytest.importorskip("datasets")
from datasets import Dataset, IterableDataset  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments  # noqa: E402

from memlab import MemlabError, Plan  # noqa: E402
from memlab.errors import MemlabWarning  # noqa: E402
from memlab.export.engines import training_arguments  # noqa: E402
from memlab.trainer import (  # noqa: E402
    TrainerSource,
    apply_to_trainer,
    is_trainer,
    plan_from_training_arguments,
    watch,
    worst_batch,
)
from memlab.trainer.entry import live_target  # noqa: E402

SHORT, LONG = 4, 64  # most examples are short; a few are 16x longer


def tiny_model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=4, vocab_size=128, max_position_embeddings=256)
    return LlamaForCausalLM(config)


def pad_collator(examples: list[dict]) -> dict[str, torch.Tensor]:
    """Pads input_ids (0), attention_mask and labels (-100) to the longest example."""
    longest = max(len(e["input_ids"]) for e in examples)
    ids = torch.zeros(len(examples), longest, dtype=torch.long)
    mask = torch.zeros(len(examples), longest, dtype=torch.long)
    labels = torch.full((len(examples), longest), -100, dtype=torch.long)
    for row, example in enumerate(examples):
        n = len(example["input_ids"])
        ids[row, :n] = torch.tensor(example["input_ids"])
        mask[row, :n] = 1
        labels[row, :n] = torch.tensor(example["input_ids"])
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


LENGTHS = [SHORT] * 20
LENGTHS[5], LENGTHS[13] = LONG, LONG - 2


def dataset(lengths: list[int] = LENGTHS) -> Dataset:
    return Dataset.from_dict({"input_ids": [[(i + j) % 127 + 1 for j in range(n)] for i, n in enumerate(lengths)]})


def arguments(tmp_path, **changes) -> TrainingArguments:
    settings = dict(output_dir=str(tmp_path), report_to=[], use_cpu=True, save_strategy="no", max_steps=3,
                    per_device_train_batch_size=2, logging_steps=1, disable_tqdm=True, learning_rate=1e-2)
    settings.update(changes)
    return TrainingArguments(**settings)


def trainer(tmp_path, data=None, **changes) -> Trainer:
    return Trainer(model=tiny_model(), args=arguments(tmp_path, **changes),
                   train_dataset=dataset() if data is None else data, data_collator=pad_collator)


def expressible_plans() -> list[Plan]:
    plans = []
    for mb, acc, ckpt, precision, optimizer, offload in itertools.product(
        (1, 4), (1, 3), (False, True), ("fp32", "bf16", "fp16"), ("adamw", "adamw8bit", "paged_adamw8bit",
                                                                     "adafactor"), ("none", "activations")
    ):
        if offload == "activations" and not ckpt:
            continue  # without checkpointing the Trainer has no activation offload
        plans.append(Plan(micro_batch=mb, accumulation=acc, checkpointing=ckpt, precision=precision,
                          optimizer=optimizer, offload=offload))
    plans.append(Plan(micro_batch=2, loss="chunked"))
    plans.append(Plan(micro_batch=2, optimizer="adamw_foreach"))  # optim="adamw_torch": torch's AdamW, foreach
    return plans


def test_plans_round_trip_through_training_arguments(tmp_path):
    for plan in expressible_plans():
        args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], **training_arguments(plan))
        assert plan_from_training_arguments(args) == plan, plan.label()
    legacy = training_arguments(Plan(micro_batch=2, checkpointing=True), legacy_names=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], **legacy)
    assert plan_from_training_arguments(args) == Plan(micro_batch=2, checkpointing=True)


def test_settings_memlab_cannot_express_are_named(tmp_path):
    with pytest.raises(MemlabError, match="optim='sgd'"):
        plan_from_training_arguments(TrainingArguments(output_dir=str(tmp_path), use_cpu=True, optim="sgd"))


def test_source_reads_the_trainer(tmp_path):
    t = trainer(tmp_path, gradient_accumulation_steps=4, bf16=True)
    assert is_trainer(t) and not is_trainer(t.model)
    source = TrainerSource.from_trainer(t)
    assert source.model is t.model and source.collator is pad_collator
    assert source.effective_batch == 8
    assert source.plan == Plan(micro_batch=2, accumulation=4, precision="bf16")
    batch = pad_collator([t.train_dataset[i] for i in range(2)])
    loss = source.loss_fn(source.model, batch)
    assert loss.ndim == 0 and torch.isfinite(loss)
    assert batch.keys() == {"input_ids", "attention_mask", "labels"}  # the caller's batch is not written into


def test_worst_batch_picks_the_longest_examples(tmp_path):
    t = trainer(tmp_path)
    worst = worst_batch(t)
    assert worst.indices == (5, 13) and worst.lengths == (LONG, LONG - 2)
    assert worst.batch["input_ids"].shape == (2, LONG)
    assert worst.scanned == 20 and not worst.sampled
    assert worst.describe() == f"rows 5, 13 of the train dataset, {LONG} and {LONG - 2} tokens; " \
                               "scanned 20 examples by input_ids"
    assert worst_batch(t, micro_batch=3).indices == (5, 13, 0)


def test_worst_batch_of_an_iterable_dataset_is_sampled(tmp_path):
    rows = dataset().to_list()
    stream = IterableDataset.from_generator(lambda: iter(rows))
    worst = worst_batch(trainer(tmp_path, data=stream, max_steps=1), sample=10)
    assert worst.sampled and worst.scanned == 10
    assert worst.indices == (5, 0) and worst.lengths == (LONG, SHORT)  # row 13 is past the sample
    assert "sampled the first 10 examples" in worst.describe()


def test_worst_batch_falls_back_on_the_collator(tmp_path):
    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return len(LENGTHS)

        def __getitem__(self, index):
            return {"tokens": list(range(1, LENGTHS[index] + 1))}

    def collator(examples):
        return pad_collator([{"input_ids": e["tokens"]} for e in examples])

    t = Trainer(model=tiny_model(), args=arguments(tmp_path, remove_unused_columns=False), train_dataset=Rows(),
                data_collator=collator)
    worst = worst_batch(t)
    assert worst.indices == (5, 13) and worst.measured_by == "sequence sizes"


def test_watch_records_the_peak_warns_once_and_logs(tmp_path):
    lengths = [SHORT] * 6 + [LONG, LONG] + [SHORT] * 4  # the long pair is the 4th step's batch, in order
    t = trainer(tmp_path, data=dataset(lengths), max_steps=6, train_sampling_strategy="sequential")
    seen = []
    w = watch(t, budget=1)  # every step is near a 1-byte budget: one warning all the same
    w.on_step(seen.append)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t.train()
    assert [r.step for r in w.steps] == [1, 2, 3, 4, 5, 6] and len(seen) == 6
    assert w.peak_step == 4 and w.peak_lengths == (LONG, LONG)
    assert w.peak_bytes == max(r.peak_bytes for r in w.steps) > w.steps[0].peak_bytes
    assert sum(issubclass(c.category, MemlabWarning) for c in caught) == 1
    logged = [entry for entry in t.state.log_history if "loss" in entry]
    assert logged and all("memory/peak_bytes" in entry for entry in logged)
    assert logged[-1]["memory/peak_step"] == 4
    # whole numbers, which the Trainer's progress line prints as they are (a float as 1.235e+09)
    assert all(type(entry[key]) is int for entry in logged for key in entry if key.startswith("memory/"))
    frame = w.to_dataframe()
    assert list(frame["step"]) == [1, 2, 3, 4, 5, 6] and frame["peak_bytes"].max() == w.peak_bytes
    w.remove()
    assert "training_step" not in vars(t)
    assert not any(type(c).__name__ == "MemlabWatchCallback" for c in t.callback_handler.callbacks)


def _parameters(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def test_apply_train_undo_gives_everything_back(tmp_path):
    t = trainer(tmp_path)
    model, args = t.model, t.args
    callbacks = list(t.callback_handler.callbacks)
    before = _parameters(model)
    names = set(before)
    applied = apply_to_trainer(t, Plan(micro_batch=1, accumulation=2, checkpointing=True, adapter="lora",
                                       lora_rank=4))
    assert t.args.per_device_train_batch_size == 1 and t.args.gradient_accumulation_steps == 2
    name = "activation_checkpointing" if hasattr(args, "activation_checkpointing") else "gradient_checkpointing"
    assert getattr(t.args, name) and getattr(args, name) is False  # transformers 5.17: gradient_checkpointing
    assert any("lora_A" in name for name, _ in model.named_parameters())
    assert t.optimizer is None and t.lr_scheduler is None
    t.train()
    trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all("lora" in n for n in trained)
    applied.undo()
    assert t.args is args and t.model is model and t.callback_handler.callbacks == callbacks
    assert t.optimizer is None and t.lr_scheduler is None
    after = _parameters(model)
    assert set(after) == names
    assert all(torch.equal(before[n], after[n]) for n in names)
    assert not getattr(model, "is_activation_checkpointing", model.is_gradient_checkpointing)


def test_apply_then_train_changes_weights_and_undo_restores_them(tmp_path):
    t = trainer(tmp_path)
    before = _parameters(t.model)
    with apply_to_trainer(t, Plan(micro_batch=1, accumulation=2, optimizer="adafactor")):
        t.train()
        assert not all(torch.equal(before[n], p) for n, p in t.model.named_parameters())
    assert all(torch.equal(before[n], p) for n, p in t.model.named_parameters())
    assert t.args.optim == "adamw_torch_fused" or t.args.optim.value == "adamw_torch_fused"


def _state(t):
    return dict(vars(t)), dataclasses.asdict(t.args), list(t.callback_handler.callbacks)


@pytest.mark.parametrize(
    "case, match",
    [
        ("no dataset", "no train dataset"),
        ("deepspeed", "DeepSpeed"),
        ("fsdp", "FSDP"),
        ("collator raises", "failed on examples 5, 13"),
        ("no lengths", "no input_ids"),
        ("bad plan", "offload='all'"),
    ],
)
def test_bad_input_raises_one_error_and_leaves_the_trainer(tmp_path, case, match):
    t = trainer(tmp_path)
    if case == "no dataset":
        t.train_dataset = None
    elif case == "deepspeed":
        t.args.deepspeed = {"zero_optimization": {"stage": 2}}
    elif case == "fsdp":
        t.args.fsdp = ["full_shard"]
    elif case == "collator raises":
        def broken(examples):
            if any(len(e["input_ids"]) > SHORT for e in examples):
                raise ValueError("too long")
            return pad_collator(examples)

        t.data_collator = broken
    elif case == "no lengths":
        t.train_dataset = Dataset.from_dict({"text": ["a"] * 4})
        t.args.remove_unused_columns = False
        t.data_collator = lambda examples: {"pixels": torch.zeros(len(examples), 3)}
    before = _state(t)
    parameters = _parameters(t.model)
    with pytest.raises(MemlabError, match=match):
        if case == "bad plan":
            apply_to_trainer(t, Plan(offload="all"))
        elif case in ("deepspeed", "fsdp"):
            apply_to_trainer(t, Plan(micro_batch=1))
        else:
            worst_batch(t)
    if case in ("deepspeed", "fsdp"):
        with pytest.raises(MemlabError, match=match):  # its step run here; memlab.estimate answers it per GPU
            live_target(t, None)
    if case == "no dataset":  # a batch given is enough; without one, the same error
        TrainerSource.from_trainer(t)
        with pytest.raises(MemlabError, match=match):
            live_target(t, None)
    assert _state(t) == before
    assert all(torch.equal(parameters[n], p) for n, p in t.model.named_parameters())


def test_sft_trainer_worst_batch_and_loss(tmp_path):
    trl = pytest.importorskip("trl")
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = ["short text"] * 12 + ["a much longer text " * 12, "another long one " * 10]
    words = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    words.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]", "[EOS]"]))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, pad_token="[PAD]", unk_token="[UNK]",
                                        eos_token="[EOS]")
    config = trl.SFTConfig(output_dir=str(tmp_path), report_to=[], use_cpu=True, save_strategy="no", max_steps=1,
                           per_device_train_batch_size=2, disable_tqdm=True)
    sft = trl.SFTTrainer(model=tiny_model(), args=config, train_dataset=Dataset.from_dict({"text": texts}),
                         processing_class=tokenizer)
    assert is_trainer(sft)
    worst = worst_batch(sft)
    assert set(worst.indices) == {12, 13} and worst.lengths[0] > 3 * len("short text".split()) + 1
    source = TrainerSource.from_trainer(sft)
    metrics_before = repr(getattr(sft, "_metrics", None))
    loss = source.loss_fn(source.model, worst.batch)
    assert loss.ndim == 0 and torch.isfinite(loss)
    assert repr(getattr(sft, "_metrics", None)) == metrics_before  # measuring leaves no metrics behind
    sft.compute_loss(source.model, dict(worst.batch))  # (where TRL's own call does leave them)
    assert repr(getattr(sft, "_metrics", None)) != metrics_before
