"""A GRPOTrainer that generates with vLLM (memlab.kinds.grpo.vllm): vLLM's arithmetic, and its estimates.

vLLM's arithmetic for a GRPOTrainer that generates with it (issue 59): the weights in vLLM's dtype (packed 4-bit
weights as stored), the KV cache in whole blocks, the share of the card, what a share too small says, and the
utilizations fit tries. No trainer: a tiny Llama and the settings.

TRL's GRPOTrainer generating with vLLM (issue 59): memlab.estimate counts a colocated engine's share
(``vllm_gpu_memory_utilization`` x the card's total memory) resident through the step, or only while it generates with
sleep mode; a served engine adds nothing to the card; a share that cannot hold the weights and one sequence is an
error trial saying what to write; measure refuses (vLLM cannot run here) saying what works, the trainer untouched.

vLLM is not installed, so TRL's engine wrapper is replaced by a stand-in that records what TRL asked of it: the
trainer is otherwise the one ``GRPOTrainer(args=GRPOConfig(use_vllm=True, ...))`` builds. Tiny Llama; the dry runs
answer for an L4-24GB."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from memlab.inference.kv import kv_cache_bytes
from memlab.kinds.grpo.vllm import BLOCK_TOKENS, RUNTIME_ALLOWANCE, utilization_candidates, vllm_share
from memlab.sizes import format_bytes
from memlab.techniques.vllm import VLLMSettings

pytest.importorskip("trl")
import trl  # noqa: E402
import trl.trainer.grpo_trainer as grpo_module  # noqa: E402
from test_grpo_step import FAST, _bytes, grpo, phase_peaks  # noqa: E402

import memlab  # noqa: E402
from memlab import MemlabError  # noqa: E402
from memlab.estimation.cuda.gpus import GPUS  # noqa: E402

CONFIG = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, vocab_size=256)


def test_weights_in_vllms_dtype_and_kv_in_whole_blocks() -> None:
    model = LlamaForCausalLM(LlamaConfig(**CONFIG))  # float32: vLLM loads it in float16
    parameters = sum(p.numel() for p in model.parameters())
    share = vllm_share(VLLMSettings("colocate", 0.25, sleep=False), model, card=2**32, prompt=20, completion=13,
                       sequences=6)
    assert share.weights == parameters * 2 and share.share == 2**30 and share.during_training == 2**30
    tokens = math.ceil(33 / BLOCK_TOKENS) * BLOCK_TOKENS
    assert share.kv_sequence == kv_cache_bytes(model.config, tokens=tokens, dtype=torch.float16) == 2 * 2 * 64 * 48 * 2
    assert share.kv_batch == 6 * share.kv_sequence and share.host == 0
    assert share.least == pytest.approx((share.weights + share.kv_batch + RUNTIME_ALLOWANCE) / 2**32)

    # A QLoRA base: bitsandbytes' packed uint8 storage is what vLLM loads too.
    packed = model.model.layers[0].mlp.up_proj
    packed.weight = torch.nn.Parameter(torch.zeros(64 * 128 // 2, 1, dtype=torch.uint8), requires_grad=False)
    quantized = vllm_share(VLLMSettings("colocate", 0.25, sleep=False), model, card=2**32, prompt=20, completion=13,
                           sequences=6)
    assert share.weights - quantized.weights == 64 * 128 * 2 - 64 * 128 // 2


def test_a_share_too_small_names_the_utilization_that_holds_the_batch() -> None:
    model = LlamaForCausalLM(LlamaConfig(**CONFIG, dtype="bfloat16"))
    share = vllm_share(VLLMSettings("colocate", 1e-6, sleep=True), model, card=2**30, prompt=100, completion=28,
                       sequences=8)
    assert share.during_training == 0  # asleep: level 2 discards weights and KV cache
    said = share.refusal()
    least = math.ceil((share.weights + share.kv_batch) / 2**30 * 100) / 100
    assert said is not None and "vLLM would not start" in said
    assert f"GRPOConfig(vllm_gpu_memory_utilization={least})" in said
    assert vllm_share(VLLMSettings("colocate", 0.5, sleep=True), model, card=2**30, prompt=100, completion=28,
                      sequences=8).refusal() is None
    candidates = utilization_candidates(vllm_share(VLLMSettings("colocate", 0.7, sleep=False), model, card=2**34,
                                                   prompt=100, completion=28, sequences=8))
    assert candidates == [0.07, 0.1, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7]


CARD = GPUS["L4-24GB"].memory_bytes
CARD_H100 = GPUS["H100-80GB"].memory_bytes


class EngineStandIn:
    """What TRL's VLLMGeneration is handed (vLLM itself is not installed): the settings, and a server's info."""

    def __init__(self, **settings: Any) -> None:
        self.settings = settings
        info = {"model_config": {"logprobs_mode": "processed_logprobs"}}
        self.vllm_client = type("Client", (), {"get_server_info": staticmethod(lambda: info)})()


@pytest.fixture
def vllm_trainer(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(grpo_module, "VLLMGeneration", EngineStandIn)

    def make(**settings: Any) -> Any:
        return grpo(tmp_path, use_vllm=True, **settings)

    return make


def _total(trial: Any, index: int) -> int:
    return sum(trial.timeline.series[name][index] for name in trial.timeline.categories)


def test_the_colocated_share_is_held_through_training_or_only_while_it_generates(vllm_trainer: Any) -> None:
    resident = memlab.estimate(vllm_trainer(vllm_gpu_memory_utilization=0.3), gpu="L4-24GB")
    asleep = memlab.estimate(vllm_trainer(vllm_gpu_memory_utilization=0.3, vllm_enable_sleep_mode=True),
                             gpu="L4-24GB")
    share = int(0.3 * CARD)
    for trial in (resident, asleep):
        assert trial.status == "ok" and trial.estimated and trial.device.startswith("cuda"), trial.error
        names = [name for name, _, _ in trial.timeline.phases]
        assert names[0] == "generation" and names[-1] == "optimizer"
        said = " ".join(trial.notes)
        assert (f"vllm_gpu_memory_utilization=0.3 x the L4-24GB's {format_bytes(CARD)} = {format_bytes(share)} "
                "under other") in said
        assert "docs.vllm.ai" in said and "level 2" in said
        # Generating: the engine's whole share over the policy's weights and optimizer state (what the sleeping
        # engine's timeline starts from).
        assert _total(trial, 1) - share == _total(asleep, 0) > 0
    # Training: the share stays on the card without sleep mode, and is released with it.
    awake_training = phase_peaks(resident.timeline)["backward"]
    asleep_training = phase_peaks(asleep.timeline)["backward"]
    assert awake_training - asleep_training == share
    assert resident.peak_bytes == asleep_training + share and resident.timeline.peak.phase != "generation"
    assert asleep.timeline.peak.phase == "generation" and asleep.peak_bytes == _total(asleep, 1) < share * 1.01
    assert resident.reserved_bytes - asleep.reserved_bytes == resident.peak_bytes - asleep.peak_bytes
    # Level 2 discards the weights rather than backing them up: nothing more on the host.
    assert asleep.host_bytes == resident.host_bytes
    assert "vllm_enable_sleep_mode=True: awake only while it generates" in " ".join(asleep.notes)
    # Over the card with the share resident; within it once sleep releases the share during training.
    budget = asleep.peak_bytes + (resident.peak_bytes - asleep.peak_bytes) // 2
    assert not memlab.estimate(vllm_trainer(vllm_gpu_memory_utilization=0.3), gpu="L4-24GB", budget=budget).fits


def test_a_served_engine_leaves_this_card_to_training(vllm_trainer: Any) -> None:
    served = memlab.estimate(vllm_trainer(vllm_mode="server"), gpu="L4-24GB", device="cuda")
    colocated = memlab.estimate(vllm_trainer(vllm_enable_sleep_mode=True), gpu="L4-24GB")
    assert served.status == "ok", served.error
    assert "vllm_mode='server'" in " ".join(served.notes) and "holds only the policy's training" in " ".join(
        served.notes)
    assert served.peak_bytes < 2**30 and served.timeline.phases[0][0] == "generation"
    assert phase_peaks(served.timeline)["backward"] == phase_peaks(colocated.timeline)["backward"]


def test_a_share_too_small_for_the_weights_is_an_error_trial_that_says_what_to_write(vllm_trainer: Any) -> None:
    trial = memlab.estimate(vllm_trainer(vllm_gpu_memory_utilization=1e-7), gpu="L4-24GB")
    assert trial.status == "error" and not trial.fits
    assert "vLLM would not start" in trial.error and "GRPOConfig(vllm_gpu_memory_utilization=0.01)" in trial.error


def test_a_cpu_device_and_several_engine_processes_are_refused(vllm_trainer: Any) -> None:
    with pytest.raises(MemlabError, match=r"shares a CUDA card.*gpu='H100-80GB'.*use_vllm=False"):
        memlab.estimate(vllm_trainer(), device="cpu")
    with pytest.raises(MemlabError, match=r"vllm_tensor_parallel_size=2.*vllm_tensor_parallel_size=1"):
        memlab.estimate(vllm_trainer(vllm_tensor_parallel_size=2))


def test_measure_refuses_saying_what_works_and_changes_nothing(vllm_trainer: Any) -> None:
    trainer = vllm_trainer(vllm_enable_sleep_mode=True)
    weights, args, attributes = _bytes(trainer.model), trainer.args, set(vars(trainer))
    for call in (lambda: memlab.measure(trainer, **FAST), lambda: memlab.fit(trainer, budget="1GiB", **FAST)):
        with pytest.raises(MemlabError) as refused:
            call()
        said = str(refused.value)
        assert "generates with vLLM (use_vllm=True), which cannot run here" in said
        assert "memlab.estimate(trainer, gpu=" in said and "GRPOConfig(use_vllm=False)" in said
    assert _bytes(trainer.model) == weights and trainer.args is args and set(vars(trainer)) == attributes
    assert trainer.args.use_vllm and trainer.args.vllm_enable_sleep_mode


@pytest.mark.slow
def test_a_dry_run_fit_searches_the_engines_share_keeping_the_training(vllm_trainer: Any) -> None:
    trainer = vllm_trainer(vllm_gpu_memory_utilization=0.3)
    weights = _bytes(trainer.model)
    own = memlab.estimate(trainer)  # the default card: an H100-80GB
    budget = own.card_bytes // 2  # the trainer's 0.3 of the card does not fit; 0.1 does
    report = memlab.fit(trainer, budget=budget, dry_run=True, progress=False)
    best = report.best
    assert best is not None and best.fits and best.estimated and best.card_bytes <= budget
    assert best.rows_per_step == 2  # the step's generations, whatever the plan
    assert best.notes[0].startswith("searched: GRPOConfig(vllm_gpu_memory_utilization=0.1, "
                                    "vllm_enable_sleep_mode=False) (the trainer has 0.3, False)")
    assert (best.plan.vllm_memory, best.plan.vllm_sleep) == (0.1, False)  # the plan holds what was found
    at_own_share = memlab.estimate(trainer, best.plan.replace(vllm_memory=0.3), budget=budget)  # the trainer's 0.3
    assert "x the H100-80GB's" in " ".join(best.notes) and not at_own_share.fits
    assert at_own_share.peak_bytes - best.peak_bytes == int(0.3 * CARD_H100) - int(0.1 * CARD_H100)
    # Nothing fits a budget below the policy's own step with the smallest share: the trainer's own estimate stays.
    nothing = memlab.fit(trainer, budget="64MiB", dry_run=True, progress=False)
    assert nothing.best is None and all(not trial.fits for trial in nothing.trials)
    assert _bytes(trainer.model) == weights and trainer.args.vllm_gpu_memory_utilization == 0.3


def test_the_vllm_estimate_and_its_search_call_no_cuda(vllm_trainer: Any) -> None:
    """DESIGN 2.4: no real CUDA call under a dry run (CUDA made to look initialised), the engine's share included."""
    from test_dryrun_no_cuda import check_route

    trainer = vllm_trainer(vllm_enable_sleep_mode=True)
    estimated, _ = check_route(lambda: memlab.estimate(trainer, gpu="L4-24GB"), trainer.model)
    assert estimated.status == "ok" and estimated.timeline.peak.phase == "generation", estimated.error
    report, _ = check_route(lambda: memlab.fit(trainer, budget="3GiB", dry_run=True, progress=False), trainer.model)
    # The smallest share searched: the weights, the generation batch's KV cache and vLLM's 1 GiB allowance.
    assert report.best is not None and "vllm_gpu_memory_utilization=0.02" in report.best.notes[0]


def test_a_plan_read_from_the_trainer_carries_its_engine_and_the_estimate_reads_the_plans(vllm_trainer: Any) -> None:
    """Issue 59: vllm_memory / vllm_sleep are Plan levers: the trainer's own read into its plan, a plan's used."""
    trainer = vllm_trainer(vllm_gpu_memory_utilization=0.3)
    own = memlab.Plan.from_trainer(trainer)
    assert (own.vllm_memory, own.vllm_sleep) == (0.3, False)
    as_set = memlab.estimate(trainer, gpu="L4-24GB")
    assert as_set.plan == own and memlab.estimate(trainer, own, gpu="L4-24GB").peak_bytes == as_set.peak_bytes
    smaller = memlab.estimate(trainer, own.replace(vllm_memory=0.1), gpu="L4-24GB")
    assert smaller.plan.vllm_memory == 0.1 and as_set.peak_bytes - smaller.peak_bytes == int(0.3 * CARD) - int(
        0.1 * CARD)
    asleep = memlab.estimate(trainer, own.replace(vllm_sleep=True), gpu="L4-24GB")  # the share released in training
    assert asleep.plan.vllm_sleep is True and asleep.timeline.peak.phase == "generation"
    assert phase_peaks(as_set.timeline)["backward"] - phase_peaks(asleep.timeline)["backward"] == int(0.3 * CARD)
    assert trainer.args.vllm_gpu_memory_utilization == 0.3 and not trainer.args.vllm_enable_sleep_mode
    with pytest.raises(MemlabError, match=r"not on its card \(vllm_mode='server'\).*trl=trl.GRPOConfig"):
        memlab.estimate(vllm_trainer(vllm_mode="server"), memlab.Plan(vllm_sleep=True), gpu="L4-24GB")


def test_fits_best_plan_exports_its_engine_to_a_grpoconfig_that_builds_it(vllm_trainer: Any) -> None:
    """fit's answer holds the share it found; the GRPOConfig it exports to builds a trainer estimated the same."""
    trainer = vllm_trainer(vllm_gpu_memory_utilization=0.3)
    budget = memlab.estimate(trainer).card_bytes // 2  # an H100-80GB: 0.3 of it does not fit, 0.1 does
    best = memlab.fit(trainer, budget=budget, dry_run=True, progress=False).best
    assert best is not None and (best.plan.vllm_memory, best.plan.vllm_sleep) == (0.1, False)
    kwargs = best.plan.to_training_arguments(trl=trl.GRPOConfig)
    assert (kwargs["vllm_gpu_memory_utilization"], kwargs["vllm_enable_sleep_mode"]) == (0.1, False)
    rebuilt = vllm_trainer(**{key: kwargs[key] for key in ("vllm_gpu_memory_utilization", "vllm_enable_sleep_mode")})
    assert rebuilt.vllm_generation.settings["gpu_memory_utilization"] == 0.1  # what TRL hands vLLM
    assert memlab.Plan.from_trainer(rebuilt).vllm_memory == 0.1
    # The rebuilt trainer's own engine (the plan's levers left to it) is estimated as fit found it.
    again = memlab.estimate(rebuilt, best.plan.replace(vllm_memory=None, vllm_sleep=None), budget=budget)
    assert again.fits and again.peak_bytes == best.peak_bytes
    assert again.plan == best.plan.replace(micro_batch=again.plan.micro_batch)  # Plan(): the trainer's micro-batch


def test_apply_refuses_another_engine_saying_to_build_the_trainer_again(vllm_trainer: Any) -> None:
    """TRL builds the engine in GRPOTrainer.__init__ (its share preallocated there): apply cannot change it."""
    trainer = vllm_trainer(vllm_gpu_memory_utilization=0.3)
    args, attributes = trainer.args, set(vars(trainer))
    for plan in (memlab.Plan(micro_batch=2, vllm_memory=0.1), memlab.Plan(micro_batch=2, vllm_sleep=True)):
        with pytest.raises(MemlabError, match=r"GRPOTrainer.__init__.*build the trainer again with GRPOConfig\("
                                              r"use_vllm=True, vllm_mode='colocate', vllm_"):
            memlab.apply(trainer, plan)
        assert trainer.args is args and set(vars(trainer)) == attributes


def test_a_trainer_without_a_colocated_engine_refuses_the_levers(tmp_path: Any) -> None:
    trainer = grpo(tmp_path)  # use_vllm=False: TRL generates with transformers
    assert memlab.Plan.from_trainer(trainer).vllm_memory is None
    for call in (lambda: memlab.estimate(trainer, memlab.Plan(vllm_memory=0.2), gpu="L4-24GB"),
                 lambda: memlab.apply(trainer, memlab.Plan(micro_batch=2, vllm_sleep=True))):
        with pytest.raises(MemlabError, match=r"engine is not on its card \(use_vllm=False\)"):
            call()


# The vLLM server a GRPOTrainer with vllm_mode="server" generates on (issue 85): each of the server's GPUs, by vLLM's
# arithmetic (memlab.kinds.grpo.server), with trl vllm-serve's settings given as memlab.VLLMServer.


def test_each_server_gpu_holds_its_tensor_parallel_part_and_the_kv_cache_its_share_leaves() -> None:
    from types import SimpleNamespace

    from memlab.estimation.cuda.gpus import gpu_kind
    from memlab.kinds.grpo.server import served_weight_bytes, server_memory

    model = LlamaForCausalLM(LlamaConfig(**{**CONFIG, "num_attention_heads": 4}, num_key_value_heads=2,
                                         max_position_embeddings=4096))  # float32: vLLM serves it in float16
    parameters = sum(p.numel() for p in model.parameters())
    l4 = GPUS["L4-24GB"]
    one = server_memory(memlab.VLLMServer(gpu=l4), model, trainer_gpu=GPUS["H100-80GB"], sequence_tokens=40,
                        sequences=8)
    two = server_memory(memlab.VLLMServer(tensor_parallel_size=2), model, trainer_gpu=l4, sequence_tokens=40,
                        sequences=8)
    assert one.gpu.name == two.gpu.name == "L4-24GB" and one.share == two.share == int(0.9 * CARD)
    assert one.weights == parameters * 2 and two.weights == parameters  # halved over two GPUs
    per_token = kv_cache_bytes(model.config, tokens=1, dtype=torch.float16)
    assert one.kv_token == per_token and two.kv_token == per_token // 2  # the two kv-heads split
    assert one.kv_cache == one.share - one.weights - RUNTIME_ALLOWANCE and one.max_model_len == 4096
    assert one.refusal() is None and one.at_once == 8 and "all at once" in one.note()
    # Four GPUs for two kv-heads: each GPU keeps one head (vLLM replicates them), not half of one.
    assert server_memory(memlab.VLLMServer(tensor_parallel_size=4), model, trainer_gpu=l4,
                         sequence_tokens=40, sequences=8).kv_token == per_token // 2
    # A QLoRA policy's base is served unquantized: its packed layer at its full element count, adapters left out.
    packed = model.model.layers[0].mlp.up_proj
    packed.weight = torch.nn.Parameter(torch.zeros(64 * 128 // 2, 1, dtype=torch.uint8), requires_grad=False)
    packed.weight.quant_state = SimpleNamespace(shape=torch.Size([128, 64]))  # type: ignore[attr-defined]
    packed.register_parameter("lora_A", torch.nn.Parameter(torch.zeros(4, 64)))
    assert served_weight_bytes(model, torch.float16) == parameters * 2

    # A small share: the KV cache left cannot hold one max_model_len sequence, so vLLM would not start; a
    # max_model_len over the model's own is refused as vLLM refuses it; then the utilization asked exceeds what the
    # card has free after the CUDA context.
    room_for_1040 = round((RUNTIME_ALLOWANCE + one.weights + 1040 * one.kv_token) / CARD, 7)
    short = server_memory(memlab.VLLMServer(gpu=l4, gpu_memory_utilization=room_for_1040), model,
                          trainer_gpu=None, sequence_tokens=40, sequences=8)
    said = short.refusal()
    assert short.tokens_held == 1040 and said is not None and "vLLM would not start" in said
    assert "--max-model-len 48" in said  # the trainer's longest sequence, in whole blocks
    longer = server_memory(memlab.VLLMServer(max_model_len=8192), model, trainer_gpu=None, sequence_tokens=40,
                           sequences=8).refusal()
    assert longer is not None and "max_position_embeddings=4096" in longer and "--max-model-len 4096" in longer
    small = gpu_kind("small", memory="1280MiB", capability="8.0")
    assert "vLLM would not start" in str(server_memory(memlab.VLLMServer(gpu=small), model, trainer_gpu=None,
                                                       sequence_tokens=40, sequences=8).refusal())
    whole = server_memory(memlab.VLLMServer(gpu=GPUS["T4-16GB"], gpu_memory_utilization=1.0), model, trainer_gpu=None,
                          sequence_tokens=40, sequences=8)
    said = whole.refusal()
    t4 = GPUS["T4-16GB"]
    most = math.floor((t4.memory_bytes - t4.context_bytes) / t4.memory_bytes * 100) / 100
    assert said is not None and f"write --gpu-memory-utilization {most} or less" in said
    # Fewer tokens than the batch needs: some sequences wait their turn.
    crowded = server_memory(memlab.VLLMServer(gpu=l4, gpu_memory_utilization=room_for_1040,
                                              max_model_len=512), model, trainer_gpu=None, sequence_tokens=400,
                            sequences=8)
    assert crowded.refusal() is None and crowded.at_once == 2 and "2 at once per engine, the rest in turns" in (
        crowded.note())
    # The trainer's sequences longer than the server takes: refused as vLLM refuses such a request.
    cut = server_memory(memlab.VLLMServer(max_model_len=256), model, trainer_gpu=None, sequence_tokens=400,
                        sequences=8).refusal()
    assert cut is not None and "400 tokens" in cut and "--max-model-len 400" in cut


def test_a_served_trainer_says_what_each_server_gpu_holds(vllm_trainer: Any) -> None:
    trainer = vllm_trainer(vllm_mode="server")
    default = memlab.estimate(trainer, gpu="L4-24GB")
    given = memlab.estimate(trainer, gpu="L4-24GB",
                            vllm_server=memlab.VLLMServer(gpu="H100-80GB", tensor_parallel_size=2,
                                                          data_parallel_size=2, gpu_memory_utilization=0.5))
    assert default.status == given.status == "ok", (default.error, given.error)
    assert "the server's 1 L4-24GB GPU (tensor_parallel_size=1" in " ".join(default.notes)
    said = " ".join(given.notes)
    assert "the server's 4 H100-80GB GPUs (tensor_parallel_size=2, data_parallel_size=2" in said
    assert "--tensor-parallel-size 2 --data-parallel-size 2 --gpu-memory-utilization 0.5." in said  # its command
    assert f"share {format_bytes(int(0.5 * CARD_H100))}" in said
    assert given.peak_bytes == default.peak_bytes  # the trainer's card is the trainer's alone either way
    # A server that would not start is an error trial saying what to write.
    refused = memlab.estimate(trainer, gpu="L4-24GB", vllm_server=memlab.VLLMServer(gpu_memory_utilization=0.04))
    assert refused.status == "error" and "vLLM would not start" in refused.error and "--max-model-len" in refused.error


def test_vllm_server_is_refused_where_no_server_generates(vllm_trainer: Any) -> None:
    colocated = vllm_trainer()
    with pytest.raises(MemlabError, match=r"vllm_mode='server'\) generates on, and this is not one \(vllm_mode="
                                          r"'colocate'\); leave vllm_server out"):
        memlab.estimate(colocated, gpu="L4-24GB", vllm_server=memlab.VLLMServer())
    with pytest.raises(MemlabError, match="is not a VLLMServer; write vllm_server=memlab.VLLMServer"):
        memlab.estimate(vllm_trainer(vllm_mode="server"), gpu="L4-24GB", vllm_server={"tensor_parallel_size": 2})
    with pytest.raises(MemlabError, match="tensor_parallel_size=0 is not a number of GPUs"):
        memlab.VLLMServer(tensor_parallel_size=0)
