"""A trainer set up for several processes, read as the sharding memlab estimates per GPU: DeepSpeed ZeRO-2 or
ZeRO-3 (``deepspeed=`` a config dict or JSON file, or an accelerate config launching DeepSpeed), FSDP1 or FSDP2
(``fsdp=`` and ``fsdp_config``, or accelerate's FSDP plugin), with their CPU offload.

What the trainer's own accelerator says comes first (it merges the arguments with the accelerate config of
``accelerate launch``); its arguments where it says nothing. Both are turned into the accelerate config's own
keys and read by :func:`memlab.export.accelerate.sharding_from_accelerate`, the one place that maps an engine's
settings to memlab's ``strategy`` and ``offload``. A DeepSpeed config's bucket sizes and persistence threshold are
read as :class:`memlab.live.sharding.ZeroSettings` (its ``"auto"`` as transformers fills it from the model's hidden
size), which the ZeRO estimate sizes its buffers by; its batch keys are checked for the GPUs asked
(:func:`deepspeed_batch_refusal`) before anything runs, as transformers checks them when ``train()`` starts.

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
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memlab.errors import MemlabError
from memlab.live.sharding import ZeroSettings, check_accelerate, hidden_size_of


@dataclass(frozen=True)
class TrainerSharding:
    """How a trainer shards its training: memlab's ``strategy`` (``"zero2"``, ``"zero3"``, ``"fsdp1"``,
    ``"fsdp2"``) and ``offload`` (a :class:`~memlab.plan.Plan`'s), the processes it runs in now (``world_size``:
    1 in a notebook, ``accelerate launch``'s count in a launched script), how the trainer says it (for notes), the
    DeepSpeed settings memlab does not model (``unread``: each key and value) and those it does (``zero``: its bucket
    sizes and persistence threshold; None under FSDP)."""

    strategy: str
    offload: str
    world_size: int
    setting: str
    unread: tuple[str, ...] = ()
    zero: ZeroSettings | None = field(default=None, repr=False)


def trainer_sharding(trainer: Any) -> TrainerSharding | None:
    """The sharding ``trainer`` is set up for, or None for one process (see the module docstring).

    Raises:
        MemlabError: a DeepSpeed config that does not parse (or whose bucket sizes are no numbers of elements), a ZeRO
            stage or FSDP sharding memlab does not estimate, FSDP2 where the installed accelerate has none; each says
            what to write.

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
        unread = tuple(f"{name} {section[name]}" for name, default in _UNREAD.items()
                       if stage == 3 and name in section and _number(section[name]) != default)
        model_config = getattr(getattr(trainer, "model", None), "config", None)
        zero = ZeroSettings.from_config(section, hidden_size=hidden_size_of(model_config), stage=stage)
    else:
        fsdp = _fsdp_config(getattr(state, "fsdp_plugin", None), args)
        if fsdp is None:
            return None
        config = {"distributed_type": "FSDP", "fsdp_config": fsdp}
        setting = f"FSDP{fsdp['fsdp_version']} ({_said('fsdp', getattr(args, 'fsdp', None), state)})"
        unread, zero = (), None
        if getattr(state, "fsdp_plugin", None) is None:  # a launched trainer's accelerate built its plugin: it has it
            check_accelerate(f"FSDP{fsdp['fsdp_version']}".lower(), f"this trainer's {setting}")
    sharding = sharding_from_accelerate(config)
    return TrainerSharding(sharding["strategy"], sharding["offload"], world_size, setting, unread, zero)


# ZeRO-3 settings that change what a rank holds and that the estimate does not model, with DeepSpeed's defaults
# (deepspeed/runtime/zero/config.py): said in the note where a config sets them otherwise.
_UNREAD = {"stage3_model_persistence_threshold": float(sys.maxsize), "stage3_max_live_parameters": 1e9}


def _number(value: Any) -> float | None:
    """A DeepSpeed config's number (``5e8``, ``"5e8"``), or None for ``"auto"`` and the like."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


_BATCH_KEYS = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size")
"""The DeepSpeed config's batch keys transformers fills from the arguments, or checks against them."""


def deepspeed_batch_refusal(trainer: Any, gpus: int) -> str | None:
    """What transformers would refuse as ``train()`` starts on ``gpus`` processes, said up front: a DeepSpeed
    config's batch keys given as numbers (not ``"auto"``) that disagree with the trainer's arguments
    (``HfTrainerDeepSpeedConfig.trainer_config_process``, transformers 5: ``train_micro_batch_size_per_gpu`` is
    ``per_device_train_batch_size``, ``gradient_accumulation_steps`` is the arguments', ``train_batch_size`` is
    ``world_size x per_device_train_batch_size x gradient_accumulation_steps``; with ``auto_find_batch_size`` only
    the accumulation is held to them). Read from the ``deepspeed=`` argument as the user wrote it (transformers
    fills its ``"auto"`` for the processes the arguments were made in), or, without one, from a launched trainer's
    accelerator. None where nothing disagrees, or where the trainer has no DeepSpeed config to read.

    Example:
        >>> from types import SimpleNamespace
        >>> args = SimpleNamespace(deepspeed={"train_batch_size": 16, "zero_optimization": {"stage": 3}},
        ...                        per_device_train_batch_size=2, gradient_accumulation_steps=1, world_size=1)
        >>> deepspeed_batch_refusal(SimpleNamespace(args=args), 8) is None
        True
        >>> print(deepspeed_batch_refusal(SimpleNamespace(args=args), 4))  # doctest: +NORMALIZE_WHITESPACE
        this trainer's DeepSpeed config has train_batch_size 16, and on 4 GPUs its arguments make it 8 (4 GPUs x
        per_device_train_batch_size 2 x gradient_accumulation_steps 1): transformers refuses it as train() starts;
        write "auto" for train_batch_size in the DeepSpeed config (transformers then fills it for the launch), or
        train_batch_size: 8
    """
    args = trainer.args
    state = getattr(getattr(trainer, "accelerator", None), "state", None)
    argument = getattr(args, "deepspeed", None)
    running = int(getattr(args, "world_size", 1) or 1)
    config = _deepspeed_config(None, argument) if argument else (
        _deepspeed_config(getattr(state, "deepspeed_plugin", None), None) if running == gpus else None)
    if config is None or all(config.get(key, "auto") in ("auto", None) for key in _BATCH_KEYS):
        return None
    per_device, accumulation = int(args.per_device_train_batch_size), int(args.gradient_accumulation_steps)
    expected: dict[str, tuple[int, str]] = {
        "train_micro_batch_size_per_gpu": (per_device, "per_device_train_batch_size"),
        "gradient_accumulation_steps": (accumulation, "the arguments' own"),
        "train_batch_size": (gpus * per_device * accumulation,
                             f"{gpus} GPUs x per_device_train_batch_size {per_device} x gradient_accumulation_steps "
                             f"{accumulation}"),
    }
    if getattr(args, "auto_find_batch_size", False):
        expected = {"gradient_accumulation_steps": expected["gradient_accumulation_steps"]}
    wrong = [(key, config[key], *expected[key]) for key in _BATCH_KEYS
             if key in expected and config.get(key, "auto") not in ("auto", None)
             and _number(config[key]) != expected[key][0]]
    if not wrong:
        return None
    given = ", ".join(f"{key} {value}" for key, value, _, _ in wrong)
    them = "it" if len(wrong) == 1 else "them"
    made = f"{wrong[0][2]} ({wrong[0][3]})" if len(wrong) == 1 else "; ".join(
        f"{key} {number} ({words})" for key, _, number, words in wrong)
    return (f"this trainer's DeepSpeed config has {given}, and on {gpus} GPUs its arguments make {them} {made}: "
            f"transformers refuses {them} as train() starts; write \"auto\" for "
            f"{' and '.join(key for key, _, _, _ in wrong)} in the DeepSpeed config (transformers then fills {them} "
            "for the launch), or " + ", ".join(f"{key}: {number}" for key, _, number, _ in wrong))


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
            note += (f"; its {', '.join(self.sharding.unread)} not modelled: the estimate is of DeepSpeed's defaults "
                     "for them")
        return note


def sharded_trainer_request(request: Any) -> tuple[Any, ShardedTrainer | None]:
    """An estimate's request for a trainer (:class:`~memlab.estimation.request.EstimateRequest`) with the sharding
    the trainer is set up for (:func:`trainer_sharding`): ``gpus`` those given, else the processes it runs in, and
    its strategy; unchanged (and None) for a trainer of one process.

    Raises:
        MemlabError: a trainer set up for DeepSpeed or FSDP in one process with no ``gpus=``, a ``strategy=`` other
            than the one it is set up for, or a DeepSpeed config whose batch keys the GPUs and arguments disagree with
            (:func:`deepspeed_batch_refusal`); each says what to write.

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
    refusal = deepspeed_batch_refusal(request.model, gpus) if sharding.zero is not None else None
    if refusal:
        raise MemlabError(refusal)
    return (request.replace(gpus=gpus, strategy=sharding.strategy, zero=sharding.zero),
            ShardedTrainer(sharding, gpus))


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
