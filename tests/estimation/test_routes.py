"""Issue 61 item 4: a tied weight (GPT-2's embedding, which is also its output head and its largest layer) is held
once by every route, and the engines that hold the same bytes show the same figure.

`memlab estimate gpt2 --gpus auto` showed ZeRO-3's sharded parameters 147.2 MiB above FSDP2's at the same GPU count:
exactly GPT-2's tied embedding in fp32. Neither engine counted the tied weight twice: ZeRO-3's estimate filed its one
gathered layer (DeepSpeed's ``largest_layer_params``, GPT-2's tied embedding) under the sharded parameters, where
FSDP2 files its gathered unit as unsharded; and on one GPU it counted a gathered copy DeepSpeed never makes (its
``NoGatherHandle`` makes each parameter a view of its partition). The composed route (adapters, quantized loads)
added two gathered largest layers to ZeRO-2, which gathers nothing, beside its whole weights.

The DeepSpeed test runs ZeRO-3 on two gloo CPU ranks (as ``test_zero3_on_cpu_ranks`` does) on a tied GPT-2 and reads
DeepSpeed's own partitions.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from ranks import CLEAN_RANK_EXIT, run_two_ranks
from test_zoo import ZOO
from torch import nn

import memlab
from memlab import Plan
from memlab.estimation.configs import layer_counts, persistent_count
from memlab.live.sharding import DS_PERSISTENCE_THRESHOLD

ROOT = Path(__file__).resolve().parents[2]
# a GPT-2 whose tied embedding is its largest layer, as the real GPT-2's is
GPT2 = dict(vocab_size=1024, n_embd=32, n_layer=2, n_head=2, n_positions=64, bos_token_id=0, eos_token_id=0)
SHAPES = {"input_ids": (2, 16), "labels": (2, 16)}


def tied_gpt2() -> nn.Module:
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2))


def _tied(model: nn.Module) -> bool:
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    return head is not None and embed.weight is head.weight


def _padding(model: nn.Module, gpus: int) -> int:
    """The most bytes (fp32) that padding each parameter to a multiple of ``gpus`` rows or elements may add."""
    return 4 * sum(gpus * max(p.shape[1:].numel(), 1) for p in {id(p): p for p in model.parameters()}.values())


def test_every_route_holds_gpt2s_tied_embedding_once() -> None:
    model = tied_gpt2()
    assert _tied(model)
    parameters, largest = layer_counts(model)
    embedding = model.get_input_embeddings().weight.numel()
    assert largest == embedding  # the tied embedding is the largest layer, as in the real GPT-2
    assert parameters == sum({id(p): p.numel() for p in model.parameters()}.values())

    one = memlab.estimate(model, SHAPES, Plan(), device="cpu")
    assert one.status == "ok", one.error
    assert one.breakdown["params"] == 4 * parameters
    routes = {(s, g): memlab.estimate(model, SHAPES, Plan(), device="cpu", gpus=g, strategy=s)
              for s in ("fsdp2", "fsdp1", "zero2", "zero3") for g in (1, 2, 4)}
    assert all(t.status == "ok" for t in routes.values()), {k: t.error for k, t in routes.items()}
    for gpus in (1, 2, 4):
        fsdp2, fsdp1, zero2, zero3 = (routes[s, gpus].detail for s in ("fsdp2", "fsdp1", "zero2", "zero3"))
        # FSDP shards and ZeRO-3 partitions hold the same fp32 bytes: the same figure, up to FSDP2's row padding
        assert 0 <= fsdp2["sharded_params"] - zero3["sharded_params"] <= _padding(model, gpus), (gpus, fsdp2, zero3)
        assert zero3["sharded_params"] == 4 * parameters // gpus
        assert fsdp1["sharded_params"] == fsdp2["sharded_params"]
        assert zero2["unsharded_params"] == 4 * parameters  # whole weights, the tied one once
        # ZeRO-3's one gathered layer, the tied embedding, is unsharded as FSDP's gathered unit is; on one GPU
        # DeepSpeed gathers nothing (NoGatherHandle), while FSDP2 copies even there (its world_size == 1 path)
        assert zero3["unsharded_params"] == (0 if gpus == 1 else 4 * embedding)
        assert zero3["unsharded_grads"] == 4 * embedding
        assert fsdp2["unsharded_params"] >= 4 * embedding
    # the model states DeepSpeed's formula gives are unchanged beyond one GPU (fp32: the partitions of weights and
    # gradients, one gathered layer of each, the master weights and AdamW's state), and beside them the parameters
    # under ZeRO-3's persistence threshold whole (the formula leaves them out)
    zero3 = routes["zero3", 4]
    assert zero3.detail["persistent_params"] == 4 * persistent_count(model, DS_PERSISTENCE_THRESHOLD)
    assert zero3.model_state_bytes == 4 * parameters // 4 + 4 * largest + 4 * parameters // 4 + 4 * largest + \
        int(zero3.detail["optimizer"]) + zero3.detail["persistent_params"]


@pytest.mark.parametrize("strategy", ["zero2", "zero3", "fsdp2"])
def test_composed_routes_hold_the_tied_embedding_once(strategy: str) -> None:
    model = tied_gpt2()
    lora = Plan(adapter="lora", lora_rank=2)
    one = memlab.estimate(model, SHAPES, lora, device="cpu")
    two = memlab.estimate(model, SHAPES, lora, device="cpu", gpus=2, strategy=strategy)
    single = memlab.estimate(model, SHAPES, lora, device="cpu", gpus=1, strategy=strategy)
    assert one.status == two.status == single.status == "ok", (one.error, two.error, single.error)
    params = one.breakdown["params"]  # the one-GPU step's weights: the tied embedding once, the adapters
    embedding = model.get_input_embeddings().weight.numel()
    if strategy == "zero2":  # every weight whole on every GPU, nothing gathered beside them
        assert two.detail["unsharded_params"] == single.detail["unsharded_params"] == params
    elif strategy == "zero3":  # partitions, and the largest layer twice (computing, prefetched) but on one GPU
        assert two.detail["sharded_params"] == params // 2
        assert two.detail["unsharded_params"] == 2 * 4 * embedding
        assert single.detail["sharded_params"] == params and single.detail["unsharded_params"] == 0
    else:
        assert two.detail["sharded_params"] == params // 2


TIED_FAMILIES = [name for name in ("gpt2", "opt", "bloom", "bert (masked LM)", "gemma", "xglm", "gpt_bigcode")
                 if name in ZOO]


@pytest.mark.parametrize("name", TIED_FAMILIES)
def test_zero3_and_fsdp2_show_the_same_shards_on_the_zoos_tied_models(name: str) -> None:
    model, batch, loss_fn = ZOO[name]()
    if not _tied(model):
        pytest.skip(f"{name}'s head is not tied in this transformers release")
    parameters, largest = layer_counts(model)
    fsdp2 = memlab.estimate(model, batch, Plan(), device="cpu", gpus=2, strategy="fsdp2", loss_fn=loss_fn)
    zero3 = memlab.estimate(model, batch, Plan(), device="cpu", gpus=2, strategy="zero3", loss_fn=loss_fn)
    assert fsdp2.status == zero3.status == "ok", (fsdp2.error, zero3.error)
    assert zero3.detail["sharded_params"] == 4 * parameters // 2
    assert 0 <= fsdp2.detail["sharded_params"] - zero3.detail["sharded_params"] <= _padding(model, 2)
    assert zero3.detail["unsharded_params"] == 4 * largest


SCRIPT = '''
import json, torch
torch.set_num_threads(1)
import deepspeed
from transformers import GPT2Config, GPT2LMHeadModel

deepspeed.init_distributed("gloo")
rank = torch.distributed.get_rank()
ds = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 3},
      "zero_force_ds_cpu_optimizer": False, "steps_per_print": 10**9}
with deepspeed.zero.Init(config_dict_or_path=ds):
    model = GPT2LMHeadModel(GPT2Config(**CONFIG))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds)
gathered = {}


def seen(module, args):
    gathered[type(module).__name__] = module.weight.numel()


model.lm_head.register_forward_pre_hook(seen)
model.transformer.wte.register_forward_pre_hook(seen)
batch = {"input_ids": torch.randint(0, CONFIG["vocab_size"], (2, 16))}
batch["labels"] = batch["input_ids"]
engine.backward(engine(**batch).loss)
engine.step()
partitions = {}
for parameter in model.parameters():
    partitions[parameter.ds_tensor.untyped_storage().data_ptr() + parameter.ds_tensor.storage_offset()] = (
        parameter.ds_tensor.numel() * parameter.ds_tensor.element_size())
with open(f"rank{rank}.json", "w") as out:
    json.dump({"partitions": sum(partitions.values()), "tensors": len(partitions),
               "tied": model.lm_head.weight is model.transformer.wte.weight, "gathered": gathered}, out)
''' + CLEAN_RANK_EXIT


@pytest.mark.e2e
@pytest.mark.needs("deepspeed")
def test_deepspeeds_own_zero3_partitions_of_a_tied_gpt2_are_the_estimates(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.replace("CONFIG", repr(GPT2)))
    run_two_ranks(script)
    model = tied_gpt2()
    parameters, largest = layer_counts(model)
    unique = len({id(p) for p in model.parameters()})
    zero3 = memlab.estimate(model, SHAPES, Plan(), device="cpu", gpus=2, strategy="zero3")
    fsdp2 = memlab.estimate(model, SHAPES, Plan(), device="cpu", gpus=2, strategy="fsdp2")
    for rank in (0, 1):
        ranks = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert ranks["tied"] and ranks["tensors"] == unique  # one partition for the tied weight
        assert ranks["gathered"] == {"Embedding": largest, "Linear": largest}  # gathered whole, in turn
        # DeepSpeed pads each partition to ceil(numel / 2) elements: at most one element per parameter
        assert 0 <= ranks["partitions"] - zero3.detail["sharded_params"] <= 4 * unique, (ranks, zero3.detail)
        assert abs(ranks["partitions"] - fsdp2.detail["sharded_params"]) <= _padding(model, 2)


def test_a_trainer_whose_first_step_fits_and_second_does_not_is_said_not_to_fit(tmp_path: Path) -> None:
    # Issue 85: "why does step 2 run out of memory when step 1 did not": torch's AdamW makes its state in step 1's
    # optimizer.step(), which every later step holds from its start. The estimate is the steady step; its timeline
    # draws step 1 too, and a budget between the two peaks is said to be missed, with why.
    from trainers import make_trainer

    trainer = make_trainer(tmp_path)
    free = memlab.estimate(trainer, device="cpu")
    first = free.timeline.first_step()
    assert first is not None and first.peak.bytes < free.peak_bytes
    optimizer = free.timeline.peak.by_category["optimizer"]
    assert optimizer > 0 and first.series["optimizer"][0] == 0  # no state before step 1's optimizer.step()
    budget = (first.peak.bytes + free.peak_bytes) // 2
    trial = memlab.estimate(trainer, device="cpu", budget=budget)
    assert trial.peak_bytes == free.peak_bytes and not trial.fits
    said = next(note for note in trial.notes if "step 1 fits the budget" in note)
    assert f"its peak is {memlab.sizes.format_bytes(first.peak.bytes)}" in said
    figure = trial.timeline.plot(first_step=True)
    titles = [annotation.text for annotation in figure.layout.annotations]
    assert titles[0].startswith("step 1: peak") and "step 2 and after" in titles[1]
    roomy = memlab.estimate(trainer, device="cpu", budget=free.peak_bytes * 2)
    assert roomy.fits and not any("step 1 fits" in note for note in roomy.notes)
