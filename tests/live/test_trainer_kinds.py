"""Trainer kinds as declarations (issue 59): the four kinds found by class, a fifth declared in a test and measured
and estimated through its declaration alone, and one refusal for a TRL trainer of no declared kind."""

from __future__ import annotations

from typing import Any

import pytest
import torch

trl = pytest.importorskip("trl")
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments  # noqa: E402

import memlab  # noqa: E402
from memlab import MemlabError, Plan  # noqa: E402
from memlab.kinds.grpo.source import GRPO_PHASES  # noqa: E402
from memlab.kinds.grpo.suggest import CHANGES  # noqa: E402
from memlab.live.trainer_kinds import TrainerKind, declared, kind_for_config, kind_of, kinds  # noqa: E402

ROWS, TOKENS, VOCAB = 2, 24, 128


def tiny_model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=4, vocab_size=VOCAB, max_position_embeddings=64)
    return LlamaForCausalLM(config)


class PairTrainer(Trainer):
    """A fifth kind of trainer: its dataset is raw text pairs, which no collator of the Trainer's reads; its kind
    says what its step runs on."""


def pair_trainer(tmp_path: Any) -> PairTrainer:
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, save_strategy="no", max_steps=1,
                             per_device_train_batch_size=ROWS, disable_tqdm=True)
    return PairTrainer(model=tiny_model(), args=args, train_dataset=[("a question", "an answer")] * 8)


def test_the_four_kinds_in_order_each_found_by_its_class() -> None:
    assert [kind.name for kind in kinds()] == ["Trainer", "SFTTrainer", "DPOTrainer", "GRPOTrainer"]
    for cls in (Trainer, trl.SFTTrainer, trl.DPOTrainer, trl.GRPOTrainer):
        assert kind_of(cls.__new__(cls)).name == cls.__name__

    class MyGRPO(trl.GRPOTrainer):  # a user's subclass is the kind it derives from
        pass

    grpo = kind_of(MyGRPO.__new__(MyGRPO))
    assert grpo.suggestions == tuple(name for name, _ in CHANGES)  # what fit suggests on it, declared
    assert grpo.name == "GRPOTrainer" and grpo.target is not None and grpo.estimate is not None
    assert grpo.phases == GRPO_PHASES  # the phases the timeline names, declared once
    assert kind_of(Trainer.__new__(Trainer)).target is None  # the Trainer's step: its compute_loss on a worst batch
    # Each kind's config class is its exports' target.
    assert [kind.config_class() for kind in kinds()] == [TrainingArguments, trl.SFTConfig, trl.DPOConfig,
                                                       trl.GRPOConfig]
    assert kind_for_config(trl.GRPOConfig) is grpo and kind_for_config(trl.SFTConfig).name == "SFTTrainer"


def test_a_plan_exports_to_the_config_of_the_trainer_s_kind() -> None:
    sft, grpo = trl.SFTTrainer.__new__(trl.SFTTrainer), trl.GRPOTrainer.__new__(trl.GRPOTrainer)
    plan = Plan(micro_batch=2, accumulation=2, checkpointing=True, offload="activations")
    assert plan.to_training_arguments(trl=sft) == plan.to_training_arguments(trl=trl.SFTConfig)
    assert plan.to_training_arguments(trl=sft)["activation_offloading"] is True  # TRL's own flag
    assert "activation_offloading" not in plan.to_training_arguments(trl=grpo)  # GRPOConfig has none in TRL 1.16
    with pytest.raises(MemlabError, match=r"GRPOTrainer refuses Liger's fused linear cross-entropy.*loss='full'"):
        Plan(loss="chunked").to_training_arguments(trl=grpo)  # the GRPO kind's export refusal


def test_a_fifth_kind_is_measured_and_estimated_through_its_declaration_alone(tmp_path: Any) -> None:
    trainer = pair_trainer(tmp_path)
    with pytest.raises(MemlabError):  # undeclared, it is a plain Trainer, whose worst batch cannot be read
        memlab.estimate(trainer)

    made: list[int] = []

    def make_batch(pair_trainer: Any) -> dict[str, torch.Tensor]:
        rows = pair_trainer.args.per_device_train_batch_size * pair_trainer.args.gradient_accumulation_steps
        made.append(rows)
        ids = torch.randint(VOCAB, (rows, TOKENS), generator=torch.Generator().manual_seed(0))
        return {"input_ids": ids, "labels": ids.clone()}

    kind = TrainerKind("PairTrainer", "", "TrainingArguments", "transformers",
                       batch=f"{TOKENS}-token pairs, question and answer joined", make_batch=make_batch,
                       levers={"checkpointing": (True,), "precision": ("fp32",), "optimizer": ("adamw",)})
    with declared(kind):
        assert kind_of(trainer) is kind and kinds()[-1] is kind
        trial = memlab.measure(trainer, steps=1, warmup=0, noise=0)
        estimate = memlab.estimate(trainer)
        plans = memlab.compare(trainer, [Plan(), Plan(checkpointing=True)], steps=1, warmup=0, noise=0,
                               progress=False)
        searched = memlab.fit(trainer, budget="1GiB", steps=1, noise=0, progress=False, max_trials=2,
                              space={"optimizer": ("adafactor",)})  # the user's space over the kind's levers
    assert trial.status == "ok", trial.error
    assert trial.plan == Plan.from_trainer(trainer)  # the trainer as set up
    assert trial.rows_per_step == ROWS and made and set(made) == {ROWS}
    assert any(f"a PairTrainer's batch: {TOKENS}-token pairs" in note for note in trial.notes), trial.notes
    assert estimate.status == "ok" and estimate.estimated, estimate.error
    assert any("PairTrainer's batch" in note for note in estimate.notes), estimate.notes
    assert [t.status for t in plans.trials] == ["ok", "ok"]
    assert searched.trials and {(t.plan.checkpointing, t.plan.optimizer) for t in searched.trials} == {
        (True, "adafactor")}  # fit searched the kind's levers, the user's space winning where both say
    # The declaration is gone with the block: the registry is the four kinds again.
    assert [k.name for k in kinds()] == ["Trainer", "SFTTrainer", "DPOTrainer", "GRPOTrainer"]
    assert kind_of(trainer).name == "Trainer"


def test_apply_asks_the_kinds_start_afresh_and_undo_puts_its_state_back(tmp_path: Any) -> None:
    trainer = pair_trainer(tmp_path)
    trainer.pairs_buffered = ["a pair cut for the old split"]

    def start_afresh(pair_trainer: Any) -> None:
        pair_trainer.pairs_buffered = None

    with declared(TrainerKind("PairTrainer", "", "TrainingArguments", "transformers", start_afresh=start_afresh)):
        applied = memlab.apply(trainer, Plan(micro_batch=1, accumulation=2))
        assert trainer.pairs_buffered is None  # the kind's own state reset for the next train()
        applied.undo()
    assert trainer.pairs_buffered == ["a pair cut for the old split"]


def test_the_grpo_kind_starts_afresh_from_no_buffered_generations() -> None:
    from memlab.kinds.grpo import GRPO
    from memlab.kinds.grpo.source import fresh_generations

    assert GRPO.start_afresh is fresh_generations


def test_a_trainer_of_no_declared_kind_gets_one_refusal_naming_the_kinds(tmp_path: Any) -> None:
    class PPOTrainer(Trainer):  # a TRL trainer memlab does not take (TRL's PPO is experimental)
        pass

    PPOTrainer.__module__ = "trl.experimental.ppo.ppo_trainer"
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, save_strategy="no",
                             per_device_train_batch_size=ROWS)
    trainer = PPOTrainer(model=tiny_model(), args=args, train_dataset=[{"input_ids": [1, 2, 3]}] * 4)
    names = r"Trainer, SFTTrainer, DPOTrainer and GRPOTrainer"
    said = rf"does not measure, estimate or fit a TRL PPOTrainer: it takes {names}; memlab.watch.*memlab.measure\("
    for call in (lambda: memlab.measure(trainer, steps=1, warmup=0, noise=0), lambda: memlab.estimate(trainer),
                 lambda: memlab.fit(trainer, budget="1GiB", steps=1, progress=False),
                 lambda: memlab.apply(trainer, Plan()), lambda: kind_of(trainer)):
        with pytest.raises(MemlabError, match=said):
            call()
    with declared(TrainerKind("KTOTrainer", "trl.", "KTOConfig")):  # the refusal names what is declared
        with pytest.raises(MemlabError, match=r"it takes Trainer, SFTTrainer, DPOTrainer, GRPOTrainer and KTOTrainer"):
            kind_of(trainer)
    with pytest.raises(MemlabError, match=r"register takes a memlab.live.trainer_kinds.TrainerKind, not dict"):
        from memlab.live.trainer_kinds import register

        register({"name": "KTOTrainer"})  # type: ignore[arg-type]
