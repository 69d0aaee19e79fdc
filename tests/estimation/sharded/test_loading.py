"""The load of a trainer launched on several GPUs (issue 85, "the load"): each engine's GPU and host bytes while the
model is loaded and wrapped, from a tiny Llama's layout, each figure derived from what the installed library does
(the source line is named where the figure is asserted: transformers 5.24, accelerate 1.15, DeepSpeed 0.19.8,
torch 2.13, TRL 1.16)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from memlab import Plan
from memlab.estimation.sharded.loading import (
    LoadSetup,
    load_note,
    load_peak,
    model_layout,
    model_load,
    node_ranks,
    trainer_load,
)

# embed 256 x 64, two layers (q, k, v, o 64 x 64; gate, up 128 x 64, down 64 x 128; two norms of 64), a final norm,
# an untied head 256 x 64
EMBED = 256 * 64
LAYER = 4 * 64 * 64 + 3 * 64 * 128 + 2 * 64
ELEMENTS = 2 * EMBED + 2 * LAYER + 64


def llama(dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=4, vocab_size=256, max_position_embeddings=64, tie_word_embeddings=False)
    return LlamaForCausalLM(config).to(dtype)


def buffers(model: nn.Module) -> int:
    return sum(b.numel() * b.element_size() for b in model.buffers())


def test_the_tiny_llama_is_what_the_figures_below_assume() -> None:
    model = llama()
    assert sum(p.numel() for p in model.parameters()) == ELEMENTS
    layout = model_layout(model, mixed=False)
    assert [size for size, _ in layout.units] == [4 * LAYER, 4 * LAYER, 4 * EMBED, 4 * (EMBED + 64), 0]
    assert layout.blocks == 2 and layout.whole == 4 * ELEMENTS + buffers(model)


def test_fsdp2_with_cpu_ram_efficient_loading_holds_its_shards_and_one_whole_weight() -> None:
    model = llama(torch.bfloat16)
    setup = LoadSetup("fsdp2", gpus=4, ranks_per_node=4, mixed=True, ram_efficient=True)
    layout = model_layout(model, mixed=True)
    load = load_peak(setup, model_load(layout, setup), upcast=layout.upcast)
    # fsdp_utils.py:815-820: under mixed precision every trained bf16 weight becomes fp32 before sharding (2 bytes
    # more each); 844: the model goes to meta and is sharded there; 620-663 (fsdp2_load_full_state_dict): rank 0
    # moves each weight whole to the GPU, the others make it with torch.empty, and each keeps its shard. The largest
    # weight, the embedding or the head (256 x 64 in fp32), is the one whole at a time.
    assert layout.upcast == 2 * ELEMENTS
    assert load.gpu_bytes == 4 * ELEMENTS // 4 + 4 * EMBED + buffers(model)
    # modeling_utils.py:4858-4866: cpu_ram_efficient_loading only spares the other ranks their non-persistent buffers;
    # every rank read the bf16 weights (two gloo ranks show rank 1's equal to the checkpoint), then upcast them on the
    # host (fsdp_utils.py:820), where original_sd (828) keeps them until the wrap returns.
    host = 2 * ELEMENTS + buffers(model) + 2 * ELEMENTS
    assert (load.host_rank0, load.host_other, load.node_host_bytes) == (host, host, 4 * host)
    assert load.upcast_bytes == 2 * ELEMENTS // 4
    offloaded = LoadSetup("fsdp2", "params", gpus=4, ranks_per_node=4, mixed=True, ram_efficient=True)
    moved = load_peak(offloaded, model_load(layout, offloaded))
    # fsdp_utils.py:644-645: with CPU offload each shard goes to the host as it is made: one weight whole on the GPU
    assert moved.gpu_bytes == 4 * EMBED + buffers(model)
    assert moved.host_other == host + 4 * ELEMENTS // 4


def test_fsdp2_without_it_moves_each_unit_whole_to_the_gpu_before_sharding_it() -> None:
    model = llama()
    setup = LoadSetup("fsdp2", gpus=4, ranks_per_node=4)
    load = load_peak(setup, model_load(model_layout(model, mixed=False), setup))
    # torch _fsdp_init.py:369-401 (_move_states_to_device, called by every fully_shard at 567) moves a unit's
    # weights whole to the GPU; _fsdp_param.py:307 keeps a padded shard of each, the whole freed as fully_shard
    # returns. accelerate wraps the blocks first (fsdp_utils.py:850-855): the peak is the second block, with the
    # first one's shard, itself whole and its own shard.
    assert load.gpu_bytes == (4 * LAYER) // 4 + 4 * LAYER + (4 * LAYER) // 4 + buffers(model)
    assert load.how.startswith("without cpu_ram_efficient_loading")
    assert load.host_other == 4 * ELEMENTS + buffers(model) and load.upcast_bytes == 0  # fp32: nothing to upcast


def test_fsdp1_flattens_each_unit_into_a_copy() -> None:
    model = llama()
    setup = LoadSetup("fsdp1", gpus=4, ranks_per_node=4)
    load = load_peak(setup, model_load(model_layout(model, mixed=False), setup))
    # torch _init_utils.py:603 moves the unit to device_id (accelerate passes it, accelerator.py:1958), and
    # _flat_param.py:893 (flatten_tensors) cats its weights into a new flat tensor before shard() keeps a chunk: a block
    # twice and its shard, after the first block's shard. The root (embeddings, final norm, head) is smaller here.
    assert load.gpu_bytes == (4 * LAYER) // 4 + 2 * 4 * LAYER + (4 * LAYER) // 4 + buffers(model)


def partitioned(model: nn.Module) -> nn.Module:
    """``model`` as ``deepspeed.zero.Init`` leaves it outside a gather: each parameter's data empty, its whole shape
    in ``ds_shape``, its id in ``ds_id``."""
    for index, parameter in enumerate(model.parameters()):
        parameter.ds_shape, parameter.ds_id = tuple(parameter.shape), index  # type: ignore[attr-defined]
        parameter.data = torch.empty(0, dtype=parameter.dtype)
    return model


def test_zero3_under_zero_init_holds_its_partition_and_one_module_gathered() -> None:
    model = partitioned(llama(torch.bfloat16))
    setup = LoadSetup("zero3", gpus=4, ranks_per_node=4, mixed=True)
    load = load_peak(setup, model_load(model_layout(model, mixed=True), setup))
    # modeling_utils.py:1435-1447: zero.Init partitions each bf16 weight as it is made; integrations/deepspeed.py:
    # 508-524 gathers one module's own weights whole to load them: the embedding's (or the head's), 256 x 64 bf16.
    assert load.gpu_bytes == 2 * ELEMENTS // 4 + 2 * EMBED + buffers(model)
    # modeling_utils.py:4530-4536: rank 0 reads the checkpoint on the CPU, the others on meta
    whole = 2 * ELEMENTS + buffers(model)
    assert (load.host_rank0, load.host_other, load.node_host_bytes) == (whole, 0, whole)
    assert "rank 0" in load.host_words and "the other 3 ranks none" in load.host_words
    offloaded = LoadSetup("zero3", "params", gpus=4, ranks_per_node=4, mixed=True)
    moved = load_peak(offloaded, model_load(model_layout(model, mixed=True), offloaded))
    # offload_param: zero.Init keeps the partitions on the host, one module gathered on the GPU at a time
    assert moved.gpu_bytes == 2 * EMBED + buffers(model)
    assert moved.host_other == 2 * ELEMENTS // 4 and moved.node_host_bytes == whole + 4 * (2 * ELEMENTS // 4)


def test_zero3_on_a_model_loaded_whole_moves_it_whole_to_each_gpu() -> None:
    model = llama()
    setup = LoadSetup("zero3", gpus=4, ranks_per_node=4, mixed=True)
    load = load_peak(setup, model_load(model_layout(model, mixed=True), setup))
    # engine.py:2077-2094: no ds_id, so DeepSpeed casts the fp32 weights to bf16 on the host (_cast_module_mixed_
    # precision, 1859-1862) and moves the model whole to the GPU before stage 3 partitions it
    assert load.gpu_bytes == 2 * ELEMENTS + buffers(model)
    assert load.host_other == 4 * ELEMENTS + buffers(model)
    assert "loaded whole before ZeRO-3 was set" in load.how


def test_zero2_adds_the_flat_copy_of_the_largest_parameter_group() -> None:
    model = llama()
    decay = {name for name, p in model.named_parameters() if p.ndim >= 2}  # Trainer.get_decay_parameter_names' split
    setup = LoadSetup("zero2", gpus=4, ranks_per_node=4, mixed=True)
    load = load_peak(setup, model_load(model_layout(model, mixed=True, decay=decay), setup))
    # engine.py:1859-1862 and 2094: the weights cast to bf16 and moved whole; stage_1_and_2.py:438-509: each
    # optimizer group flattened into a new bf16 tensor on the GPU (its params made views of it, 534), then its fp32
    # master partition (560-561). The decayed group (all but the norms) is the largest copy.
    decayed = 2 * EMBED + 2 * (4 * 64 * 64 + 3 * 64 * 128)
    assert load.gpu_bytes == 2 * ELEMENTS + buffers(model) + 2 * decayed
    assert load.host_other == 4 * ELEMENTS + buffers(model)


def test_the_lora_cast_costs_what_accelerate_upcasts() -> None:
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear")
    setup = LoadSetup("fsdp2", gpus=2, ranks_per_node=2, mixed=True, ram_efficient=True)
    # peft's default autocast_adapter_dtype=True makes the adapters fp32: accelerate's upcast finds nothing
    default = peft.get_peft_model(llama(torch.bfloat16), config)
    assert model_layout(default, mixed=True).upcast == 0
    # adapters left in bf16 (TRL's choice under ZeRO-3, sft_trainer.py:856-857) are upcast: 2 bytes more each
    kept = peft.get_peft_model(llama(torch.bfloat16), config, autocast_adapter_dtype=False)
    adapters = sum(p.numel() for name, p in kept.named_parameters() if "lora_" in name)
    layout = model_layout(kept, mixed=True)
    # A (r x in) and B (out x r) on each layer's q, k, v, o (64 -> 64), gate and up (64 -> 128), down (128 -> 64)
    assert adapters == 2 * (4 * (4 * 64 + 64 * 4) + 2 * (4 * 64 + 128 * 4) + (4 * 128 + 64 * 4))
    assert layout.upcast == 2 * adapters
    assert load_peak(setup, model_load(layout, setup), upcast=layout.upcast).upcast_bytes == adapters
    # bitsandbytes' 4-bit weights: fsdp_utils.py:795-815 skips the upcast, and the weights were made on the GPU whole
    kept.is_loaded_in_4bit = True
    quantized = model_layout(kept, mixed=True)
    assert quantized.quantized and quantized.upcast == 0
    assert model_load(quantized, setup).gpu_load == quantized.whole


def test_a_reference_model_is_prepared_whole_before_the_policy_is_wrapped() -> None:
    policy, reference = llama(), llama()
    setup = LoadSetup("fsdp2", gpus=4, ranks_per_node=4, ram_efficient=True)
    alone = model_load(model_layout(policy, mixed=False), setup)
    ref = model_load(model_layout(reference, mixed=False), setup, reference=True)
    load = load_peak(setup, alone, ref)
    # trl/models/utils.py:338: one fully_shard on the whole reference, in the trainer's __init__ (the policy still on
    # the host): the reference whole on the GPU with its shard; then the policy's wrap beside the reference's shard
    whole = 4 * ELEMENTS
    assert ref.gpu_wrap == whole + whole // 4 + buffers(reference)
    assert load.gpu_bytes == max(ref.gpu_wrap, ref.gpu_wrapped + alone.gpu_wrap)
    assert load.host_other == 2 * (whole + buffers(policy))  # both read on every rank before either is wrapped
    assert "the reference model: TRL's one fully_shard" in load.how
    zero2 = LoadSetup("zero2", gpus=4, ranks_per_node=4)
    ref2 = model_load(model_layout(reference, mixed=False), zero2, reference=True)
    assert ref2.gpu_wrapped == whole + buffers(reference)  # trl/models/utils.py:285-286: ZeRO off, whole on each GPU


def test_the_ranks_of_a_node_are_the_launchs_where_it_says() -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LOCAL_WORLD_SIZE", "4")
        assert node_ranks(16, 16) == (4, "the launch's LOCAL_WORLD_SIZE")
        assert node_ranks(16, 1) == (8, "a node of 8 GPUs assumed")  # not launched: the environment is not its


def trial(strategy: str, **plan: object) -> SimpleNamespace:
    return SimpleNamespace(gpus=4, strategy=strategy, plan=Plan(**plan))  # type: ignore[arg-type]


def test_the_trainers_fsdp_settings_decide_the_path() -> None:
    model = llama()
    asked = trainer_load(SimpleNamespace(model=model), trial("fsdp2"), own=False)
    assert asked is not None and asked.how.startswith("with cpu_ram_efficient_loading")  # memlab's accelerate config's
    plugin = SimpleNamespace(accelerator=SimpleNamespace(state=SimpleNamespace(
        fsdp_plugin=SimpleNamespace(cpu_ram_efficient_loading=False))))
    own = trainer_load(SimpleNamespace(model=model, **vars(plugin)), trial("fsdp2"), own=True)
    assert own is not None and own.how.startswith("without")
    args = SimpleNamespace(fsdp_config={"cpu_ram_efficient_loading": "true"})
    configured = trainer_load(SimpleNamespace(model=model, args=args), trial("fsdp2"), own=True)
    assert configured is not None and configured.how.startswith("with cpu_ram")
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("FSDP_CPU_RAM_EFFICIENT_LOADING", raising=False)
        default = trainer_load(SimpleNamespace(model=model), trial("fsdp2"), own=True)  # accelerate's default: off
    assert default is not None and default.how.startswith("without")
    assert trainer_load(SimpleNamespace(model=model), SimpleNamespace(gpus=1, strategy="none"), own=False) is None


def test_the_note_says_which_is_the_runs_peak() -> None:
    model = llama()
    load = trainer_load(SimpleNamespace(model=model), trial("zero3", precision="bf16"), own=False)
    assert load is not None
    below = load_note(load, load.gpu_bytes + 1, "zero3", "a node of 4 GPUs assumed")
    above = load_note(load, load.gpu_bytes - 1, "zero3", "a node of 4 GPUs assumed")
    assert "below the step's" in below and "the step is the run's peak" in below
    assert "above the step's" in above and "the load is this run's peak per GPU" in above
    assert "host memory per node while loading" in above and "a node of 4 GPUs assumed" in above


ZERO3_LOAD = '''
from transformers import AutoModelForCausalLM, TrainingArguments
from memlab.estimation.sharded.loading import LoadSetup, model_layout, model_load

args = TrainingArguments(output_dir="out", deepspeed=ds, report_to=[], use_cpu=True, bf16=False)  # ZeRO-3 is on
tracker = MemoryTracker(device="cpu")
tracker.__enter__()
model = AutoModelForCausalLM.from_pretrained("CHECKPOINT")  # partitioned as it loads
tracker.__exit__(None, None, None)
layout = model_layout(model, mixed=False)
load = model_load(layout, LoadSetup("zero3", gpus=2, ranks_per_node=2))
with open(f"rank{torch.distributed.get_rank()}.json", "w") as out:
    json.dump({"peak": tracker.peak_bytes, "gpu": load.gpu_load, "checkpoint": load.host0[0],
               "partitioned": layout.partitioned}, out)
'''


@pytest.mark.e2e
@pytest.mark.needs("deepspeed")
def test_two_zero3_ranks_hold_what_the_load_says_while_from_pretrained_partitions(tmp_path: Any) -> None:
    # DeepSpeed's CPU accelerator: a rank's "GPU" is this host too, so each rank's peak while from_pretrained runs is
    # its GPU figure (its partition, one module gathered whole, the buffers), and rank 0's adds the checkpoint it
    # alone reads. Measured (2026-11-29): rank 1 2,361,728 bytes, the figure exactly; rank 0 6,036,352 and 6,036,864
    # in two runs, the figure 6,036,480 (a few hundred bytes of DeepSpeed's own come and go). With the other core busy,
    # some runs held one or two 128 x 128 weights more (+64 KiB, +128 KiB): a weight of the module before still whole
    # as the next is gathered, which depends on timing; the bound allows two.
    from ranks import run_zero3_ranks

    rank0, rank1 = run_zero3_ranks(tmp_path, ZERO3_LOAD, hidden=128, intermediate=256, vocab=1024, timeout=600)
    assert rank0["partitioned"] and rank1["partitioned"]
    slack = 2 * 128 * 128 * 4 + 1024
    assert -1024 <= rank1["peak"] - rank1["gpu"] <= slack, rank1
    assert -1024 <= rank0["peak"] - (rank0["gpu"] + rank0["checkpoint"]) <= slack, rank0


FSDP_LOAD = '''
import json, os, torch
torch.set_num_threads(1)
torch.distributed.init_process_group("gloo")
os.environ["ACCELERATE_USE_FSDP"] = "true"  # what accelerate launch sets for an FSDP config with the option on
os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = "true"
from transformers import AutoModelForCausalLM
from transformers.integrations import is_fsdp_enabled
from memlab.estimation.sharded.loading import LoadSetup, model_layout, model_load

model = AutoModelForCausalLM.from_pretrained("CHECKPOINT")
held = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in (*model.parameters(), *model.buffers())
        if t.device.type == "cpu"}
load = model_load(model_layout(model, mixed=False), LoadSetup("fsdp2", gpus=2, ranks_per_node=2, ram_efficient=True))
with open(f"rank{torch.distributed.get_rank()}.json", "w") as out:
    json.dump({"fsdp": is_fsdp_enabled(), "held": sum(held.values()), "host": load.host_load}, out)
'''


@pytest.mark.e2e
def test_every_rank_reads_the_full_weights_on_its_host_with_cpu_ram_efficient_loading(tmp_path: Any) -> None:
    # transformers 5.24 under FSDP's cpu_ram_efficient_loading: rank 1 holds the full weights on the host as rank 0
    # does (the load's host figure for every rank), not an empty model on the meta device
    import json

    from ranks import CLEAN_RANK_EXIT, run_two_ranks

    llama().save_pretrained(tmp_path / "checkpoint")
    script = tmp_path / "load.py"
    script.write_text(FSDP_LOAD.replace("CHECKPOINT", str(tmp_path / "checkpoint")) + CLEAN_RANK_EXIT)
    run_two_ranks(script)
    for rank in (0, 1):
        record = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert record["fsdp"] and record["held"] == record["host"] == 4 * ELEMENTS + buffers(llama()), record
