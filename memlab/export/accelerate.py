"""Plan -> accelerate: a config for ``accelerate launch --config_file`` (FSDP2, FSDP1 or DeepSpeed ZeRO), and the
training script that goes with it, carrying the plan's other levers (accumulation, precision, optimizer, adapters).

The config's keys are accelerate 1.x's own (``accelerate config`` writes the same): ``distributed_type: FSDP`` with
an ``fsdp_config`` (``fsdp_version: 2``, ``fsdp_reshard_after_forward``, ``fsdp_auto_wrap_policy:
TRANSFORMER_BASED_WRAP``, ``fsdp_activation_checkpointing``, ``fsdp_offload_params``), or ``distributed_type:
DEEPSPEED`` with a ``deepspeed_config`` (``zero_stage``, ``offload_optimizer_device``, ``offload_param_device``,
``zero3_init_flag``, ``gradient_accumulation_steps``). The FSDP2 wrapping is accelerate's own
``fsdp2_prepare_model`` (accelerate 1.15), which the FSDP2 estimate follows
(:func:`memlab.estimation.sharded.fsdp2.fsdp2_layout`): one unit per class in the model's ``_no_split_modules`` (or
``layer_classes``), the input embeddings, the final norm with the head, then the root. Write the dict with
``yaml.safe_dump``; :func:`fsdp2_torch_script` is the same sharding in plain PyTorch (``fully_shard``), runnable
with ``torchrun`` where accelerate does not shard (a machine without GPUs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memlab.errors import MemlabError
from memlab.export.engines import (
    assembled_code,
    forward_backward,
    loss_and_optimizer,
    optimizer_step,
    refuse_unless_carried,
)
from memlab.plan import Plan
from memlab.techniques.core.fragments import Accelerate, merge_keys
from memlab.techniques.core.registry import REGISTRY
from memlab.techniques.offload import NO_OFFLOAD, offload_from_accelerate

__all__ = ["accelerate_config", "accelerate_script", "fsdp2_torch_script", "sharding_from_accelerate"]


def _check(gpus: Any, strategy: Any) -> tuple[int, str]:
    from memlab.live.sharding import check_sharding

    gpus, strategy = check_sharding(gpus, strategy)
    if strategy == "none":
        raise MemlabError('an accelerate config needs a strategy; write strategy="fsdp2", "fsdp1", "zero2" or "zero3"')
    return gpus, strategy


def _refuse_for(plan: Plan, strategy: str) -> None:
    """A MemlabError where a lever's value cannot go with ``strategy`` (its fragment's ``refused``)."""
    for lever in REGISTRY.values():
        fragment = lever.fragment(plan, "accelerate")
        if isinstance(fragment, Accelerate) and strategy in fragment.refused:
            raise MemlabError(fragment.refused[strategy])


def _fragments_of(strategy: str) -> str:
    """The strategy whose fragments a strategy's export takes: FSDP1's keys are FSDP2's (``fsdp_offload_params``,
    ``fsdp_activation_checkpointing`` mean the same under both versions)."""
    return "fsdp2" if strategy == "fsdp1" else strategy


def accelerate_config(
    plan: Plan, *, gpus: int, strategy: str = "fsdp2", layer_classes: Sequence[str] | None = None
) -> dict[str, Any]:
    """The accelerate config for ``plan`` on ``gpus`` GPUs of one machine, sharded with ``strategy``.

    - ``strategy="fsdp2"``: ``fsdp_version: 2``, ``fsdp_reshard_after_forward: true``,
      ``fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP`` (``fsdp_transformer_layer_cls_to_wrap`` from
      ``layer_classes`` when given, else the model's ``_no_split_modules``), ``fsdp_activation_checkpointing`` from
      the plan's checkpointing, ``fsdp_offload_params`` where it offloads the optimizer (FSDP2 offloads sharded
      weights, gradients and optimizer state together), sharded state dicts, RAM-efficient loading.
    - ``strategy="fsdp1"``: ``fsdp_version: 1``, ``fsdp_sharding_strategy: FULL_SHARD`` (flat parameters),
      ``fsdp_backward_prefetch: BACKWARD_PRE``, ``fsdp_use_orig_params: true`` (what peft's adapters need: frozen
      and trained weights in one unit), ``fsdp_sync_module_states``, and FSDP2's keys for the plan's levers
      (``fsdp_offload_params`` for ``offload="params"`` or ``"optimizer"``, ``fsdp_activation_checkpointing``);
      accelerate's plugin limits the all-gathers in flight (``limit_all_gathers``, its default).
    - ``strategy="zero2"`` / ``"zero3"``: DeepSpeed with ``zero_stage``, the optimizer (and for ZeRO-3 with
      ``offload="all"`` or ``"params"`` the parameters) offloaded to the CPU where the plan asks,
      ``zero3_init_flag`` for ZeRO-3. ZeRO-2 cannot offload the parameters: ``offload="params"`` is refused there.
    - ``mixed_precision`` from the plan's precision; activation offload has no accelerate key here (the script
      says how).

    Example:
        >>> config = accelerate_config(Plan(checkpointing=True, precision="bf16"), gpus=8)
        >>> config["distributed_type"], config["num_processes"], config["mixed_precision"]
        ('FSDP', 8, 'bf16')
        >>> config["fsdp_config"]["fsdp_version"], config["fsdp_config"]["fsdp_activation_checkpointing"]
        (2, True)
        >>> accelerate_config(Plan(offload="optimizer"), gpus=4, strategy="zero3")["deepspeed_config"]["zero_stage"]
        3
    """
    gpus, strategy = _check(gpus, strategy)
    refuse_unless_carried(plan, "accelerate", "an accelerate config")
    _refuse_for(plan, strategy)
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "downcast_bf16": "no",
        "machine_rank": 0,
        "main_training_function": "main",
        "num_machines": 1,
        "num_processes": gpus,
        "rdzv_backend": "static",
        "same_network": True,
        "tpu_env": [],
        "tpu_use_cluster": False,
        "tpu_use_sudo": False,
        "use_cpu": False,
    }
    section: dict[str, Any]
    if strategy == "fsdp2":
        section = {
            "fsdp_version": 2,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_reshard_after_forward": True,
            "fsdp_cpu_ram_efficient_loading": True,
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        }
    elif strategy == "fsdp1":
        section = {
            "fsdp_version": 1,
            "fsdp_sharding_strategy": "FULL_SHARD",
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_backward_prefetch": "BACKWARD_PRE",
            "fsdp_forward_prefetch": False,
            "fsdp_use_orig_params": True,
            "fsdp_sync_module_states": True,
            "fsdp_cpu_ram_efficient_loading": True,
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        }
    if strategy in ("fsdp1", "fsdp2"):
        names = _class_names(layer_classes)
        if names:
            section["fsdp_transformer_layer_cls_to_wrap"] = ",".join(names)
        config["distributed_type"], name = "FSDP", "fsdp_config"
    else:
        stage = int(strategy[-1])
        section = {"zero_stage": stage, "zero3_init_flag": stage == 3,
                   **({"zero3_save_16bit_model": True} if stage == 3 else {})}
        config["distributed_type"], name = "DEEPSPEED", "deepspeed_config"
    levers: dict[str, Any] = {}  # the levers' keys of the section, which may override its defaults
    for lever in REGISTRY.values():
        fragment = lever.fragment(plan, "accelerate")
        if isinstance(fragment, Accelerate):
            config = merge_keys(config, fragment.config)
            levers = merge_keys(levers, fragment.section(_fragments_of(strategy)))
    config[name] = {**section, **levers}
    return config


def _keywords(keywords: dict[str, str]) -> str:
    return ", ".join(f"{name}={value}" for name, value in keywords.items())


def _class_names(layer_classes: Any) -> list[str]:
    """``layer_classes`` as accelerate's class names: a name (``"LlamaDecoderLayer"``, or several joined with
    commas), a sequence of names, or the classes themselves; a MemlabError for anything else."""
    if layer_classes is None:
        return []
    items = layer_classes.split(",") if isinstance(layer_classes, str) else layer_classes
    if isinstance(items, type) or not isinstance(items, (list, tuple, set, frozenset)):
        items = [items]
    names = [item.__name__ if isinstance(item, type) else item.strip() if isinstance(item, str) else None
             for item in items]
    if not names or any(not name for name in names):
        raise MemlabError(
            f"layer_classes={layer_classes!r} is not a list of layer class names; write for example "
            "layer_classes=['LlamaDecoderLayer'] (the model's repeated block, as in its _no_split_modules)"
        )
    return [str(name) for name in names]


def accelerate_script(plan: Plan, *, strategy: str = "fsdp2", model_name: str = "MODEL_NAME") -> str:
    """A training script for ``accelerate launch --config_file <the config> train.py`` that uses the plan's other
    levers with the config of ``strategy``: its micro-batch (the DataLoader's ``batch_size``), accumulation
    (``Accelerator(gradient_accumulation_steps=...)``), precision (from the config), optimizer (the plan's own, never
    another), pure-bf16 weights, adapters (peft's ``LoraConfig`` with the values memlab measured; QLoRA loads the
    base with a 4-bit NF4 ``BitsAndBytesConfig``), the chunked loss (the same ``compute_loss`` as
    :meth:`Plan.to_code`), activation offload (``save_on_cpu``) and, with ZeRO, checkpointing (the model's own
    switch; FSDP2 checkpoints from its config). A lever it cannot carry raises :class:`MemlabError` saying what to
    do instead.

    Example:
        >>> script = accelerate_script(Plan(accumulation=4, adapter="lora"))
        >>> "gradient_accumulation_steps=4" in script, "get_peft_model" in script
        (True, True)
        >>> compile(script, "train.py", "exec") is not None
        True
    """
    _, strategy = _check(2, strategy)
    refuse_unless_carried(plan, "accelerate", "an accelerate script")
    _refuse_for(plan, strategy)
    code = assembled_code(plan, "accelerate", _fragments_of(strategy))
    lines = [
        "# train.py: run with  accelerate launch --config_file memlab_accelerate.yaml train.py",
        *code.environment,
        "import torch",
        "from accelerate import Accelerator",
        "from transformers import AutoModelForCausalLM",
        *code.imports,
        "",
        f"MODEL_NAME = {model_name!r}",
        "lr = 1e-5",
        *code.settings,
        "",
        f"accelerator = Accelerator({_keywords(dict(code.accelerator))})",
        f"model = AutoModelForCausalLM.from_pretrained({_keywords({'': 'MODEL_NAME', **code.load})[1:]})",
        *code.model,
        *loss_and_optimizer(code),
        "dataset = ...  # your dataset: dicts of tensors, dimension 0 = rows",
        f"dataloader = torch.utils.data.DataLoader(dataset, {_keywords(dict(code.data))})",
        "model, optimizer, dataloader = accelerator.prepare(model, optimizer, dataloader)",
        "model.train()",
        "for batch in dataloader:",
        "    with accelerator.accumulate(model):",
        *forward_backward(code, "        ", f"compute_loss({code.loss_model or 'model'}, batch)",
                          "accelerator.backward(loss)"),
        *optimizer_step(code, "        ", "optimizer.zero_grad()"),
    ]
    return "\n".join(lines) + "\n"


MEASURED_STEPS = 3
"""How many steps a recording :func:`fsdp2_torch_script` measures (it keeps the lowest peak)."""


def fsdp2_torch_script(
    plan: Plan,
    *,
    model_code: str,
    batch_code: str,
    steps: int = 2,
    backend: str = "nccl",
    device: str = "cuda",
    record: str | None = None,
) -> str:
    """A plain-PyTorch script for ``torchrun --nproc_per_node N script.py`` that shards exactly as
    :func:`accelerate_config` asks for FSDP2 (the units of accelerate's ``fsdp2_prepare_model``, the layout the
    FSDP2 estimate shards with: each ``_no_split_modules`` block, the input embeddings, the final norm and head, then
    the root; accelerate's ``MixedPrecisionPolicy`` for bf16/fp16; checkpointing through the model's own switch) and
    trains ``steps`` steps with the plan's AdamW (on the adapters alone for a LoRA plan: peft's
    ``get_peft_model`` with memlab's ``LoraConfig`` before the model is sharded).

    ``model_code`` is an expression building the model (on the CPU), ``batch_code`` one building this rank's
    batch. ``backend="gloo", device="cpu"`` runs it on CPU processes (what the tests do); with ``record`` set to a
    path prefix, the last step is instead :data:`MEASURED_STEPS` steps, each measured with memlab's CPU tracker, and
    each rank writes ``<record><rank>.json``: ``peaks`` (each step's), and ``peak_bytes`` and ``breakdown`` of the
    lowest. Gloo's worker thread lets go of a finished collective's buffers only when it next runs, after the
    waiting main thread has gone on; on a busy CPU that can add an all-gather buffer (a whole unit's weights) to one
    step's peak, which FSDP2 itself never holds then. The lowest of several steps is the step without that delay.

    Example:
        >>> script = fsdp2_torch_script(Plan(), model_code="make_model()", batch_code="make_batch()")
        >>> "fully_shard(units, mesh=mesh" in script and compile(script, "s.py", "exec") is not None
        True
    """
    if plan.adapter == "qlora" or plan.optimizer != "adamw" or plan.offload != NO_OFFLOAD or plan.loss != "full":
        raise MemlabError(
            "fsdp2_torch_script covers plans of adamw (LoRA adapters allowed) without QLoRA, offload or chunked "
            "loss; write those levers as their defaults, or use accelerate_script with the accelerate config"
        )
    dtype = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}.get(plan.precision, "None")
    lines = [
        "import json",
        "import torch",
        "import torch.distributed as dist",
        "from torch.distributed.device_mesh import init_device_mesh",
        "from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard",
        "",
        f'dist.init_process_group("{backend}")',
        "rank = dist.get_rank()",
        f'mesh = init_device_mesh("{device}", (dist.get_world_size(),))',
        f"model = {model_code}",
    ]
    if plan.weights == "bf16":
        lines.append("model.to(torch.bfloat16)")
    if plan.checkpointing:
        lines.append('model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})')
    if plan.adapter == "lora":  # peft's adapters before sharding: FSDP2 shards frozen and trained weights alike
        from memlab.techniques.adapters import lora_config_code

        lines += ["from peft import LoraConfig, get_peft_model",
                  f"model = get_peft_model(model, {lora_config_code(plan)})"]
    lines += [
        f"policy = MixedPrecisionPolicy(param_dtype={dtype}, reduce_dtype={dtype}, output_dtype={dtype})",
        "# accelerate's fsdp2_prepare_model layout: the blocks, the input embeddings, the final norm and head (kept",
        "# gathered after forward), then the root",
        "from memlab.estimation.sharded.fsdp2 import fsdp2_layout",
        "",
        "for units, reshard in fsdp2_layout(model):",
        "    fully_shard(units, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)",
        "fully_shard(model, mesh=mesh, mp_policy=policy)",
        f'model.to("{device}")',
        "optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)",
        f"batch = {batch_code}",
        "",
        "",
        "def step():",
        f'    with torch.autocast("{device}", dtype={dtype}, enabled={dtype != "None"}):',
        "        loss = model(**batch).loss",
        "    loss.backward()",
        "    optimizer.step()",
        "    optimizer.zero_grad(set_to_none=True)",
        "",
        "",
        f"for _ in range({max(steps - 1, 0)}):",
        "    step()",
    ]
    if record is None:
        lines.append("step()")
    else:
        lines += [
            "from memlab.measure.tracker import MemoryTracker",
            "",
            "measured = []",
            f"for _ in range({MEASURED_STEPS}):",
            "    state = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]",
            "    tracker = MemoryTracker(baseline={",
            '        "params": [*model.parameters(), *model.buffers()], "optimizer": state,',
            '        "other": [t for t in batch.values() if isinstance(t, torch.Tensor)]}, device="cpu")',
            "    with tracker:",
            "        step()",
            "    measured.append((tracker.peak_bytes, tracker.breakdown))",
            "peak_bytes, breakdown = min(measured, key=lambda one: one[0])",
            f"with open(f'{record}{{rank}}.json', 'w') as out:",
            '    json.dump({"peak_bytes": peak_bytes, "breakdown": breakdown,',
            '               "peaks": [one[0] for one in measured]}, out)',
        ]
    lines.append("dist.destroy_process_group()")
    return "\n".join(lines) + "\n"


def sharding_from_accelerate(config: Any) -> dict[str, Any]:
    """The ``gpus``, ``strategy`` and ``offload`` of a user's accelerate config (the dict of the YAML file
    ``accelerate launch --config_file`` reads, or the path of that file), for ``memlab.estimate(...,
    gpus=..., strategy=...)`` and ``Plan(offload=...)``: ``distributed_type: FSDP`` with ``fsdp_version`` 1 (or none:
    accelerate's default) or 2, ``DEEPSPEED`` with ``zero_stage`` 2 or 3; FSDP's ``fsdp_offload_params`` and
    DeepSpeed's ``offload_param_device`` are ``offload="params"``, ``offload_optimizer_device`` alone
    ``"optimizer"``. What it cannot map is a MemlabError saying what to write.

    Example:
        >>> sharding_from_accelerate({"distributed_type": "FSDP", "num_processes": 8,
        ...                           "fsdp_config": {"fsdp_sharding_strategy": "FULL_SHARD",
        ...                                           "fsdp_offload_params": True}})
        {'gpus': 8, 'strategy': 'fsdp1', 'offload': 'params'}
        >>> sharding_from_accelerate({"distributed_type": "DEEPSPEED", "num_processes": 2,
        ...                           "deepspeed_config": {"zero_stage": 3, "offload_optimizer_device": "cpu"}})
        {'gpus': 2, 'strategy': 'zero3', 'offload': 'optimizer'}
    """
    if isinstance(config, (str, bytes)) or hasattr(config, "__fspath__"):
        import yaml

        with open(config, encoding="utf-8") as file:  # noqa: PTH123 - a path as accelerate takes it
            config = yaml.safe_load(file)
    if not isinstance(config, dict):
        raise MemlabError("the accelerate config is not a mapping; pass the dict of its YAML file or the file's path")
    gpus = int(config.get("num_processes") or 1) * int(config.get("num_machines") or 1)
    kind = str(config.get("distributed_type", "NO")).upper()
    if kind == "FSDP":
        section = config.get("fsdp_config") or {}
        version = int(section.get("fsdp_version", 1))
        sharding = str(section.get("fsdp_sharding_strategy", "FULL_SHARD")).upper()
        if version == 1 and sharding not in ("FULL_SHARD", "1"):
            raise MemlabError(f"fsdp_sharding_strategy {sharding} is not estimated; memlab estimates FULL_SHARD: "
                              "write fsdp_sharding_strategy: FULL_SHARD (or estimate with strategy='zero2' for "
                              "SHARD_GRAD_OP, which shards gradients and optimizer state only)")
        return {"gpus": gpus, "strategy": "fsdp2" if version == 2 else "fsdp1",
                **offload_from_accelerate("FSDP", section)}
    if kind == "DEEPSPEED":
        section = config.get("deepspeed_config") or {}
        stage = int(section.get("zero_stage", 0))
        if stage not in (2, 3):
            raise MemlabError(f"zero_stage {stage} is not estimated; write zero_stage: 2 or 3")
        return {"gpus": gpus, "strategy": f"zero{stage}", **offload_from_accelerate("DEEPSPEED", section)}
    raise MemlabError(f"distributed_type {kind} does not shard; memlab estimates FSDP and DEEPSPEED configs (write "
                      "distributed_type: FSDP or DEEPSPEED), or one GPU with gpus=1")
