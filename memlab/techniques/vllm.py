"""A GRPOTrainer's colocated vLLM engine as two levers (issue 59): ``Plan(vllm_memory=...)``, its share of the card
(TRL's ``vllm_gpu_memory_utilization``), and ``Plan(vllm_sleep=...)`` (``vllm_enable_sleep_mode``).

Both keep the training the same: the engine only generates, so the policy's step is the same whatever its share, and
neither changes the step memlab runs. None (their default) means "as the trainer is set up"; a plan read from a
GRPOTrainer (:meth:`memlab.Plan.from_trainer`) carries the trainer's values. Only the GRPO estimate reads them
(:mod:`memlab.kinds.grpo.estimate`: the share on the card, resident or asleep while training) and ``fit`` searches
them there; a step of anything else that is asked to run them refuses (there is no engine to set), and so does
``memlab.apply`` on a trainer whose values differ (TRL builds the engine in ``GRPOTrainer.__init__``). The only
export that holds them is a ``GRPOConfig``'s keywords (:func:`grpo_config_keywords`); the others say where they go.

Example:
    >>> [lever.name for lever in DECLARATIONS]
    ['vllm_memory', 'vllm_sleep']
    >>> from memlab.plan import Plan
    >>> grpo_config_keywords(Plan(vllm_memory=0.2, vllm_sleep=True))["vllm_gpu_memory_utilization"]
    0.2
"""

from __future__ import annotations

import dataclasses
import textwrap
from dataclasses import dataclass
from typing import Any

from memlab.errors import MemlabError
from memlab.techniques.core.fragments import Accelerate, Code, Elsewhere, Export, Fragment, per_target_but_peft
from memlab.techniques.core.lever import SWITCH, Lever, PlanLike
from memlab.techniques.core.technique import StepParts, Technique, Undo

__all__ = ["DECLARATIONS", "FIELDS", "VLLM", "VLLMEngine", "VLLMServer", "VLLMSettings", "check_vllm_server",
           "grpo_config_keywords", "no_engine", "refuse_engine_change", "sets_vllm", "vllm_from_arguments",
           "without_vllm"]

FIELDS = ("vllm_memory", "vllm_sleep")
"""The Plan fields of the colocated engine's settings."""

KEYWORDS = {"vllm_memory": "vllm_gpu_memory_utilization", "vllm_sleep": "vllm_enable_sleep_mode"}
"""Each field's ``GRPOConfig`` keyword."""

GRPO_ONLY = ("vllm_memory / vllm_sleep set the colocated vLLM engine of a TRL GRPOTrainer with use_vllm=True "
             "(GRPOConfig's vllm_gpu_memory_utilization / vllm_enable_sleep_mode): export them with "
             "plan.to_training_arguments(trl=trl.GRPOConfig)")
"""Where the levers go, said by every export but a GRPOConfig's."""

NEEDS = "a TRL GRPOTrainer built with use_vllm=True and vllm_mode='colocate'"
"""The trainer whose engine the levers set (:attr:`memlab.techniques.core.lever.Lever.needs_trainer`)."""


def sets_vllm(plan: PlanLike) -> bool:
    """Whether ``plan`` sets the engine (either lever not None).

    Example:
        >>> from memlab.plan import Plan
        >>> sets_vllm(Plan()), sets_vllm(Plan(vllm_sleep=True))
        (False, True)
    """
    return any(getattr(plan, name) is not None for name in FIELDS)


def without_vllm(plan: Any) -> Any:
    """``plan`` with the engine's levers at None: the policy's training step, which they do not change.

    Example:
        >>> from memlab.plan import Plan
        >>> without_vllm(Plan(micro_batch=2, vllm_memory=0.2)) == Plan(micro_batch=2)
        True
    """
    return plan.replace(**dict.fromkeys(FIELDS)) if sets_vllm(plan) else plan


def grpo_config_keywords(plan: PlanLike) -> dict[str, Any]:
    """The ``GRPOConfig`` keywords of the levers ``plan`` sets (none where both are None): the engine colocated,
    its share, its sleep mode.

    Example:
        >>> from memlab.plan import Plan
        >>> grpo_config_keywords(Plan(vllm_sleep=False))
        {'use_vllm': True, 'vllm_mode': 'colocate', 'vllm_enable_sleep_mode': False}
        >>> grpo_config_keywords(Plan())
        {}
    """
    if not sets_vllm(plan):
        return {}
    keywords: dict[str, Any] = {"use_vllm": True, "vllm_mode": "colocate"}
    for name in FIELDS:
        if getattr(plan, name) is not None:
            keywords[KEYWORDS[name]] = getattr(plan, name)
    return keywords


def vllm_from_arguments(args: Any) -> dict[str, Any]:
    """The levers' values a config sets: a colocated engine's share and sleep mode (``use_vllm=True``,
    ``vllm_mode="colocate"``); none for any other config (no engine on this card).

    Example:
        >>> from types import SimpleNamespace
        >>> vllm_from_arguments(SimpleNamespace(use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.3,
        ...                                     vllm_enable_sleep_mode=False))
        {'vllm_memory': 0.3, 'vllm_sleep': False}
        >>> vllm_from_arguments(SimpleNamespace(use_vllm=False))
        {}
    """
    if not getattr(args, "use_vllm", False) or str(getattr(args, "vllm_mode", "colocate")) != "colocate":
        return {}
    return {"vllm_memory": float(getattr(args, "vllm_gpu_memory_utilization", 0.3)),
            "vllm_sleep": bool(getattr(args, "vllm_enable_sleep_mode", False))}


def no_engine(plan: PlanLike) -> str:
    """Why a step without a vLLM engine cannot run ``plan`` (``""`` where it sets none of the engine's levers).

    Example:
        >>> from memlab.plan import Plan
        >>> no_engine(Plan()), no_engine(Plan(vllm_sleep=True))[:36]
        ('', "plan 'vllm-sleep=True' sets a vLLM e")
    """
    if not sets_vllm(plan):
        return ""
    return (f"plan {plan.label()!r} sets a vLLM engine, and this step has none: {GRPO_ONLY}. Estimate {NEEDS} "
            "with it (memlab.estimate(trainer, plan, gpu=...)), or write the plan without vllm_memory / vllm_sleep")


@dataclass(frozen=True)
class VLLMServer:
    """The memory settings of the ``trl vllm-serve`` command a GRPOTrainer with ``vllm_mode="server"`` generates on:
    its options, by TRL's names, TRL's defaults where not given.

    Args:
        gpu (str | GpuKind | None): the server's GPU kind (a name from :data:`memlab.estimation.cuda.gpus.GPUS` or a
            :func:`memlab.gpu_kind`, which :func:`memlab.estimate` resolves); None: the kind the trainer is
            estimated for.
        tensor_parallel_size (int): the GPUs one engine spans (``--tensor-parallel-size``).
        data_parallel_size (int): the engines (``--data-parallel-size``), each on its own GPUs.
        gpu_memory_utilization (float): the fraction of each GPU's total memory vLLM preallocates.
        max_model_len (int | None): the longest sequence the server accepts; None: the model's
            ``max_position_embeddings``.

    Example:
        >>> try:
        ...     VLLMServer(gpu_memory_utilization=1.5)
        ... except MemlabError as error:
        ...     print(str(error)[:52])
        gpu_memory_utilization=1.5 is not a fraction of a GP
    """

    gpu: Any = None
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None

    def __post_init__(self) -> None:
        for name in ("tensor_parallel_size", "data_parallel_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise MemlabError(f"{name}={value!r} is not a number of GPUs; write a whole number >= 1, e.g. "
                                  f"VLLMServer({name}=1)")
        if not 0.0 < float(self.gpu_memory_utilization) <= 1.0:
            raise MemlabError(f"gpu_memory_utilization={self.gpu_memory_utilization} is not a fraction of a GPU; "
                              "write a value in (0, 1], e.g. VLLMServer(gpu_memory_utilization=0.9) "
                              "(trl vllm-serve's default)")
        if self.max_model_len is not None and (isinstance(self.max_model_len, bool)
                                               or not isinstance(self.max_model_len, int) or self.max_model_len < 1):
            raise MemlabError(f"max_model_len={self.max_model_len!r} is not a length in tokens; write a whole number "
                              ">= 1, or None for the model's own")

    @property
    def gpus(self) -> int:
        """The GPUs the server holds: ``tensor_parallel_size x data_parallel_size``."""
        return self.tensor_parallel_size * self.data_parallel_size

    def command(self, model_name: str) -> str:
        """The ``trl vllm-serve`` command these settings are (defaults left out).

        Example:
            >>> VLLMServer(tensor_parallel_size=2, max_model_len=4096).command("Qwen/Qwen2.5-7B")
            'trl vllm-serve --model Qwen/Qwen2.5-7B --tensor-parallel-size 2 --max-model-len 4096'
        """
        words = ["trl vllm-serve", "--model", model_name]
        for option, value, default in (("--tensor-parallel-size", self.tensor_parallel_size, 1),
                                       ("--data-parallel-size", self.data_parallel_size, 1),
                                       ("--gpu-memory-utilization", self.gpu_memory_utilization, 0.9),
                                       ("--max-model-len", self.max_model_len, None)):
            if value != default:
                words += [option, str(value)]
        return " ".join(words)


def check_vllm_server(model: Any, server: Any) -> None:
    """Refuse ``vllm_server=`` where ``model`` is not a GRPOTrainer that generates on a vLLM server.

    Example:
        >>> from types import SimpleNamespace
        >>> check_vllm_server(SimpleNamespace(args=SimpleNamespace(use_vllm=True, vllm_mode="server")), VLLMServer())
        >>> try:
        ...     check_vllm_server(SimpleNamespace(args=SimpleNamespace(use_vllm=False)), VLLMServer())
        ... except MemlabError as error:
        ...     print(str(error)[-76:])
        is not one (use_vllm=False); leave vllm_server out, or estimate that trainer
    """
    if server is None:
        return
    if not isinstance(server, VLLMServer):
        raise MemlabError(f"vllm_server={server!r} is not a VLLMServer; write vllm_server=memlab.VLLMServer("
                          "tensor_parallel_size=1, gpu_memory_utilization=0.9), the trl vllm-serve settings")
    args = getattr(model, "args", None)
    mode = str(getattr(args, "vllm_mode", "colocate")) if getattr(args, "use_vllm", False) else None
    if mode != "server":
        have = "use_vllm=False" if mode is None else f"vllm_mode={mode!r}"
        raise MemlabError("vllm_server= describes the vLLM server a GRPOTrainer built with GRPOConfig(use_vllm=True, "
                          f"vllm_mode='server') generates on, and this is not one ({have}); leave vllm_server out, or "
                          "estimate that trainer")


@dataclass(frozen=True)
class VLLMSettings:
    """The vLLM settings of a GRPOTrainer that generates with vLLM (its ``GRPOConfig``'s, as TRL reads them).

    Example:
        >>> from types import SimpleNamespace
        >>> VLLMSettings.of(SimpleNamespace(args=SimpleNamespace(use_vllm=False), use_vllm=False)) is None
        True
    """

    mode: str
    utilization: float
    sleep: bool
    tensor_parallel: int = 1

    @classmethod
    def of(cls, trainer: Any, *, gpus: int = 1) -> VLLMSettings | None:
        """The trainer's vLLM settings; None where it generates with transformers. ``gpus``: the processes it is
        estimated for (a colocated engine spans ``vllm_tensor_parallel_size`` of them).

        Raises:
            MemlabError: a mode other than ``"colocate"`` / ``"server"``, a utilization outside (0, 1], or a
                colocated engine over more GPUs than one (``vllm_tensor_parallel_size > 1``) where the ``gpus``
                processes are not whole groups of it (TRL refuses such a launch).
        """
        args = trainer.args
        if not getattr(trainer, "use_vllm", getattr(args, "use_vllm", False)):
            return None
        mode = str(getattr(args, "vllm_mode", "colocate"))
        utilization = float(getattr(args, "vllm_gpu_memory_utilization", 0.3))
        parallel = int(getattr(args, "vllm_tensor_parallel_size", 1) or 1)
        if mode not in ("colocate", "server"):
            raise MemlabError(f"vllm_mode={mode!r} is not one TRL runs; write GRPOConfig(vllm_mode='colocate') or "
                              "vllm_mode='server'")
        if mode == "colocate" and not 0.0 < utilization <= 1.0:
            raise MemlabError(f"vllm_gpu_memory_utilization={utilization} is not a fraction of the card; write a "
                              "value in (0, 1], e.g. GRPOConfig(vllm_gpu_memory_utilization=0.3)")
        if mode == "colocate" and parallel != 1 and gpus == 1:
            raise MemlabError(
                f"vllm_tensor_parallel_size={parallel} spreads the colocated engine over {parallel} processes, and "
                f"this is asked for one; say the GPUs the run is launched on: memlab.estimate(trainer, gpus={parallel}"
                ", strategy='zero3') (or its strategy), or estimate it with vllm_tensor_parallel_size=1"
            )
        if mode == "colocate" and gpus % parallel:
            raise MemlabError(
                f"vllm_tensor_parallel_size={parallel} does not divide the {gpus} training processes: TRL groups "
                f"the ranks {parallel} by {parallel} for the colocated engine and refuses a launch whose world size "
                f"is not a multiple of it; write GRPOConfig(vllm_tensor_parallel_size=...) dividing {gpus}, or "
                f"gpus={gpus + (-gpus) % parallel}"
            )
        return cls(mode, utilization, bool(getattr(args, "vllm_enable_sleep_mode", False)), parallel)

    @classmethod
    def for_plan(cls, trainer: Any, plan: Any, *, gpus: int = 1) -> VLLMSettings | None:
        """The trainer's settings with what ``plan`` sets of them (``Plan(vllm_memory=..., vllm_sleep=...)``; None
        fields, or no plan: the trainer's own).

        Raises:
            MemlabError: the plan sets them on a trainer without a colocated engine (nothing to set), or what
                :meth:`of` refuses.

        Example:
            >>> from types import SimpleNamespace
            >>> from memlab.plan import Plan
            >>> args = SimpleNamespace(use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.3)
            >>> settings = VLLMSettings.for_plan(SimpleNamespace(args=args), Plan(vllm_memory=0.2))
            >>> settings.utilization, settings.sleep
            (0.2, False)
        """
        own = cls.of(trainer, gpus=gpus)
        if plan is None or not sets_vllm(plan):
            return own
        if own is None or not own.colocated:
            have = "vllm_mode='server'" if own is not None else "use_vllm=False"
            raise MemlabError(f"plan {plan.label()!r} sets a vLLM engine's share or sleep mode, and this "
                              f"trainer's engine is not on its card ({have}): {GRPO_ONLY}, on a trainer built "
                              "with GRPOConfig(use_vllm=True, vllm_mode='colocate'); or write the plan without them")
        return dataclasses.replace(
            own, utilization=own.utilization if plan.vllm_memory is None else float(plan.vllm_memory),
            sleep=own.sleep if plan.vllm_sleep is None else bool(plan.vllm_sleep))

    def plan_fields(self) -> dict[str, Any]:
        """These settings as the Plan's levers (a served engine's are not this card's: none).

        Example:
            >>> VLLMSettings("colocate", 0.2, sleep=True).plan_fields()
            {'vllm_memory': 0.2, 'vllm_sleep': True}
        """
        return {"vllm_memory": self.utilization, "vllm_sleep": self.sleep} if self.colocated else {}

    @property
    def colocated(self) -> bool:
        """Whether the engine shares this card (``vllm_mode="colocate"``)."""
        return self.mode == "colocate"


def refuse_engine_change(trainer: Any, plan: PlanLike) -> None:
    """``memlab.apply(trainer, plan)``'s check: a plan whose vLLM settings differ from the trainer's is refused (its
    engine is not changed). TRL builds the colocated engine in ``GRPOTrainer.__init__``
    (``VLLMGeneration``: ``LLM(gpu_memory_utilization=..., enable_sleep_mode=...)``, the share preallocated then), so
    new arguments on a built trainer would not change it; the trainer must be built again with the keywords.

    Raises:
        MemlabError: the settings differ (naming the ``GRPOConfig`` keywords to build the trainer with), or the plan
            sets them on a trainer without a colocated engine.

    Example:
        >>> from types import SimpleNamespace
        >>> from memlab.plan import Plan
        >>> args = SimpleNamespace(use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.3)
        >>> refuse_engine_change(SimpleNamespace(args=args), Plan(vllm_memory=0.3))  # the trainer's own: nothing
    """
    wanted = VLLMSettings.for_plan(trainer, plan)
    if wanted is None or wanted == VLLMSettings.of(trainer):
        return
    keywords = ", ".join(f"{key}={value!r}" for key, value in grpo_config_keywords(plan).items())
    raise MemlabError(
        f"plan {plan.label()!r} changes this GRPOTrainer's colocated vLLM engine, which TRL builds in "
        "GRPOTrainer.__init__ (the share preallocated there), so memlab.apply cannot change it on a built trainer: "
        f"build the trainer again with GRPOConfig({keywords}, ...) (plan.to_training_arguments(trl=trl.GRPOConfig) "
        "writes them), then apply plan.replace(vllm_memory=None, vllm_sleep=None) to it if it changes anything else"
    )


class VLLMEngine(Technique):
    """The engine's levers in a step: nothing to put on (the GRPO estimate reads them before its training dry run,
    which runs without them); a step asked to run them has no engine, so it refuses.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from memlab.plan import Plan
        >>> VLLM.put_on(StepParts(nn.Linear(2, 2), Plan(vllm_sleep=True), torch.device("cpu")))
        Traceback (most recent call last):
        memlab.errors.MemlabError: plan 'vllm-sleep=True' sets a vLLM engine, and this step has none: ...
    """

    def put_on(self, parts: StepParts) -> Undo | None:
        refusal = no_engine(parts.plan)  # the runner's check said it before the model was touched; kept for any step
        if refusal:
            raise MemlabError(refusal)
        return None


VLLM = VLLMEngine()
"""The two levers' technique."""


def _conflicts(plan: PlanLike) -> str:
    memory = plan.vllm_memory
    if memory is not None and not 0.0 < memory <= 1.0:
        return (f"vllm_memory={memory} is not a fraction of the card; write a value in (0, 1], e.g. vllm_memory=0.3 "
                "(TRL's default), or None for the trainer's own")
    return ""


SAID_IN_CODE = tuple(f"# {line}" for line in textwrap.wrap(GRPO_ONLY, 100))
"""What a script export (the plain loop, accelerate's script) says of the levers: its comment lines."""


def _export(target: str, name: str) -> Export:
    def fragment(plan: PlanLike) -> Fragment:
        if getattr(plan, name) is None:
            return ""
        if target in ("code", "accelerate") and name == "vllm_sleep" and plan.vllm_memory is not None:
            return ""  # vllm_memory's lines say it for both
        if target == "code":  # a script has no engine of its own: it says where the settings go
            return Code(environment=SAID_IN_CODE)
        if target == "accelerate":
            return Accelerate(script=Code(environment=SAID_IN_CODE))
        return Elsewhere(GRPO_ONLY)  # a GRPOConfig's export adds grpo_config_keywords itself

    return fragment


def _exports(name: str) -> dict[str, Export]:
    return per_target_but_peft(lambda target: _export(target, name))


def _engine_lever(name: str, short: str, help: str, **facets: Any) -> Lever:
    """A setting of the colocated engine as a lever: None (the trainer's own) by default, read from a GRPOConfig,
    exported there, refused on a step without the engine and on a trainer already built."""
    return Lever(
        name, None, short=short, help=help, technique=VLLM,
        from_arguments=lambda args: vllm_from_arguments(args).get(name),
        exports=_exports(name),
        needs_trainer=NEEDS,
        refuses_step=lambda plan, loss_fn: no_engine(plan),
        refuses_change=refuse_engine_change,
        **facets,
    )


DECLARATIONS = (
    _engine_lever(
        "vllm_memory",
        "vllm{}",
        "a GRPOTrainer's colocated vLLM engine's share of the card (vllm_gpu_memory_utilization, a fraction of the "
        "GPU's total memory, held from the trainer's start): less leaves training more, down to what holds its "
        "weights and the generation batch's KV cache; the training the same (None: the trainer's own)",
        value_type="float",
        conflicts=_conflicts,
        none_means="the trainer's own share",
    ),
    _engine_lever(
        "vllm_sleep",
        "vllm-sleep={}",
        "a GRPOTrainer's colocated vLLM engine asleep while the policy trains (vllm_enable_sleep_mode: its share "
        "released after each generation); costs its weights pushed again before each generation; the training the "
        "same (None: the trainer's own)",
        choices=SWITCH,
        none_means="the trainer's own setting",
    ),
)
"""The levers' declarations (:data:`memlab.techniques.core.registry.REGISTRY` gathers them)."""
