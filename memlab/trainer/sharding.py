"""A trainer set up for several processes, read as the sharding memlab estimates per GPU: DeepSpeed ZeRO-2 or
ZeRO-3 (``deepspeed=`` a config dict or JSON file, or an accelerate config launching DeepSpeed), FSDP1 or FSDP2
(``fsdp=`` and ``fsdp_config``, or accelerate's FSDP plugin), with their CPU offload.

What the trainer's own accelerator says comes first (it merges the arguments with the accelerate config of
``accelerate launch``); its arguments where it says nothing. Both are turned into the accelerate config's own
keys and read by :func:`memlab.export.accelerate.sharding_from_accelerate`, the one place that maps an engine's
settings to memlab's ``strategy`` and ``offload``.

Example:
    >>> from types import SimpleNamespace
    >>> args = SimpleNamespace(deepspeed={"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}},
    ...                        fsdp=None, world_size=1)
    >>> trainer_sharding(SimpleNamespace(args=args))
    TrainerSharding(strategy='zero3', offload='optimizer', world_size=1, setting='DeepSpeed ZeRO-3 (deepspeed=...)',
                    unread=())
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memlab.errors import MemlabError


@dataclass(frozen=True)
class TrainerSharding:
    """How a trainer shards its training: memlab's ``strategy`` (``"zero2"``, ``"zero3"``, ``"fsdp1"``,
    ``"fsdp2"``) and ``offload`` (a :class:`~memlab.plan.Plan`'s), the processes it runs in now (``world_size``:
    1 in a notebook, ``accelerate launch``'s count in a launched script), and how the trainer says it (for notes)."""

    strategy: str
    offload: str
    world_size: int
    setting: str
    unread: tuple[str, ...] = ()


def trainer_sharding(trainer: Any) -> TrainerSharding | None:
    """The sharding ``trainer`` is set up for, or None for one process (see the module docstring).

    Raises:
        MemlabError: a DeepSpeed config that does not parse, a ZeRO stage or FSDP sharding memlab does not estimate;
            each says what to write.

    Example:
        >>> from types import SimpleNamespace
        >>> trainer_sharding(SimpleNamespace(args=SimpleNamespace(deepspeed=None, fsdp=[]))) is None
        True
        >>> fsdp = SimpleNamespace(deepspeed=None, fsdp=True, fsdp_config={"version": 2, "cpu_offload": True},
        ...                        world_size=8)
        >>> trainer_sharding(SimpleNamespace(args=fsdp))
        TrainerSharding(strategy='fsdp2', offload='params', world_size=8, setting='FSDP2 (fsdp=True)', unread=())
    """
    from memlab.export.accelerate import sharding_from_accelerate

    args = trainer.args
    world_size = int(getattr(args, "world_size", 1) or 1)
    state = getattr(getattr(trainer, "accelerator", None), "state", None)
    deepspeed = _deepspeed_config(getattr(state, "deepspeed_plugin", None), getattr(args, "deepspeed", None))
    if deepspeed is not None:
        stage = int((deepspeed.get("zero_optimization") or {}).get("stage", 0))
        if stage not in (2, 3):
            raise MemlabError(
                f"this trainer's DeepSpeed config has zero_optimization.stage {stage}, which memlab does not estimate "
                "per GPU; write \"zero_optimization\": {\"stage\": 2} (or 3) in it, or drop deepspeed= to ask for one "
                "GPU"
            )
        section = deepspeed["zero_optimization"]
        config = {"distributed_type": "DEEPSPEED", "deepspeed_config": {
            "zero_stage": stage,
            "offload_optimizer_device": (section.get("offload_optimizer") or {}).get("device", "none"),
            "offload_param_device": (section.get("offload_param") or {}).get("device", "none"),
        }}
        setting = f"DeepSpeed ZeRO-{stage} ({_said('deepspeed', getattr(args, 'deepspeed', None), state)})"
        unread = tuple(f"{name} {section[name]}" for name, default in _DEEPSPEED_DEFAULTS.items()
                       if name in section and _number(section[name]) != default)
    else:
        fsdp = _fsdp_config(getattr(state, "fsdp_plugin", None), args)
        if fsdp is None:
            return None
        config = {"distributed_type": "FSDP", "fsdp_config": fsdp}
        setting = f"FSDP{fsdp['fsdp_version']} ({_said('fsdp', getattr(args, 'fsdp', None), state)})"
        unread = ()
    sharding = sharding_from_accelerate(config)
    return TrainerSharding(sharding["strategy"], sharding["offload"], world_size, setting, unread)


# DeepSpeed's own defaults for the buckets the ZeRO estimate sizes (memlab.live.sharding), by config key.
_DEEPSPEED_DEFAULTS = {"reduce_bucket_size": 5e8, "allgather_bucket_size": 5e8, "stage3_prefetch_bucket_size": 5e7}


def _number(value: Any) -> float | None:
    """A DeepSpeed config's number (``5e8``, ``"5e8"``), or None for ``"auto"`` and the like."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _said(name: str, value: Any, state: Any) -> str:
    """How the trainer set the engine: its argument (a file's name, ``...`` for a dict) or accelerate's config."""
    if not value:
        return "accelerate launch's config"
    if isinstance(value, Mapping):
        return f"{name}=..."
    if isinstance(value, (str, Path)):
        return f"{name}={Path(value).name!r}"
    return f"{name}={value!r}"


def _deepspeed_config(plugin: Any, argument: Any) -> Mapping[str, Any] | None:
    """The DeepSpeed config the trainer runs: accelerate's plugin's (the arguments' file or dict, as transformers
    filled its ``"auto"`` values), else the ``deepspeed=`` argument read (a dict, or a JSON file's path)."""
    config = getattr(plugin, "deepspeed_config", None) if plugin is not None else None
    if isinstance(config, Mapping):
        return config
    if not argument:
        return None
    if isinstance(argument, Mapping):
        return argument
    path = Path(argument)
    try:
        read = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise MemlabError(f"the trainer's DeepSpeed config {str(path)!r} cannot be read ({error.strerror}); pass "
                          "deepspeed= the path of a JSON file that exists, or the config as a dict") from None
    except json.JSONDecodeError as error:
        raise MemlabError(f"the trainer's DeepSpeed config {str(path)!r} does not parse as JSON (line {error.lineno}, "
                          f"column {error.colno}: {error.msg}); fix the file, or pass deepspeed= the config as a "
                          "dict") from None
    if not isinstance(read, Mapping):
        raise MemlabError(f"the trainer's DeepSpeed config {str(path)!r} is not a JSON object; write it as "
                          '{"zero_optimization": {"stage": 3}, ...}')
    return read


def _fsdp_config(plugin: Any, args: Any) -> dict[str, Any] | None:
    """The trainer's FSDP as an accelerate config's ``fsdp_config`` keys: accelerate's plugin's where the
    trainer's accelerator has one, else its ``fsdp`` / ``fsdp_config`` arguments (transformers 5's ``version``,
    ``cpu_offload`` and ``reshard_after_forward``, and the options ``fsdp="full_shard offload"`` before them)."""
    if plugin is not None:
        version = int(getattr(plugin, "fsdp_version", 1) or 1)
        reshard = getattr(plugin, "sharding_strategy" if version == 1 else "reshard_after_forward", True)
        policy = getattr(plugin, "cpu_offload", None)  # FSDP2's CPUOffloadPolicy, FSDP1's CPUOffload(offload_params)
        offload = type(policy).__name__ == "CPUOffloadPolicy" or bool(getattr(policy, "offload_params", False))
        return {"fsdp_version": version, "fsdp_offload_params": offload, **_resharding(version, reshard)}
    fsdp = getattr(args, "fsdp", None)
    if not fsdp:
        return None
    options: list[str] = []
    if isinstance(fsdp, str):
        options = fsdp.split()
    elif isinstance(fsdp, (list, tuple)):
        options = [str(getattr(option, "value", option)) for option in fsdp]
    section = dict(getattr(args, "fsdp_config", None) or {})
    version = int(section.get("version") or section.get("fsdp_version") or 2)  # transformers 5 defaults to FSDP2
    strategies = [option for option in options if option not in ("offload", "auto_wrap")]
    reshard = section.get("reshard_after_forward", strategies[0] if strategies else True)
    offload = "offload" in options or bool(section.get("cpu_offload", section.get("offload_params", False)))
    return {"fsdp_version": version, "fsdp_offload_params": offload, **_resharding(version, reshard)}


def _resharding(version: int, reshard: Any) -> dict[str, str]:
    """FSDP's sharding as accelerate's ``fsdp_sharding_strategy``: FSDP2's ``reshard_after_forward`` (True is
    FULL_SHARD), or FSDP1's strategy by name or number. FSDP2 that keeps the weights after the forward is refused
    here, as :func:`~memlab.export.accelerate.sharding_from_accelerate` refuses FSDP1's."""
    text = str(getattr(reshard, "name", reshard)).upper()
    if version == 2:
        if text in ("FALSE", "SHARD_GRAD_OP", "2"):
            raise MemlabError("this trainer's FSDP2 keeps the gathered weights after the forward "
                              "(reshard_after_forward=False), which memlab does not estimate; write fsdp_config="
                              "{'reshard_after_forward': True} (FULL_SHARD)")
        return {"fsdp_sharding_strategy": "FULL_SHARD"}
    return {"fsdp_sharding_strategy": "FULL_SHARD" if text in ("TRUE", "1") else text}


@contextlib.contextmanager
def zero3_gathering_off() -> Iterator[None]:
    """transformers' ZeRO-3 switch off while a dry run runs a trainer's step: DeepSpeed is not there on fake
    tensors, and TRL's losses would gather a ZeRO-3 partition (``maybe_gather_lm_head_ctx`` reads ``ds_status``)
    that the fake model does not have. The per-GPU estimate models the gathering itself. Nothing is done where
    transformers' DeepSpeed integration is not loaded.

    Example:
        >>> with zero3_gathering_off():
        ...     pass
    """
    import sys

    integration = sys.modules.get("transformers.integrations.deepspeed")
    held = getattr(integration, "_hf_deepspeed_config_weak_ref", None)
    if integration is None or held is None:
        yield
        return
    integration._hf_deepspeed_config_weak_ref = None  # type: ignore[attr-defined]
    try:
        yield
    finally:
        integration._hf_deepspeed_config_weak_ref = held  # type: ignore[attr-defined]


@dataclass(frozen=True)
class ShardedTrainer:
    """A trainer estimated per GPU as it is set up: its sharding and the GPUs it runs on
    (:func:`sharded_trainer_request`).

    Example:
        >>> from memlab.plan import Plan
        >>> read = ShardedTrainer(TrainerSharding("zero3", "optimizer", 1, "DeepSpeed ZeRO-3 (deepspeed='ds.json')"), 8)
        >>> read.plan_for(Plan(checkpointing=True)).offload
        'optimizer'
        >>> read.note
        "per GPU as the trainer is set up: DeepSpeed ZeRO-3 (deepspeed='ds.json') on 8 GPUs (gpus=8)"
    """

    sharding: TrainerSharding
    gpus: int

    def plan_for(self, plan: Any) -> Any:
        """``plan`` with the engine's CPU offload (DeepSpeed's ``offload_optimizer`` / ``offload_param``, FSDP's
        ``cpu_offload``) where it sets none of its own.

        Raises:
            MemlabError: the plan offloads something else too, which one estimate does not hold with the engine's.
        """
        from memlab.plan import Plan

        engine = self.sharding.offload
        if not isinstance(plan, Plan) or engine == "none" or plan.offload == engine:
            return plan
        if plan.offload != "none":
            raise MemlabError(
                f"this trainer's {self.sharding.setting} offloads to the CPU (offload={engine!r}) and its plan "
                f"offloads {plan.offload!r} too, which memlab does not estimate together; ask with one of them: "
                f"memlab.estimate(trainer, memlab.Plan(offload={engine!r}), gpus={self.gpus})"
            )
        return plan.replace(offload=engine)

    def host_note(self, host_bytes: int | None) -> str | None:
        """The host memory a node holds for the offload (each rank's ``host_bytes`` times the ranks on a node: the
        launch's ``LOCAL_WORLD_SIZE``, else 8 GPUs a node, or fewer where fewer are asked), or None without offload.

        Example:
            >>> read = ShardedTrainer(TrainerSharding("zero3", "optimizer", 1, "DeepSpeed ZeRO-3 (deepspeed=...)"), 16)
            >>> read.host_note(2 * 2**30)
            'host memory per node: 16.00 GiB (8 ranks a node x 2.00 GiB offloaded each; a node of 8 GPUs assumed)'
        """
        import os

        from memlab.sizes import format_bytes

        if not host_bytes:
            return None
        local = os.environ.get("LOCAL_WORLD_SIZE", "")
        ranks = int(local) if local.isdigit() and self.sharding.world_size > 1 else min(self.gpus, 8)
        said = "the launch's LOCAL_WORLD_SIZE" if local.isdigit() and self.sharding.world_size > 1 else (
            f"a node of {ranks} GPUs assumed")
        return (f"host memory per node: {format_bytes(ranks * host_bytes)} ({ranks} ranks a node x "
                f"{format_bytes(host_bytes)} offloaded each; {said})")

    @property
    def note(self) -> str:
        """What the estimate read from the trainer, and where its GPU count comes from."""
        running = self.sharding.world_size
        said = (f"gpus={self.gpus}" if running != self.gpus else f"the {running} processes it runs in")
        if 1 < running != self.gpus:
            said += f"; it runs in {running} processes now"
        note = f"per GPU as the trainer is set up: {self.sharding.setting} on {self.gpus} GPUs ({said})"
        if self.sharding.unread:
            note += (f"; its {', '.join(self.sharding.unread)} not read: DeepSpeed's defaults estimated (the engine "
                     "settings below)")
        return note


def sharded_trainer_request(request: Any) -> tuple[Any, ShardedTrainer | None]:
    """An estimate's request for a trainer (:class:`~memlab.estimation.request.EstimateRequest`) with the sharding
    the trainer is set up for (:func:`trainer_sharding`): ``gpus`` those given, else the processes it runs in, and
    its strategy; unchanged (and None) for a trainer of one process.

    Raises:
        MemlabError: a trainer set up for DeepSpeed or FSDP in one process with no ``gpus=``, or a ``strategy=`` other
            than the one it is set up for; each says what to write.

    Example:
        >>> from types import SimpleNamespace
        >>> from memlab.estimation.request import EstimateRequest
        >>> args = SimpleNamespace(deepspeed={"zero_optimization": {"stage": 2}}, fsdp=None, world_size=1)
        >>> request, read = sharded_trainer_request(EstimateRequest(SimpleNamespace(args=args), None, None, gpus=4))
        >>> request.gpus, request.strategy, read.sharding.strategy
        (4, 'zero2', 'zero2')
    """
    sharding = trainer_sharding(request.model)
    if sharding is None:
        return request, None
    if request.strategy not in ("none", sharding.strategy):
        raise MemlabError(
            f"this trainer is set up for {sharding.setting}, which memlab estimates as strategy="
            f"{sharding.strategy!r}, not {request.strategy!r}; leave strategy= out, or change the trainer's "
            "deepspeed= / fsdp= arguments"
        )
    gpus = request.gpus if request.gpus > 1 else sharding.world_size
    if gpus <= 1:
        raise MemlabError(
            f"this trainer is set up for {sharding.setting} but runs in one process here; say how many GPUs it will "
            "be launched on: memlab.estimate(trainer, gpus=8) for accelerate launch --num_processes 8"
        )
    return request.replace(gpus=gpus, strategy=sharding.strategy), ShardedTrainer(sharding, gpus)


def engine_plan(trainer: Any, plan: Any, gpus: int) -> Any:
    """``plan`` with the CPU offload of the engine ``trainer`` is set up for (:meth:`ShardedTrainer.plan_for`);
    unchanged for a trainer of one process (asked with ``gpus=`` and ``strategy=``).

    Example:
        >>> from types import SimpleNamespace
        >>> from memlab.plan import Plan
        >>> args = SimpleNamespace(deepspeed={"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}},
        ...                        fsdp=None, world_size=1)
        >>> engine_plan(SimpleNamespace(args=args), Plan(), 8).offload
        'params'
    """
    sharding = trainer_sharding(trainer)
    return plan if sharding is None else ShardedTrainer(sharding, gpus).plan_for(plan)
