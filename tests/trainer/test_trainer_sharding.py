"""Issue 85: a trainer set up for several processes (DeepSpeed ZeRO, FSDP) estimated per GPU as it is set up, the
strategy read from its own arguments or its accelerator, and refused where its step would run here in one process.

A DeepSpeed Trainer builds in one process (the user's notebook: transformers sets accelerate's state, its ZeRO-3
switch and ``ACCELERATE_USE_DEEPSPEED`` for the process, which the fixture puts back). An FSDP Trainer does not
("Using fsdp only works in distributed training"): its arguments are set on a built one, as a launched script holds
them, and accelerate's own FSDP plugin is read as a launched trainer's accelerator carries it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

pytest.importorskip("datasets")
from test_trainer import pad_collator, trainer  # noqa: E402

import memlab  # noqa: E402
from memlab import MemlabError, Plan  # noqa: E402
from memlab.estimation.configs import layer_counts, persistent_count  # noqa: E402
from memlab.live.sharding import DS_PERSISTENCE_THRESHOLD, DS_PREFETCH_BUCKET, DS_REDUCE_BUCKET  # noqa: E402
from memlab.trainer.sharding import trainer_sharding  # noqa: E402

ZERO3 = {"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": "auto",
         "gradient_accumulation_steps": "auto"}


@pytest.fixture
def deepspeed_process() -> Iterator[None]:
    """The process as it was before a DeepSpeed Trainer was built in it: its environment, accelerate's state and
    transformers' ZeRO-3 switch, so that no later test trains under DeepSpeed."""
    environment = dict(os.environ)
    yield
    from accelerate.state import AcceleratorState, PartialState
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()
    AcceleratorState._reset_state(True)
    PartialState._reset_state()
    os.environ.clear()
    os.environ.update(environment)


def _parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: parameter.detach().clone() for name, parameter in model.named_parameters()}


@pytest.mark.needs("deepspeed")
def test_a_deepspeed_trainer_is_estimated_per_gpu_as_the_same_trainer_asked_with_its_strategy(
        tmp_path: Path, deepspeed_process: None) -> None:
    plain = trainer(tmp_path / "plain")
    asked = memlab.estimate(plain, gpus=2, strategy="zero3", device="cpu")
    sharded = trainer(tmp_path / "zero3", deepspeed=ZERO3)
    before, args = _parameters(sharded.model), dict(vars(sharded.args))
    with pytest.raises(MemlabError, match=r"runs in one process here; say how many GPUs .*memlab.estimate\(trainer, "
                                          r"gpus=8\)"):
        memlab.estimate(sharded, device="cpu")
    read = memlab.estimate(sharded, gpus=2, device="cpu")
    assert read.status == asked.status == "ok", (read.error, asked.error)
    assert (read.peak_bytes, read.breakdown) == (asked.peak_bytes, asked.breakdown)
    assert (read.gpus, read.strategy) == (2, "zero3")
    assert ("per GPU as the trainer is set up: DeepSpeed ZeRO-3 (deepspeed=...) on 2 GPUs (gpus=2)"
            in "; ".join(read.notes))
    with pytest.raises(MemlabError, match=r"DeepSpeed ZeRO-3 .*strategy='zero3', not 'fsdp2'; leave strategy= out"):
        memlab.estimate(sharded, gpus=2, strategy="fsdp2", device="cpu")
    with pytest.raises(MemlabError, match=r"set up for DeepSpeed .* memlab measures one process on one device; "
                                          r"memlab.estimate\(trainer, gpus=N\) answers it per GPU"):
        memlab.measure(sharded)
    assert dict(vars(sharded.args)) == args
    assert all(torch.equal(before[name], parameter) for name, parameter in sharded.model.named_parameters())


def test_the_engines_offload_is_the_plans_and_its_buckets_are_read(tmp_path: Path) -> None:
    t = trainer(tmp_path)
    t.args.deepspeed = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"},
                                              "reduce_bucket_size": 2e8}}
    read = memlab.estimate(t, gpus=4, device="cpu")
    asked = memlab.estimate(t, Plan.from_trainer(t).replace(offload="optimizer"), gpus=4, strategy="zero2",
                            device="cpu")
    assert read.status == "ok" and read.host_bytes and read.host_bytes > 0
    # ZeRO-2's buckets are at most the model's size: this tiny model's, under 2e8 and 5e8 alike
    assert (read.peak_bytes, read.host_bytes) == (asked.peak_bytes, asked.host_bytes)
    notes = "; ".join(read.notes)
    assert "offload_optimizer to the CPU" in notes
    assert ("DeepSpeed ZeRO stage 2, reduce_bucket_size 2e8 (the config's), allgather_bucket_size 5e8 (DeepSpeed's "
            "default)") in notes
    assert "not modelled" not in notes
    assert "host memory per node: " in notes and "(4 ranks a node x " in notes
    with pytest.raises(MemlabError, match=r"offloads 'activations' too, which memlab does not estimate together"):
        memlab.estimate(t, Plan(checkpointing=True, offload="activations"), gpus=4, device="cpu")


def test_fsdp_arguments_as_transformers_5_writes_them_and_as_before(tmp_path: Path) -> None:
    t = trainer(tmp_path)
    t.args.fsdp, t.args.fsdp_config = True, {"version": 2, "reshard_after_forward": True}
    read = memlab.estimate(t, gpus=2, device="cpu")
    asked = memlab.estimate(t, gpus=2, strategy="fsdp2", device="cpu")
    assert read.status == "ok" and (read.peak_bytes, read.breakdown) == (asked.peak_bytes, asked.breakdown)
    assert "per GPU as the trainer is set up: FSDP2 (fsdp=True) on 2 GPUs (gpus=2)" in "; ".join(read.notes)
    legacy = SimpleNamespace(args=SimpleNamespace(fsdp=["full_shard", "offload", "auto_wrap"], fsdp_config={},
                                                  deepspeed=None, world_size=8))
    assert (trainer_sharding(legacy).strategy, trainer_sharding(legacy).offload) == ("fsdp2", "params")
    version1 = SimpleNamespace(args=SimpleNamespace(fsdp=["full_shard"], fsdp_config={"version": 1}, deepspeed=None))
    assert trainer_sharding(version1).strategy == "fsdp1"


def test_the_load_is_said_beside_the_step_per_gpu_and_per_node(tmp_path: Path) -> None:
    # Issue 85, "the load": the per-rank peak while the model is loaded and wrapped, beside the step's, and the host
    # memory a node holds meanwhile (memlab.estimation.sharded.loading; test_loading.py derives each engine's figure)
    t = trainer(tmp_path)
    parameters = list(t.model.parameters())
    weights = sum(p.numel() * p.element_size() for p in parameters)
    buffers = sum(b.numel() * b.element_size() for b in t.model.buffers())
    blocks = [sum(p.numel() * p.element_size() for p in layer.parameters()) for layer in t.model.model.layers]
    t.args.fsdp, t.args.fsdp_config = True, {"version": 2, "cpu_ram_efficient_loading": True}
    efficient = memlab.estimate(t, gpus=2, device="cpu")
    assert efficient.status == "ok", efficient.error
    # accelerate's fsdp2_load_full_state_dict: each rank's shards and one whole weight sent from rank 0; transformers
    # read the full fp32 weights on both ranks' host
    largest = max(p.numel() * p.element_size() for p in parameters)
    assert efficient.load_bytes == -(-weights // 2) + largest + buffers
    assert efficient.load_host_bytes == 2 * (weights + buffers)
    note = next(note for note in efficient.notes if note.startswith("the load"))
    assert "then FSDP2 wrapping" in note and "with cpu_ram_efficient_loading" in note
    assert "below the step's" in note and "the step is the run's peak" in note
    assert "host memory per node while loading: " in note and "(2 ranks a node x " in note
    t.args.fsdp_config = {"version": 2, "cpu_ram_efficient_loading": False}
    moved = memlab.estimate(t, gpus=2, device="cpu")
    # fully_shard moves the second block whole to the GPU beside the first one's shard
    assert moved.load_bytes == -(-blocks[0] // 2) + blocks[1] + -(-blocks[1] // 2) + buffers
    assert "without cpu_ram_efficient_loading" in "; ".join(moved.notes)
    t.args.fsdp, t.args.deepspeed = None, {"zero_optimization": {"stage": 3}}
    zero3 = memlab.estimate(t, gpus=2, device="cpu")
    # the model was built before ZeRO-3 was set (no zero.Init partitions): DeepSpeed moves it whole to each GPU
    assert zero3.load_bytes == weights + buffers
    assert "loaded whole before ZeRO-3 was set" in "; ".join(zero3.notes)


def test_a_launched_trainers_accelerator_is_read_before_its_arguments() -> None:
    from accelerate.utils import FullyShardedDataParallelPlugin

    def launched(plugin: Any) -> SimpleNamespace:
        state = SimpleNamespace(fsdp_plugin=plugin, deepspeed_plugin=None)
        return SimpleNamespace(args=SimpleNamespace(fsdp=None, deepspeed=None, world_size=8),
                               accelerator=SimpleNamespace(state=state))

    offloaded = trainer_sharding(launched(FullyShardedDataParallelPlugin(fsdp_version=2, cpu_offload=True)))
    assert offloaded is not None
    assert (offloaded.strategy, offloaded.offload, offloaded.world_size) == ("fsdp2", "params", 8)
    assert "accelerate launch's config" in offloaded.setting
    kept = trainer_sharding(launched(FullyShardedDataParallelPlugin(fsdp_version=2)))
    assert kept is not None and kept.offload == "none"
    grad_op = FullyShardedDataParallelPlugin(fsdp_version=1, sharding_strategy="SHARD_GRAD_OP")
    with pytest.raises(MemlabError, match="fsdp_sharding_strategy SHARD_GRAD_OP is not estimated"):
        trainer_sharding(launched(grad_op))
    with pytest.raises(MemlabError, match=r"reshard_after_forward=False\), which memlab does not estimate"):
        trainer_sharding(launched(FullyShardedDataParallelPlugin(fsdp_version=2, reshard_after_forward=False)))


@pytest.mark.parametrize(("config", "match"), [
    ("{not json", r"does not parse as JSON \(line 1, column 2: .*fix the file, or pass deepspeed= the config as a "
                  "dict"),
    ("[1, 2]", r"is not a JSON object; write it as \{\"zero_optimization\""),
    (None, r"cannot be read \(No such file or directory\)"),
    ({"zero_optimization": {"stage": 1}}, r"zero_optimization.stage 1, which memlab does not estimate per GPU; write"),
    ({"train_batch_size": 8}, r"zero_optimization.stage 0, which memlab does not estimate"),
    ({"zero_optimization": {"stage": 2, "allgather_bucket_size": "auto"}},
     r"allgather_bucket_size is \"auto\", which transformers does not fill .*write a number of elements, such as "
     r"allgather_bucket_size: 5e8"),
    ({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": -1}},
     r"stage3_prefetch_bucket_size is -1, which is not a number of elements; write a whole number >= 0"),
])
def test_a_deepspeed_config_memlab_cannot_read_is_one_error_that_says_what_to_write(
        tmp_path: Path, config: Any, match: str) -> None:
    t = trainer(tmp_path)
    if isinstance(config, str):
        (tmp_path / "ds.json").write_text(config)
    t.args.deepspeed = config if isinstance(config, dict) else str(tmp_path / "ds.json")
    before = dict(vars(t.args))
    with pytest.raises(MemlabError, match=match):
        memlab.estimate(t, gpus=2, device="cpu")
    assert dict(vars(t.args)) == before


def test_a_deepspeed_config_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "zero3.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"},
                                                      "offload_optimizer": {"device": "cpu"}}}))
    read = trainer_sharding(SimpleNamespace(args=SimpleNamespace(deepspeed=str(path), fsdp=None, world_size=4)))
    assert read is not None
    assert (read.strategy, read.offload, read.world_size) == ("zero3", "params", 4)
    assert read.setting == "DeepSpeed ZeRO-3 (deepspeed='zero3.json')"


def test_a_deepspeed_configs_buckets_and_persistence_threshold_are_the_estimates(tmp_path: Path) -> None:
    t = trainer(tmp_path)
    asked = memlab.estimate(t, gpus=4, strategy="zero3", device="cpu")  # DeepSpeed's defaults
    parameters, _ = layer_counts(t.model)
    t.args.deepspeed = {"zero_optimization": {"stage": 3, "reduce_bucket_size": 1000,
                                              "stage3_prefetch_bucket_size": 500,
                                              "stage3_param_persistence_threshold": 0}}
    before = dict(vars(t.args))
    read = memlab.estimate(t, gpus=4, device="cpu")
    assert read.status == asked.status == "ok", (read.error, asked.error)
    assert dict(vars(t.args)) == before
    w = 4  # fp32 weights
    buckets = asked.detail["communication"] - read.detail["communication"]
    assert buckets == w * (DS_REDUCE_BUCKET - 1000 + min(DS_PREFETCH_BUCKET, parameters) - 500)
    # DeepSpeed's default threshold (1e5 elements) keeps every weight of this tiny model whole on each rank; 0 none
    kept = asked.detail["persistent_params"] - read.detail["persistent_params"]
    assert kept == w * persistent_count(t.model, DS_PERSISTENCE_THRESHOLD) == w * parameters
    assert asked.peak_bytes - read.peak_bytes == buckets + kept
    assert ("reduce_bucket_size 1,000 (the config's), stage3_prefetch_bucket_size 500 (the config's), "
            "stage3_param_persistence_threshold 0 (the config's)") in "; ".join(read.notes)
    # "auto" as transformers fills it from the model's hidden_size (32)
    names = ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold")
    t.args.deepspeed = {"zero_optimization": {"stage": 3, **dict.fromkeys(names, "auto")}}
    auto = memlab.estimate(t, gpus=4, device="cpu")
    assert auto.detail["communication"] == w * (32 * 32 + int(0.9 * 32 * 32))
    assert auto.detail["persistent_params"] == w * persistent_count(t.model, 320)
    assert ("stage3_param_persistence_threshold 320 (the config's \"auto\": 10 x hidden_size, hidden_size 32)"
            in "; ".join(auto.notes))
    t.args.deepspeed = {"zero_optimization": {"stage": 3, "stage3_max_live_parameters": 1e6}}
    assert ("its stage3_max_live_parameters 1000000.0 not modelled: the estimate is of DeepSpeed's defaults for them"
            in "; ".join(memlab.estimate(t, gpus=4, device="cpu").notes))


def test_a_deepspeed_batch_that_the_gpus_asked_disagree_with_is_one_error_up_front(tmp_path: Path) -> None:
    t = trainer(tmp_path)  # per_device_train_batch_size 2, gradient_accumulation_steps 1
    t.args.deepspeed = {"zero_optimization": {"stage": 2}, "train_batch_size": 16, "train_micro_batch_size_per_gpu": 2,
                        "gradient_accumulation_steps": "auto"}
    before = dict(vars(t.args))
    with pytest.raises(MemlabError, match=r"DeepSpeed config has train_batch_size 16, and on 4 GPUs its arguments "
                                          r"make it 8 \(4 GPUs x per_device_train_batch_size 2 x "
                                          r"gradient_accumulation_steps 1\): transformers refuses it as train\(\) "
                                          r"starts; write \"auto\" for train_batch_size .* or train_batch_size: 8"):
        memlab.estimate(t, gpus=4, device="cpu")
    assert dict(vars(t.args)) == before
    assert memlab.estimate(t, gpus=8, device="cpu").status == "ok"  # 8 x 2 x 1
    t.args.deepspeed = {"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 4,
                        "gradient_accumulation_steps": 2}
    with pytest.raises(MemlabError, match=r"has train_micro_batch_size_per_gpu 4, gradient_accumulation_steps 2, .*"
                                          r"train_micro_batch_size_per_gpu: 2, gradient_accumulation_steps: 1"):
        memlab.estimate(t, gpus=8, device="cpu")


def test_fsdp2_where_the_installed_accelerate_has_none_is_one_error(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import accelerate.utils.fsdp_utils as fsdp_utils

    t = trainer(tmp_path)
    t.args.fsdp, t.args.fsdp_config = True, {"version": 2}
    monkeypatch.delattr(fsdp_utils, "fsdp2_prepare_model")  # an accelerate from before FSDP2
    before = dict(vars(t.args))
    with pytest.raises(MemlabError, match=r"this trainer's FSDP2 \(fsdp=True\) runs on accelerate's FSDP2 .*has none; "
                                          r"write pip install -U accelerate .*fsdp_config=\{'version': 1\}"):
        memlab.estimate(t, gpus=2, device="cpu")
    assert dict(vars(t.args)) == before
    t.args.fsdp_config = {"version": 1}
    read = trainer_sharding(t)
    assert read is not None and read.strategy == "fsdp1"


def test_a_dpo_trainers_reference_is_sharded_as_trl_prepares_it(tmp_path: Path) -> None:
    trl = pytest.importorskip("trl")
    from liger_trainers import dpo_trainer

    dpo = dpo_trainer(tmp_path, liger=False)
    dpo.args.deepspeed = ZERO3
    read = memlab.estimate(dpo, gpus=2, device="cpu")
    assert isinstance(dpo, trl.DPOTrainer) and read.status == "ok", read.error
    assert "share under other (of " in "; ".join(read.notes)
    assert "sharded over 2 GPUs as TRL prepares it for zero3" in "; ".join(read.notes)


def test_a_plain_trainer_is_unchanged(tmp_path: Path) -> None:
    t = trainer(tmp_path, per_device_train_batch_size=2)
    assert trainer_sharding(t) is None
    t.data_collator = pad_collator
    assert memlab.estimate(t, device="cpu").status == "ok"


RANK_SCRIPT = '''
from datasets import Dataset
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments
import memlab

args = TrainingArguments(output_dir="out", deepspeed=ds, per_device_train_batch_size=2, max_steps=5, report_to=[],
                         save_strategy="no", logging_steps=10**6, learning_rate=1e-5, optim="adamw_torch",
                         disable_tqdm=True, use_cpu=True)
model = AutoModelForCausalLM.from_pretrained("CHECKPOINT")  # partitioned as it loads: ZeRO-3 is on
ids = [[(i * 7 + j) % 1000 + 3 for j in range(64)] for i in range(32)]
trainer = Trainer(model=model, args=args, train_dataset=Dataset.from_dict({"input_ids": ids, "labels": ids}))
estimate = memlab.estimate(trainer, device="cpu")  # in the launched rank: the world size is the launch's
trainer.add_callback(Peaks())
trainer.train()
held = deepspeed_held(trainer.model_wrapped.module, trainer.model_wrapped.optimizer)  # between steps
with open(f"rank{torch.distributed.get_rank()}.json", "w") as out:
    json.dump({"estimated": estimate.peak_bytes, "communication": estimate.detail["communication"],
               "status": estimate.status, "error": estimate.error, "notes": list(estimate.notes),
               "measured": min(steps[1:]) + held, "peaks": steps}, out)
'''


@pytest.mark.e2e
@pytest.mark.needs("deepspeed")
def test_a_trainer_launched_on_two_zero3_ranks_estimates_itself_within_5_percent_of_its_step(tmp_path: Path) -> None:
    # Issue 85: the user's launch as TRL's and transformers' docs write it (TrainingArguments(deepspeed=...) before
    # from_pretrained, so that the weights are partitioned as they load), asked from inside the launched script.
    # Measured as test_zero.py measures ZeRO-3 (the model states DeepSpeed holds between steps, plus the peak of a
    # later step; the lowest of four), against the estimate without DeepSpeed's buckets: its reduce bucket
    # (reduce_bucket_size, 5e8 elements) is allocated as the optimizer is set up, before the steps measured.
    from ranks import run_zero3_ranks

    for record in run_zero3_ranks(tmp_path, RANK_SCRIPT, hidden=128, intermediate=256, vocab=1024, timeout=300):
        assert record["status"] == "ok", record["error"]
        assert "DeepSpeed ZeRO-3 (deepspeed=...) on 2 GPUs (the 2 processes it runs in)" in "; ".join(record["notes"])
        without_buckets = record["estimated"] - record["communication"]
        assert abs(without_buckets / record["measured"] - 1) <= 0.05, record
        assert record["estimated"] > record["measured"]  # the buckets make it lean high, never low


DPO_RANK_SCRIPT = '''
from datasets import Dataset
from transformers import AutoModelForCausalLM
import trl
import memlab
from memlab.frontends.cli.trainer import word_tokenizer

args = trl.DPOConfig(output_dir="out", deepspeed=ds, per_device_train_batch_size=2, max_length=96, max_steps=4,
                     report_to=[], save_strategy="no", logging_steps=10**6, learning_rate=1e-5, optim="adamw_torch",
                     disable_tqdm=True, use_cpu=True, bf16=False, seed=0)
model = AutoModelForCausalLM.from_pretrained("CHECKPOINT")  # partitioned as it loads: ZeRO-3 is on
reference = AutoModelForCausalLM.from_pretrained("CHECKPOINT")
rows = [{"prompt": " ".join(f"w{(i * 7 + j) % 900}" for j in range(32)),
         "chosen": " ".join(f"w{(i * 3 + j) % 900}" for j in range(48)),
         "rejected": " ".join(f"w{(i * 5 + j) % 900}" for j in range(40))} for i in range(32)]
trainer = trl.DPOTrainer(model=model, ref_model=reference, args=args, train_dataset=Dataset.from_list(rows),
                         processing_class=word_tokenizer(2048))
estimate = memlab.estimate(trainer, device="cpu")  # TRL prepared the reference for ZeRO-3 in __init__
trainer.add_callback(Peaks())
trainer.train()
held = deepspeed_held(trainer.model_wrapped.module, trainer.model_wrapped.optimizer)  # between steps
shares = {p.ds_tensor.untyped_storage().data_ptr(): p.ds_tensor.untyped_storage().nbytes()
          for p in trainer.ref_model.module.parameters() if p.ds_tensor.numel()}
with open(f"rank{torch.distributed.get_rank()}.json", "w") as out:
    json.dump({"status": estimate.status, "error": estimate.error, "notes": list(estimate.notes),
               "estimated": estimate.peak_bytes, "communication": estimate.detail["communication"], "held": held,
               "reference": sum(shares.values()), "steps": steps}, out)
'''


# TRL's DPOTrainer under ZeRO-3 on two ranks: every step after the first holds 26.4 MB more than the first. It is
# DeepSpeed's parameter prefetch, which starts once step 1 has recorded the modules' trace
# (partitioned_param_coordinator.py: is_complete_trace) and gathers up to stage3_prefetch_bucket_size elements ahead
# (5e7 by default: the whole policy here). The estimate counts the bucket whole beside the step's peak, where the
# run's prefetch peaks at the forward's start with fewer activations held: it leans high. With the bucket set to 0,
# the later steps hold less than the first, and the estimate is within 5%.
DPO_PREFETCH_RATIO = (1.0, 1.12)


@pytest.mark.e2e
@pytest.mark.needs("deepspeed")
@pytest.mark.parametrize("prefetch", [None, 0], ids=["deepspeeds-prefetch", "no-prefetch"])
def test_a_dpo_trainer_with_its_reference_launched_on_two_zero3_ranks_estimates_itself(
        tmp_path: Path, prefetch: int | None) -> None:
    # Issue 85: TRL's DPOTrainer with a reference, both loaded under ZeRO-3 (TRL wraps the reference in a DeepSpeed
    # engine of its own, hooked to gather its partitions: the dry run copies the module, without DeepSpeed's hooks),
    # asked from inside the launched script. Measured as the Trainer's test above: DeepSpeed's states between steps,
    # the reference's partitions, and a later step's own peak (the lowest of three), against the estimate without
    # ZeRO-3's reduce bucket (DeepSpeed's default 5e8 fp32 elements, allocated as the optimizer is set up).
    from ranks import run_zero3_ranks

    script = DPO_RANK_SCRIPT if prefetch is None else (
        f'ds["zero_optimization"]["stage3_prefetch_bucket_size"] = {prefetch}\n' + DPO_RANK_SCRIPT)
    for record in run_zero3_ranks(tmp_path, script, hidden=512, intermediate=1024, vocab=2048):
        assert record["status"] == "ok", record["error"]
        assert "sharded over 2 GPUs as TRL prepares it for zero3" in "; ".join(record["notes"])
        estimated = record["estimated"] - 4 * 500_000_000
        steady = record["held"] + record["reference"] + min(record["steps"][1:])
        if prefetch == 0:
            assert record["communication"] == 4 * 500_000_000  # the config's bucket read: no prefetch counted
            assert abs(estimated / steady - 1) <= 0.05, (estimated / steady, record)
        else:
            low, high = DPO_PREFETCH_RATIO
            assert low < estimated / steady < high, (estimated / steady, record)
