"""Dry runs: the memory of a training step predicted on fake tensors, without the hardware and without the weights.

:func:`estimate` (``memlab.estimate``) is the one entry point, and this package reads as its flow:

1. :mod:`memlab.estimation.configs`: which model (a live ``nn.Module``, a transformers config, or a name: a built-in
   shape such as ``"llama-7b"``, a local config, a Hub name), built on the ``meta`` device;
2. :mod:`memlab.estimation.dryrun.fake`: the model and batch on PyTorch's fake tensors (shapes, dtypes, devices and
   storages, no data: nothing is computed, no memory is taken, a 7B model's step is predicted in seconds on a
   laptop), and the device the estimate answers for;
3. :mod:`memlab.estimation.dryrun.single_gpu`: one GPU, training or inference, run by memlab's own runners exactly as
   :func:`memlab.measure` runs them (adapters through :mod:`memlab.estimation.dryrun.adapters`);
4. :mod:`memlab.estimation.sharded.per_gpu`: several GPUs, per GPU: FSDP2 on fake tensors
   (:mod:`memlab.estimation.sharded.fsdp2`) and DeepSpeed ZeRO by its formulas (:mod:`memlab.estimation.sharded.zero`);
   the strategies themselves are in the torch-free :mod:`memlab.live.sharding`;
5. :mod:`memlab.estimation.cuda.context`: for CUDA, the context of the GPU kind the estimate is for (``gpu=``),
   which with the allocator's reserve is what the card will show, and what a budget verdict judges.

The names the single-GPU steps define are importable from here too (``estimate_plans``, ``estimate_inference``,
``load_config``, ``meta_model``, ``fake_batch``, ``parse_batch_shape``, ``adamw8bit_state_bytes``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from memlab.errors import refuse_class
from memlab.estimation.configs import KNOWN_SHAPES, load_config, meta_model, parse_batch_shape
from memlab.estimation.cuda.gpus import GpuKind, gpu_kind
from memlab.estimation.dryrun.fake import BLIND_SPOTS, fake_batch
from memlab.estimation.dryrun.single_gpu import adamw8bit_state_bytes, estimate_inference, estimate_plans
from memlab.estimation.request import EstimateRequest
from memlab.estimation.routes import route
from memlab.live.batch import LossFn
from memlab.plan import Plan
from memlab.report import Trial
from memlab.techniques.vllm import VLLMServer, check_vllm_server

if TYPE_CHECKING:
    from memlab.plan import InferencePlan

__all__ = [
    "BLIND_SPOTS",
    "KNOWN_SHAPES",
    "adamw8bit_state_bytes",
    "estimate",
    "estimate_inference",
    "estimate_plans",
    "fake_batch",
    "load_config",
    "meta_model",
    "parse_batch_shape",
]


def estimate(
    model_or_config: Any,
    batch: Any = None,
    plan: Plan | InferencePlan | None = None,
    *,
    loss_fn: LossFn | None = None,
    budget: int | str | None = None,
    lr: float = 1e-5,
    device: str | torch.device | None = None,
    gpus: int = 1,
    strategy: str = "none",
    gpu: str | GpuKind | None = None,
    load: Mapping[str, Any] | None = None,
    expandable_segments: bool = False,
    host_budget: int | str | None = None,
    vllm_server: VLLMServer | None = None,
) -> Trial:
    """Predict the memory of one steady-state training step of ``plan``, on fake tensors (nothing runs for real).

    The result has the semantics of :func:`memlab.measure`: ``peak_bytes`` and a ``breakdown`` by category
    (params, grads, optimizer, activations, other) at the moment of the peak, with the optimizer state already
    there. It is a :class:`~memlab.report.Trial` with ``estimated=True``, no timings, and ``notes`` saying what an
    estimate cannot see. For CUDA it also carries what the card will show (``card_bytes``): the allocator's reserve
    (``reserved_bytes``) and the CUDA context (``context_bytes``) of the GPU ``gpu``, both modelled. Against a
    ``budget`` it "fits" when that card figure is within it, or the allocated peak where the card figure is unknown
    (``trial.fits``; ``trial.verdict_figure`` says which).

    Args:
        model_or_config: a live ``nn.Module`` (copied onto fake tensors, never touched; a model on the ``meta``
            device, such as :func:`meta_model` builds, works too), a transformers config
            (built on fake tensors, nothing downloaded), or a name: a path to a ``config.json`` or its folder, a
            built-in shape from :data:`~memlab.estimation.configs.KNOWN_SHAPES` (``"llama-7b"``), a
            ``transformers.Trainer`` (its model, ``compute_loss`` and settings; without a batch, its train dataset's
            worst batch), or a Hub name
            (the cached config, else the network; see :func:`load_config`).
        batch: tensors as for ``measure`` (a dict, a tensor, a tuple), or a dict of shapes such as
            ``{"input_ids": (1, 512), "labels": (1, 512)}`` (``*_ids``, ``labels`` and ``attention_mask`` are
            int64, other names float32).
        plan: the plan (default: the plain ``Plan()``).
        loss_fn: ``loss_fn(model, batch) -> scalar``, as for ``measure`` (default ``model(**batch).loss``).
        budget: bytes or a size such as ``"24GiB"``; the trial records it, and ``fits`` compares against it.
        lr: the optimizer's learning rate (it does not change memory).
        device: the device to predict for: ``"cpu"`` or ``"cuda"``. Default: the live model's device, and for a
            config, a name or a model on the meta device ``"cuda"``, even on a machine without one (the trial's
            ``device`` and notes say so).
        gpus: the number of GPUs training is sharded over (default 1); more than 1 needs a ``strategy``.
        strategy: ``"none"`` (one GPU), ``"fsdp2"``, ``"fsdp1"`` (accelerate's ``fsdp_version: 1``), ``"zero2"``
            or ``"zero3"``: the answer is then per GPU, for ``batch`` as each GPU's micro-batch, as a
            :class:`memlab.estimation.sharded.per_gpu.ShardedTrial` (see :mod:`memlab.estimation.sharded.per_gpu` for
            how each strategy is estimated, and :mod:`memlab.estimation.sharded.composed` for adapters and quantized
            loads sharded); its notes name the engine settings assumed. ``Plan(offload="params")`` is sharded only.
        gpu: the kind of GPU a CUDA estimate is for, which sets the CUDA context (per GPU when sharded) and, made
            without CUDA, the attention kernels emulated: a name from :data:`memlab.estimation.cuda.gpus.GPUS`, default
            ``"H100-80GB"`` (or the name torch gives the device, ``"Tesla T4"``), or a GPU memlab does not list as
            :func:`memlab.gpu_kind` describes it (``memlab.gpu_kind("RTX PRO 6000", memory="96GiB",
            capability="12.0")``). The trial's notes name it. On a GPU without bf16 (compute capability below 8.0,
            a T4) a plan in bf16 (``precision="bf16"``; an InferencePlan's ``weights="bf16"``) is refused as a trial
            there refuses it, with the fp16 to write instead.
        load: how the user loads the model: the keyword arguments they pass to ``from_pretrained`` (``dtype``, or
            ``torch_dtype`` as before transformers 5; ``quantization_config`` as a ``BitsAndBytesConfig`` or its
            dict), for a training plan or an :class:`memlab.InferencePlan` alike. The dry run of a config, a name or
            a meta model materialises the weights that way, so that the allocated peak, the reserve and the card
            figure are those of the user's run (see :mod:`memlab.estimation.dryrun.load`). Default (and ``load={}``):
            the load the plan implies (``weights="bf16"`` loads in bf16, ``adapter="qlora"`` in 4-bit NF4 with bf16
            compute, the rest as the installed transformers' ``from_pretrained`` loads it by default: the
            checkpoint's own dtype since transformers 5, fp32 before). A live model, on the meta device too, is
            estimated as it is (its dtypes, quantized layers, adapters and attention implementation); ``load=`` is
            refused for a model whose weights are in memory. The trial's notes name the load assumed. Sharded, a
            dtype load is made before the weights are sharded; a 4-bit load (``bnb_4bit_quant_storage`` in the
            compute dtype, as FSDP needs) is composed from its one-GPU dry run.
        expandable_segments: whether the card figure (``reserved_bytes``) assumes the CUDA caching allocator's
            expandable segments (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``, set before CUDA starts), as
            :mod:`memlab.estimation.cuda.allocator` models them; default False, PyTorch's default. The notes say
            so where it is True. The allocated peak is the same either way.
        host_budget: bytes or a size such as ``"16GiB"``: the host memory the plan may keep (``trial.host_bytes``:
            offloaded optimizer state and activations, a paged optimizer's spill, ZeRO offload per rank); ``fits``
            then needs it too, and ``verdict_figure`` is ``"host"`` where only it is missed. Default: not judged.
        vllm_server: for a GRPOTrainer that generates on a vLLM server (``vllm_mode="server"``), the server's
            ``trl vllm-serve`` settings, :class:`memlab.VLLMServer` (its GPU kind, tensor and data parallel sizes,
            ``gpu_memory_utilization``, ``max_model_len``); default: TRL's defaults on the GPU kind ``gpu``. The
            trial's notes say what each of the server's GPUs holds, and the trial is an error where the server would
            not start (:mod:`memlab.kinds.grpo.server`). Refused for any other model or trainer.

    The arguments become one :class:`~memlab.estimation.request.EstimateRequest`, which every route takes (one GPU,
    sharded, inference, a Trainer): ``load=`` reaches the sharded route as it does the others.

    An :class:`memlab.InferencePlan` estimates inference instead (one forward, or a generation, as
    ``memlab.measure`` runs it; see :func:`estimate_inference`): an :class:`~memlab.report.InferenceTrial` whose
    breakdown has the KV cache apart, and whose ``kv_cache_end_bytes`` is the cache of the context the batch
    shape gives (``{"input_ids": (rows, context)}``), plus ``new_tokens - 1`` when generating.

    Example:
        >>> from transformers import LlamaConfig
        >>> config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        ...                      num_attention_heads=2, vocab_size=256)
        >>> trial = estimate(config, {"input_ids": (2, 32), "labels": (2, 32)}, Plan(checkpointing=True),
        ...                  device="cpu", budget="64MiB")
        >>> trial.status, trial.estimated, trial.fits, sum(trial.breakdown.values()) == trial.peak_bytes
        ('ok', True, True, True)
        >>> loaded = estimate(config, {"input_ids": (2, 32), "labels": (2, 32)}, Plan(adapter="lora", lora_rank=4),
        ...                   load={"dtype": torch.bfloat16}, device="cpu")
        >>> loaded.breakdown["params"] < trial.breakdown["params"], any("dtype=torch.bf" in n for n in loaded.notes)
        (True, True)
    """
    refuse_class(model_or_config, "estimate")
    check_vllm_server(model_or_config, vllm_server)
    if vllm_server is not None and vllm_server.gpu is not None:  # the server's GPU resolved here too
        vllm_server = dataclasses.replace(vllm_server, gpu=gpu_kind(vllm_server.gpu))
    # the GPU's name resolved here, once: an unknown one refused before anything is built, the kind travels below
    kind = gpu_kind(gpu) if gpu is not None else None
    request = EstimateRequest(model_or_config, batch, plan, loss_fn=loss_fn, budget=budget, lr=lr, device=device,
                              gpus=gpus, strategy=strategy, gpu=kind, load=load,
                              expandable_segments=expandable_segments, host_budget=host_budget,
                              vllm_server=vllm_server)
    return route(request)
