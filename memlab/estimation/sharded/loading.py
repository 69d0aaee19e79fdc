"""The load of a trainer launched on several GPUs: what each rank holds on its GPU and on its host while its model
is loaded (``from_pretrained``) and wrapped by its engine, before the first step; said beside the step's peak, with
which of the two is the run's peak (DESIGN.md 2.6).

What it models is what the installed libraries do (transformers 5.24, accelerate 1.15, DeepSpeed 0.19.8, torch
2.13, TRL 1.16):

- **Every rank reads the full weights on its host**: ``PreTrainedModel._load_pretrained_model`` materialises the
  checkpoint on the CPU in every process. FSDP's ``cpu_ram_efficient_loading`` no longer leaves the other ranks on
  the meta device there: it only skips their non-persistent buffers and initialisation
  (``_move_missing_keys_from_meta_to_device``, ``_initialize_missing_keys``); two gloo ranks show rank 1 holding
  the real weights. The host copy lives until the engine moves the model.
- **FSDP2** (``accelerate.utils.fsdp_utils.fsdp2_prepare_model``): under mixed precision the trainable parameters
  not in fp32 are upcast to fp32 on the host before sharding (not where bitsandbytes' 4-bit weights are: accelerate
  skips both the upcast and the meta path then), and ``original_sd`` keeps the host copy until it returns. With
  ``cpu_ram_efficient_loading`` the model is sharded on the meta device and ``fsdp2_load_full_state_dict`` sends each
  parameter whole from rank 0 (``torch.empty`` of its whole size on the others) and keeps each rank's shard: a GPU
  holds its shards and one whole parameter. Without it ``fully_shard`` moves each unit's parameters whole to the
  GPU (``torch.distributed.fsdp._fully_shard._fsdp_init._move_states_to_device``) and keeps a padded shard
  (``FSDPParam._init_sharded_param``): the shards of the units done and one unit whole, in accelerate's order
  (blocks, input embeddings, tail, root: :func:`~memlab.estimation.sharded.fsdp2.units.fsdp2_layout`). CPU offload
  moves the shards to the host.
- **FSDP1** (``Accelerator.prepare_model``, ``FullyShardedDataParallel(device_id=...)``): each unit (the blocks,
  then the root with the rest) moved whole to the GPU (``_init_utils._move_module_to_device``), flattened into a
  new tensor (``FlatParamHandle.flatten_tensors``) and sharded: one unit twice at a time; under mixed precision the
  trainable shards are upcast to fp32 on the GPU after.
- **DeepSpeed ZeRO-3 with zero.Init** (the model loaded once the ``TrainingArguments`` set ZeRO-3, as TRL's and
  transformers' docs write it; assumed for a model built on the meta device): ``PreTrainedModel.get_init_context``
  partitions each parameter as it is made, ``_load_pretrained_model`` reads the checkpoint on rank 0 only
  (``map_location="cpu"`` there, ``"meta"`` elsewhere) and ``_load_state_dict_into_zero3_model`` loads it a module
  at a time, that module's parameters gathered whole on every rank. ``offload_param`` keeps the partitions on the
  host.
- **DeepSpeed ZeRO-2, or ZeRO-3 on a model loaded whole before ZeRO-3 was set**:
  ``DeepSpeedEngine._configure_distributed_model`` casts the parameters to the mixed-precision dtype on the host and
  moves the model whole to each GPU (ZeRO-3 partitions it after); ZeRO-2's optimizer
  (``runtime/zero/stage_1_and_2.py``) then flattens each parameter group into a new tensor on the GPU where it has
  room (else on the host) and keeps the fp32 master partition.
- **bitsandbytes' quantized weights** are made on the GPU as they load: each rank holds them whole there before any
  engine shards them, and the host only the checkpoint's mapped pages.
- **A reference model** (TRL's DPO and GRPO ``ref_model``) is loaded too and prepared in the trainer's ``__init__``,
  before the policy (``trl.models.utils.prepare_fsdp``: FSDP2 shards it with one ``fully_shard`` on the whole model,
  moved whole to the GPU first; ``prepare_deepspeed``: ZeRO-3 as the policy, else ZeRO off, whole on each GPU).

Not modelled: the optimizer's own partitions made as the engine starts (its state is the step's), the caching
allocator's reserve, a colocated vLLM engine's own load, and a checkpoint stored in another dtype than the model
holds (counted at the model's).

Example:
    >>> from torch import nn
    >>> layout = model_layout(nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64)), mixed=False)
    >>> load = model_load(layout, LoadSetup("zero2", gpus=2, ranks_per_node=2))
    >>> load.gpu_wrap, load.host_load  # the weights whole, then DeepSpeed's flat copy of them
    (66560, 33280)
"""

from __future__ import annotations

import math
import os
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from memlab.live.sharding import ENGINE_NAMES, whole_shape
from memlab.sizes import format_bytes

__all__ = ["GPUS_PER_NODE", "LoadPeak", "LoadSetup", "ModelLayout", "ModelLoad", "load_note", "load_peak",
           "model_layout", "model_load", "node_ranks", "trainer_load", "with_load"]

GPUS_PER_NODE = 8
"""The GPUs of a node where the launch does not say (``ShardedTrainer.host_note``'s and the CLI's rule)."""


@dataclass(frozen=True)
class ModelLayout:
    """What a model's load depends on, in bytes at whole shapes (a ZeRO-3 partition at its ``ds_shape``), each
    tensor once (:func:`model_layout`).

    Attributes:
        whole: its parameters and buffers as held (the host copy ``from_pretrained`` makes on every rank).
        buffers: its buffers (no engine shards them).
        sixteen: its parameters after DeepSpeed's mixed-precision cast (every floating parameter in 2 bytes; as held
            without mixed precision), and its buffers.
        upcast: what accelerate's fp32 upcast of the trainable parameters not in fp32 adds (FSDP under mixed
            precision; none where bitsandbytes' weights are).
        units: each FSDP unit's parameters in accelerate's order, root last: ``(bytes as held, what the upcast adds
            to it)``; none where they were not asked.
        blocks: how many of ``units`` are blocks (FSDP1's root takes the rest).
        largest: the largest parameter (FSDP2's whole parameter sent from rank 0), after the upcast.
        largest_module: the most parameter bytes one module holds itself, after DeepSpeed's cast (ZeRO-3 gathers a
            module's at a time).
        groups: the optimizer's parameter groups (trained parameters with and without weight decay, as
            ``Trainer.create_optimizer`` makes them): ``(bytes after DeepSpeed's cast, elements)``.
        quantized: bitsandbytes' quantized weights (made on the GPU as they load).
        partitioned: ZeRO-3 partitioned it as it loaded (``zero.Init``: its parameters carry ``ds_id``).
        on_meta: built on the meta device to be estimated (loaded as the launch will).
    """

    whole: int
    buffers: int
    sixteen: int
    upcast: int
    units: tuple[tuple[int, int], ...]
    blocks: int
    largest: int
    largest_module: int
    groups: tuple[tuple[int, int], ...] = ()
    quantized: bool = False
    partitioned: bool = False
    on_meta: bool = False

    @property
    def params(self) -> int:
        """Its parameters' bytes as held."""
        return self.whole - self.buffers


def _nbytes(tensor: torch.Tensor) -> int:
    return math.prod(whole_shape(tensor)) * tensor.element_size()


def _quantized(model: nn.Module) -> bool:
    return bool(getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False)) or any(
        type(p).__name__ in ("Params4bit", "Int8Params") for p in model.parameters())


def model_layout(model: nn.Module, *, mixed: bool, decay: Collection[str] | None = None,
                 units: bool = True) -> ModelLayout:
    """``model``'s :class:`ModelLayout`: ``mixed`` says whether the run trains under mixed precision (bf16 or fp16,
    which decides the engines' casts), ``decay`` the names of the parameters with weight decay
    (``trainer.get_decay_parameter_names(model)``; None: one group); ``units=False`` leaves its FSDP units out (only
    a wrap that moves them whole asks them, and finding them takes a 70B model half a second).

    Example:
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4)).to(torch.bfloat16)
        >>> layout = model_layout(model, mixed=True)
        >>> layout.whole, layout.upcast, layout.largest  # 28 bf16 values; each trained one 2 bytes more in fp32
        (56, 56, 64)
    """
    from memlab.estimation.sharded.fsdp2.units import fsdp2_layout, shard_units

    quantized = _quantized(model)
    params = dict(model.named_parameters())
    upcast_on = mixed and not quantized

    def upcast(p: torch.Tensor) -> int:
        floating = p.is_floating_point() and p.dtype != torch.float32
        return math.prod(whole_shape(p)) * (4 - p.element_size()) if upcast_on and p.requires_grad and floating else 0

    def sixteen(p: torch.Tensor) -> int:
        return math.prod(whole_shape(p)) * 2 if mixed and p.is_floating_point() else _nbytes(p)

    found_units: list[tuple[int, int]] = []
    seen: set[int] = set()
    layout = fsdp2_layout(model) if units else []
    for modules, _ in layout:
        found = {id(p): p for m in modules for p in m.parameters() if id(p) not in seen}
        seen.update(found)
        found_units.append((sum(map(_nbytes, found.values())), sum(map(upcast, found.values()))))
    if units:
        rest = [p for p in params.values() if id(p) not in seen]
        found_units.append((sum(map(_nbytes, rest)), sum(map(upcast, rest))))
    blocks = min(len(shard_units(model)), len(layout)) if units else 0  # the layout's first units
    buffers = sum(_nbytes(b) for b in dict(model.named_buffers()).values())
    trained = {name: p for name, p in params.items() if p.requires_grad}
    groups = [[p for name, p in trained.items() if decay is None or name in decay],
              [p for name, p in trained.items() if decay is not None and name not in decay]]
    whole = sum(map(_nbytes, params.values())) + buffers
    if quantized:
        from memlab.estimation.dryrun.adapters import loaded_weight_bytes

        whole = loaded_weight_bytes(model) + buffers
    own = (sum(map(sixteen, m.parameters(recurse=False))) for m in model.modules())
    return ModelLayout(
        whole=whole, buffers=buffers, sixteen=sum(map(sixteen, params.values())) + buffers,
        upcast=sum(map(upcast, params.values())), units=tuple(found_units), blocks=blocks,
        largest=max((_nbytes(p) + upcast(p) for p in params.values()), default=0),
        largest_module=max(own, default=0),
        groups=tuple((sum(map(sixteen, g)), sum(math.prod(whole_shape(p)) for p in g)) for g in groups if g),
        quantized=quantized, partitioned=any(hasattr(p, "ds_id") for p in params.values()),
        on_meta=bool(params) and all(p.device.type == "meta" for p in params.values()))


@dataclass(frozen=True)
class LoadSetup:
    """How the run loads and wraps its models: memlab's ``strategy`` and ``offload`` (a Plan's), the GPUs, the ranks
    of a node (:func:`node_ranks`), mixed precision (bf16 or fp16), and FSDP's ``cpu_ram_efficient_loading``."""

    strategy: str
    offload: str = "none"
    gpus: int = 2
    ranks_per_node: int = 2
    mixed: bool = False
    ram_efficient: bool = False


@dataclass(frozen=True)
class ModelLoad:
    """One model's load on one rank, in the order it happens: its GPU bytes at the peak of ``from_pretrained``
    (``gpu_load``) and held after it (``gpu_loaded``), at the peak of the engine's wrapping (``gpu_wrap``) and held
    after it (``gpu_wrapped``); its host bytes likewise (``host_*``, any rank's; rank 0's in ``host0`` where they
    differ: ZeRO-3 reads the checkpoint there only); and how, in words (the GPU's, the host's)."""

    gpu_load: int
    gpu_loaded: int
    gpu_wrap: int
    gpu_wrapped: int
    host_load: int
    host_loaded: int
    host_wrap: int
    host_wrapped: int
    how: str
    host_how: str
    host0: tuple[int, int, int, int] | None = None

    @property
    def host(self) -> tuple[int, int, int, int]:
        """Any rank's host bytes: at the load's peak, after it, at the wrapping's peak, after it."""
        return self.host_load, self.host_loaded, self.host_wrap, self.host_wrapped


def _sharded_walk(units: Sequence[int], gpus: int, copies: int, offload: bool) -> int:
    """The GPU's peak as units are sharded in turn: the shards of those done (on the host with offload), and the
    unit sharded now ``copies`` times whole with its shard."""
    peak = done = 0
    for unit in units:
        shard = -(-unit // gpus)
        peak = max(peak, done + copies * unit + shard)
        done += 0 if offload else shard
    return peak


def model_load(layout: ModelLayout, setup: LoadSetup, *, reference: bool = False) -> ModelLoad:
    """One model's :class:`ModelLoad` under ``setup`` (the module docstring says what each engine does); a
    ``reference`` model as TRL prepares it (no optimizer, FSDP2 in one unit, ZeRO off under ZeRO-2).

    Example:
        >>> from torch import nn
        >>> layout = model_layout(nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64)), mixed=False)
        >>> efficient = model_load(layout, LoadSetup("fsdp2", gpus=2, ram_efficient=True))
        >>> efficient.gpu_wrap, efficient.gpu_wrapped  # its shards and one weight whole; its shards
        (33024, 16640)
    """
    n, strategy, whole, buffers = setup.gpus, setup.strategy, layout.whole, layout.buffers
    offload_params = setup.offload in ("params", "all")
    if layout.quantized:  # made whole on the GPU as it loads, whatever the engine
        held = whole if strategy == "zero2" else -(-layout.params // n) + buffers
        unit = max((size for size, _ in layout.units), default=layout.largest_module)  # sharded a unit at a time
        return ModelLoad(whole, whole, whole + -(-unit // n), held, 0, 0, 0, 0,
                         "bitsandbytes makes the quantized weights whole on each GPU as they load",
                         "the checkpoint's mapped pages only")
    every = "transformers reads the full weights on every rank"
    if strategy == "zero3" and (layout.partitioned or layout.on_meta):
        share = -(-(layout.sixteen - buffers) // n)  # zero.Init makes them in the mixed-precision dtype
        on_gpu = 0 if offload_params else share
        on_host = share if offload_params else 0
        assumed = ", as when it loads after the TrainingArguments that set ZeRO-3" if layout.on_meta else ""
        return ModelLoad(
            on_gpu + layout.largest_module + buffers, on_gpu + buffers, on_gpu + buffers, on_gpu + buffers,
            on_host, on_host, on_host, on_host,
            f"zero.Init partitions it as from_pretrained loads it, each module's weights gathered whole in turn"
            f"{assumed}", "rank 0 alone reads the checkpoint" + (", the others keep their partitions there"
                                                                   if offload_params else ""),
            host0=(whole + on_host, on_host, on_host, on_host))
    if strategy in ("zero2", "zero3"):
        moved = layout.sixteen  # cast on the host, then moved whole to the GPU
        if strategy == "zero3":  # loaded whole before ZeRO-3 was set: partitioned once on the GPU
            held = -(-(moved - buffers) // n) + buffers
            return ModelLoad(0, 0, moved, 0 if offload_params else held, whole, whole, whole,
                             -(-(moved - buffers) // n) if offload_params else 0,
                             "loaded whole before ZeRO-3 was set, DeepSpeed moves it whole to each GPU and partitions "
                             "it there (TrainingArguments(deepspeed=...) made before from_pretrained partitions it as "
                             "it loads)", every)
        if reference:  # TRL's prepare_deepspeed: ZeRO off under ZeRO-2, the reference whole on each GPU
            return ModelLoad(0, 0, moved, moved, whole, whole, whole, 0,
                             "ZeRO off under TRL, whole on each GPU", every)
        peak = done = 0
        offloaded = setup.offload in ("optimizer", "all")
        for sixteen, elements in layout.groups:  # each group flattened into a new tensor, then its fp32 partition
            peak = max(peak, done + sixteen)
            done += 0 if offloaded else -(-elements // n) * 4
        master = sum(-(-elements // n) * 4 for _, elements in layout.groups)
        return ModelLoad(0, 0, moved + peak, moved + (0 if offloaded else master), whole, whole, whole,
                         master if offloaded else 0,
                         "the weights whole on each GPU and DeepSpeed's flat copy of the largest parameter group",
                         every)
    sizes = [size for size, _ in layout.units]
    upcast = 0 if reference else layout.upcast
    if strategy == "fsdp1":
        units = [*sizes[:layout.blocks], sum(sizes[layout.blocks:])]
        shards = -(-(layout.params + upcast) // n)
        peak = _sharded_walk(units, n, 2, offload_params) + buffers
        held = buffers if offload_params else shards + buffers
        return ModelLoad(0, 0, max(peak, held), held, whole, whole, whole, shards if offload_params else 0,
                         "each unit moved whole to the GPU and flattened into a copy before it is sharded", every)
    shards = -(-(layout.params + upcast) // n)
    if reference:  # TRL's prepare_fsdp: one fully_shard on the whole model
        units, how = [layout.params], "TRL's one fully_shard on all of it, moved whole to the GPU first"
    elif setup.ram_efficient:
        units = []
        how = "with cpu_ram_efficient_loading, each rank's shards and one whole weight sent from rank 0"
    else:
        units = [size + extra for size, extra in layout.units]
        how = "without cpu_ram_efficient_loading, each unit moved whole to the GPU before it is sharded"
    if units:
        peak = _sharded_walk(units, n, 1, offload_params)
    else:
        peak = (0 if offload_params else shards) + layout.largest
    held = buffers if offload_params else shards + buffers
    host = whole + upcast  # the upcast happens on the host, whose copy original_sd keeps until the wrap returns
    return ModelLoad(0, 0, peak + buffers, held, whole, whole, host + (shards if offload_params else 0),
                     shards if offload_params else 0, how, every + ("" if reference or not setup.ram_efficient
                                                                    else ", cpu_ram_efficient_loading or not"))


@dataclass(frozen=True)
class LoadPeak:
    """A run's load (:func:`load_peak`): each GPU's bytes at its peak; the host bytes of rank 0 and of any other
    rank at theirs, and of a node (rank 0's node: it holds the most); the ranks a node runs; the bytes accelerate's
    fp32 upcast adds to each GPU's share for the whole run; and how, in words."""

    gpu_bytes: int
    host_rank0: int
    host_other: int
    node_host_bytes: int
    ranks_per_node: int
    how: str
    host_how: str
    upcast_bytes: int = 0

    @property
    def host_words(self) -> str:
        """The node's host bytes by rank, in words.

        Example:
            >>> LoadPeak(1, 2**30, 0, 2**30, 8, "", "").host_words
            'rank 0 1.00 GiB, the other 7 ranks none'
        """
        if self.host_rank0 == self.host_other:
            return f"{self.ranks_per_node} ranks a node x {format_bytes(self.host_other)}"
        others = self.ranks_per_node - 1
        each = format_bytes(self.host_other) + (" each" if others > 1 else "") if self.host_other else "none"
        return (f"rank 0 {format_bytes(self.host_rank0)}" if not others else
                f"rank 0 {format_bytes(self.host_rank0)}, the other {others} rank{'s' if others > 1 else ''} {each}")


def load_peak(setup: LoadSetup, policy: ModelLoad, reference: ModelLoad | None = None, *,
              upcast: int = 0) -> LoadPeak:
    """The run's :class:`LoadPeak` from its policy's load and a reference model's, in the order a TRL trainer makes
    them: the policy loaded, the reference loaded and prepared in the trainer's ``__init__``, then the policy
    wrapped as ``train()`` starts. A node's host holds rank 0's and the others' at once (the ranks go in step).

    Example:
        >>> from torch import nn
        >>> layout = model_layout(nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64)), mixed=False)
        >>> setup = LoadSetup("fsdp2", gpus=16, ranks_per_node=8)
        >>> peak = load_peak(setup, model_load(layout, setup))
        >>> peak.gpu_bytes, peak.host_other, peak.node_host_bytes  # a unit whole and its shard; the model, 8 times
        (18720, 33280, 266240)
    """
    p0 = policy.host0 or policy.host
    if reference is None:
        steps = [(policy.gpu_load, policy.host[0], p0[0]), (policy.gpu_wrap, policy.host[2], p0[2])]
    else:
        r0, r = reference.host0 or reference.host, reference.host
        steps = [
            (policy.gpu_load, policy.host[0], p0[0]),
            (policy.gpu_loaded + reference.gpu_load, policy.host[1] + r[0], p0[1] + r0[0]),
            (policy.gpu_loaded + reference.gpu_wrap, policy.host[1] + r[2], p0[1] + r0[2]),
            (reference.gpu_wrapped + policy.gpu_wrap, policy.host[2] + r[3], p0[2] + r0[3]),
        ]
    ranks = setup.ranks_per_node
    how = policy.how if reference is None else f"{policy.how}; the reference model: {reference.how}"
    return LoadPeak(max(gpu for gpu, _, _ in steps), max(rank0 for _, _, rank0 in steps),
                    max(other for _, other, _ in steps), max(rank0 + (ranks - 1) * other for _, other, rank0 in steps),
                    ranks, how, policy.host_how, -(-upcast // setup.gpus))


def node_ranks(gpus: int, world_size: int) -> tuple[int, str]:
    """The ranks a node runs, as ``ShardedTrainer.host_note`` counts them: the launch's ``LOCAL_WORLD_SIZE`` in a
    launched process, else :data:`GPUS_PER_NODE` GPUs a node, or fewer where fewer are asked; and where that comes
    from, in words.

    Example:
        >>> node_ranks(16, 1), node_ranks(2, 1)
        ((8, 'a node of 8 GPUs assumed'), (2, 'a node of 2 GPUs assumed'))
    """
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    if local.isdigit() and world_size > 1:
        return int(local), "the launch's LOCAL_WORLD_SIZE"
    ranks = min(gpus, GPUS_PER_NODE)
    return ranks, f"a node of {ranks} GPUs assumed"


def _ram_efficient(trainer: Any, own: bool) -> bool:
    """FSDP's ``cpu_ram_efficient_loading`` for ``trainer``: accelerate's plugin's, else its ``fsdp_config``'s, else
    ``FSDP_CPU_RAM_EFFICIENT_LOADING`` (accelerate's default, off), where the trainer is set up for FSDP itself
    (``own``); on, as memlab's accelerate config writes it, where the strategy is asked (``strategy=``)."""
    if not own:
        return True
    plugin = getattr(getattr(getattr(trainer, "accelerator", None), "state", None), "fsdp_plugin", None)
    value = getattr(plugin, "cpu_ram_efficient_loading", None)
    if value is None:
        config = getattr(getattr(trainer, "args", None), "fsdp_config", None) or {}
        value = config.get("cpu_ram_efficient_loading", config.get("fsdp_cpu_ram_efficient_loading"))
    if value is None:
        value = os.environ.get("FSDP_CPU_RAM_EFFICIENT_LOADING", "false")
    return str(value).strip().lower() in ("1", "true", "yes")


def _decay(trainer: Any, model: nn.Module) -> Collection[str] | None:
    method = getattr(trainer, "get_decay_parameter_names", None)
    return set(method(model)) if callable(method) else None


def trainer_load(trainer: Any, trial: Any, *, own: bool, world_size: int = 1) -> LoadPeak | None:
    """The load of ``trainer`` launched as ``trial`` (a per-GPU estimate: its GPUs, strategy and plan) answers it:
    its model and reference model (TRL's ``ref_model``) as held, ``own`` where the trainer is set up for the
    strategy itself (its FSDP settings then read), ``world_size`` the processes it runs in now. None for a trial of
    one GPU.

    Example:
        >>> from types import SimpleNamespace
        >>> trainer_load(SimpleNamespace(model=None), SimpleNamespace(gpus=1, strategy="none"), own=False) is None
        True
    """
    gpus, strategy = int(getattr(trial, "gpus", 1) or 1), str(getattr(trial, "strategy", "none"))
    model = getattr(trainer, "model", None)
    if gpus <= 1 or strategy not in ENGINE_NAMES or not isinstance(model, nn.Module):
        return None
    plan = trial.plan
    mixed = getattr(plan, "precision", "fp32") in ("bf16", "fp16")
    ranks, _ = node_ranks(gpus, world_size)
    setup = LoadSetup(strategy, getattr(plan, "offload", "none"), gpus, ranks, mixed,
                      strategy == "fsdp2" and _ram_efficient(trainer, own))
    walked = strategy == "fsdp1" or (strategy == "fsdp2" and not setup.ram_efficient)  # units moved whole
    layout = model_layout(model, mixed=mixed, decay=_decay(trainer, model), units=walked)
    reference = getattr(trainer, "ref_model", None)
    loaded = None
    if isinstance(reference, nn.Module) and reference is not model:
        loaded = model_load(model_layout(reference, mixed=mixed, units=strategy == "fsdp1"), setup, reference=True)
    upcast = layout.upcast if strategy.startswith("fsdp") else 0
    return load_peak(setup, model_load(layout, setup), loaded, upcast=upcast)


def load_note(load: LoadPeak, step_bytes: int, strategy: str, node_said: str) -> str:
    """The load said beside the step's peak (``step_bytes``, per GPU), and which of the two is the run's peak.

    Example:
        >>> load = LoadPeak(3 * 2**30, 2**30, 2**30, 8 * 2**30, 8, "each unit moved whole", "on every rank")
        >>> print(load_note(load, 2**31, "fsdp2", "a node of 8 GPUs assumed"))
        the load (from_pretrained, then FSDP2 wrapping): 3.00 GiB per GPU at its peak (each unit moved whole), \
above the step's 2.00 GiB: the load is this run's peak per GPU; host memory per node while loading: 8.00 GiB (8 \
ranks a node x 1.00 GiB: on every rank; a node of 8 GPUs assumed)
    """
    engine = ENGINE_NAMES.get(strategy, strategy)
    above = load.gpu_bytes > step_bytes
    verdict = ("above the step's {}: the load is this run's peak per GPU" if above else
               "below the step's {}: the step is the run's peak").format(format_bytes(step_bytes))
    note = (f"the load (from_pretrained, then {engine} wrapping): {format_bytes(load.gpu_bytes)} per GPU at its peak "
            f"({load.how}), {verdict}; host memory per node while loading: {format_bytes(load.node_host_bytes)} "
            f"({load.host_words}: {load.host_how}; {node_said})")
    if load.upcast_bytes:
        note += (f"; accelerate upcasts the trained weights not in fp32 to fp32 before sharding, "
                 f"{format_bytes(load.upcast_bytes)} more a GPU for the weights alone")
    return note


def with_load(trial: Any, trainer: Any, *, own: bool, world_size: int = 1) -> Any:
    """``trial``, a per-GPU estimate of ``trainer``'s step, with its load (:func:`trainer_load`): one note saying it
    beside the step's peak and which is the run's (:func:`load_note`), ``load_bytes`` (its GPU bytes per rank) and
    ``load_host_bytes`` (its host bytes per node). Unchanged for a trial of one GPU or that did not run.

    Example:
        >>> from types import SimpleNamespace
        >>> trial = SimpleNamespace(status="ok", gpus=1, strategy="none")
        >>> with_load(trial, SimpleNamespace(model=None), own=False) is trial
        True
    """
    import dataclasses

    if trial.status != "ok":
        return trial
    load = trainer_load(trainer, trial, own=own, world_size=world_size)
    if load is None:
        return trial
    _, said = node_ranks(trial.gpus, world_size)
    note = load_note(load, trial.peak_bytes, trial.strategy, said)
    return dataclasses.replace(trial, notes=(*trial.notes, note), load_bytes=load.gpu_bytes,
                               load_host_bytes=load.node_host_bytes)
