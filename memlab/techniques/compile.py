"""``compile``: the model's forward (and so its backward, through AOTAutograd) run under ``torch.compile``.

The technique puts a compiled forward on the model as an instance attribute (``model.forward``) and takes it off
again, so the user's model object holds no compiled wrapper after a trial. Dynamo's caches are reset when it comes off
(``torch.compiler.reset()``): each compiled trial compiles afresh rather than reaching dynamo's recompile limit
(after which a forward silently runs eagerly) with the guards of earlier trials' settings; code the user compiled
in the same process compiles again on its next call.

Compilation happens in a trial's first warm-up step, which the runner reports as the trial's compile time, apart
from the timed steps. Memlab's memory tracker is a ``TorchDispatchMode``, under which dynamo runs code eagerly, and a
compiled step's kernels allocate without the dispatcher: the runner reads a compiled step's peak from the allocator
(CUDA's statistics, the CPU allocator's profile) instead (:mod:`memlab.measure.compiled`).

A dry run on fake tensors cannot run inductor's kernels (they need real memory), but AOTAutograd runs on fake
tensors: the dry run compiles the forward with :func:`fused_replay_backend`, inductor's decompositions, its
joint-graph passes and min-cut partitioner (what the compiled step saves for backward), each of the forward and
backward graphs then run
operator by operator, with the values inductor computes inside a fused kernel left uncounted: on the CPU those its own
lowering does not store (:func:`stored_by_inductor`, each fused computation's inputs kept until its kernel runs:
:func:`kernel_last_uses`), for a GPU those of a rule (:func:`inlined_nodes`: a pointwise operator's result that only
pointwise operators and reductions read), which its measured steps favour. What inductor's memory planning reuses
beyond that is not modelled; the estimate says so. Where dynamo cannot trace the step on fake tensors, the dry
run falls back to the eager step and says that.
The lever's declaration and exports are here too.

Example:
    >>> from torch import nn
    >>> from memlab.plan import Plan
    >>> model = nn.Linear(2, 1)
    >>> parts = StepParts(model, Plan(compile=True), torch.device("cpu"))
    >>> undo = COMPILE.put_on(parts)
    >>> "forward" in vars(model), parts.compiled
    (True, True)
    >>> undo(); "forward" in vars(model)
    False
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import operator
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

from memlab.errors import MemlabError
from memlab.techniques.core.fragments import Accelerate, Code, Elsewhere, Keys, nothing_for, per_target
from memlab.techniques.core.lever import Lever, PlanLike
from memlab.techniques.core.technique import StepParts, Technique, Undo

if TYPE_CHECKING:  # annotations only
    from memlab.techniques.core.fragments import Export, Fragment

__all__ = ["BACKEND", "COMPILE", "DECLARATIONS", "ESTIMATED_EAGER", "ESTIMATED_PARTITIONED", "FAKE_BACKEND", "Compile",
           "INLINED", "compile_conflicts", "compile_export", "fused_replay_backend", "inlined", "inlined_nodes",
           "kernel_last_uses", "stored_by_inductor"]

ESTIMATED_EAGER = (
    "compile: estimated as the eager step (dynamo could not trace this step on fake tensors: {why}); a compiled "
    "step's peak differs: measure it (memlab.measure) for the compiled figure"
)
"""The note of a compiled plan's estimate where the dry run could not compile (``{why}``: the first line of the
error)."""

ESTIMATED_PARTITIONED = (
    "compile: estimated with AOTAutograd's partition of the compiled step on fake tensors (what it saves for "
    "backward, inductor's decompositions, joint-graph passes and partitioner), pointwise results fused into the "
    "kernels that read them left uncounted; inductor's own reuse of buffers is not modelled: measure it "
    "(memlab.measure) for the compiled figure"
)
"""The note of a compiled plan's estimate where the dry run compiled."""


class _Inlined(threading.local):
    depth = 0
    """How many :func:`inlined` blocks are open in this thread."""


INLINED = _Inlined()
"""How many :func:`inlined` blocks are open in each thread; memlab's tracker reads it."""


@contextlib.contextmanager
def inlined() -> Iterator[None]:
    """While open (in this thread), the storages operators make are not counted by any tracker: values a compiler
    computes inside the kernel of their users, which never take memory of their own (the dry run of a compiled step,
    :func:`fused_replay_backend`). An operator that hands back a storage already counted is unaffected.

    Example:
        >>> from memlab.measure.tracker import MemoryTracker
        >>> tracker = MemoryTracker()
        >>> with tracker:
        ...     with inlined():
        ...         kept = torch.ones(256)
        ...     counted = kept * 2
        >>> tracker.peak_bytes
        1024
    """
    INLINED.depth += 1
    try:
        yield
    finally:
        INLINED.depth -= 1


_REDUCTIONS = frozenset({"sum", "mean", "amax", "amin", "max", "min", "prod", "var", "var_mean", "std", "any", "all",
                         "argmax", "argmin", "logsumexp"})
"""The reductions inductor folds a pointwise producer into (as a prologue of the reduction's kernel)."""


_REALIZE_READS = 4
"""Inductor's ``realize_reads_threshold``: a value read by more kernels than this is stored once, not recomputed."""

_HEAVY_ON_CPU = (frozenset({"exp", "log", "log10", "log1p", "log2", "sigmoid", "tanh"})
                 if tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 13)
                 else frozenset({"exp", "sigmoid"}))
"""The operators after which inductor's CPU code stores a value that more than one operator reads rather than
compute it again in each (``StorageBox.should_realize_on_reuse``'s list: torch 2.13's seven, GPT-2's tanh GELU among
them; torch 2.11's exp and sigmoid, and so taken for the releases before 2.13)."""


def inlined_nodes(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """The nodes of an AOTAutograd graph whose values inductor computes inside the kernels that read them and never
    allocates: pointwise operators (``torch.Tag.pointwise``) whose every user is a pointwise operator or a reduction,
    none of them the graph's output (a value saved for backward or returned is allocated) or a matrix product, a
    view or any other operator that reads memory. On the CPU, a value read by more than one operator whose fused
    computation holds an exponential, logarithm, sigmoid or tanh is stored (:data:`_HEAVY_ON_CPU`).

    Example:
        >>> def step(x, w):
        ...     return (x.sin() * 2).sum(), (x.cos() @ w)
        >>> graph = torch.fx.experimental.proxy_tensor.make_fx(step)(torch.ones(2, 2), torch.ones(2, 2)).graph
        >>> sorted(str(node.target) for node in inlined_nodes(graph))
        ['aten.mul.Tensor', 'aten.sin.default']
    """
    def pointwise(node: torch.fx.Node) -> bool:
        return (node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
                and torch.Tag.pointwise in node.target.tags)

    def reduction(node: torch.fx.Node) -> bool:
        return (node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
                and node.target.overloadpacket.__name__ in _REDUCTIONS)

    def on_cpu(node: torch.fx.Node) -> bool:
        value = node.meta.get("val")
        return isinstance(value, torch.Tensor) and value.device.type == "cpu"

    inlined: set[torch.fx.Node] = set()
    heavy: set[torch.fx.Node] = set()  # pointwise nodes whose fused computation holds a heavy operator
    for node in graph.nodes:  # in topological order: a node's inlined producers are decided before it
        if not pointwise(node):
            continue
        if (node.target.overloadpacket.__name__ in _HEAVY_ON_CPU  # type: ignore[union-attr]
                or any(producer in heavy for producer in node.all_input_nodes if producer in inlined)):
            heavy.add(node)
        if (0 < len(node.users) <= _REALIZE_READS and all(pointwise(user) or reduction(user) for user in node.users)
                and not (len(node.users) > 1 and node in heavy and on_cpu(node))):
            inlined.add(node)
    return inlined


def _is_view(node: torch.fx.Node) -> bool:
    """Whether ``node``'s operator returns a view of an argument (no storage of its own)."""
    return isinstance(node.target, torch._ops.OpOverload) and any(
        returned.alias_info is not None for returned in node.target._schema.returns)


def _viewed(node: torch.fx.Node) -> torch.fx.Node:
    """The node whose storage ``node`` views (``node`` itself where it is no view)."""
    while _is_view(node) and node.args and isinstance(node.args[0], torch.fx.Node):
        node = node.args[0]
    return node


def stored_by_inductor(graph_module: torch.fx.GraphModule, example_inputs: Sequence[Any], *,
                       backward: bool) -> set[torch.fx.Node] | None:
    """The nodes of an AOTAutograd graph whose values inductor stores in a buffer of their own, as its own lowering
    (``GraphLowering``, on the graph's fake inputs) decides, every other value computed inside the kernels that read
    it; no kernel is generated or compiled. None where the lowering fails. A buffer's value is its last node in the
    graph's order among those it was lowered from (a view's: the node it views; a copy made in the layout an extern
    kernel asks for: that kernel's). Several stored values one kernel computes are allocated together in inductor's
    code, each here at its own node: its scheduler's fusion is not modelled.

    Example:
        >>> from torch._subclasses.fake_tensor import FakeTensorMode
        >>> def step(x, w):
        ...     return ((x.sin() * 2) @ w).cos().sum()
        >>> with FakeTensorMode() as mode:
        ...     x, w = torch.ones(8, 8), torch.ones(8, 8)
        ...     graph = torch.fx.experimental.proxy_tensor.make_fx(step)(x, w)
        ...     sorted(node.name for node in stored_by_inductor(graph, [x, w], backward=False))
        ['mm', 'mul', 'sum_1']
    """
    from torch._guards import detect_fake_mode
    from torch._inductor.codecache import CacheBase
    from torch._inductor.graph import GraphLowering
    from torch._inductor.virtualized import V
    from torch.utils._python_dispatch import _disable_current_modes

    fake_mode = detect_fake_mode(example_inputs)
    try:
        # A matrix product's lowering keys inductor's autotuning cache by the machine, read once a process (cached):
        # the GPU's name where there is one. Read here with the dry run's modes off, so that no CUDA function is
        # called under a fake mode (DESIGN.md 2.4).
        with _disable_current_modes():
            CacheBase.get_system()
        # What the lowering makes is not the step's memory: no tracker counts it.
        with inlined(), (V.set_fake_mode(fake_mode) if fake_mode is not None else contextlib.nullcontext()):
            lowering = GraphLowering(graph_module, example_inputs=list(example_inputs), is_inference=False,
                                     is_backward=backward, shape_env=getattr(fake_mode, "shape_env", None))
            with V.set_graph_handler(lowering):
                lowering.run(*example_inputs)
    except Exception:  # noqa: BLE001  # any failure of inductor's lowering: the rule of inlined_nodes decides instead
        return None
    order = {node: index for index, node in enumerate(graph_module.graph.nodes)}
    stored: set[torch.fx.Node] = set()
    for buffer in lowering.buffers:
        origins = [node for node in buffer.origins if node in order]
        if origins:
            stored.add(_viewed(max(origins, key=order.__getitem__)))
    return stored


def kernel_last_uses(graph: torch.fx.Graph, fused: set[torch.fx.Node]) -> dict[torch.fx.Node, list[torch.fx.Node]]:
    """After which node each value is freed when the ``fused`` values are computed inside the kernels of the stored
    values that read them (``torch.fx.Interpreter``'s ``user_to_last_uses``): a value a fused computation reads lives
    until the last kernel that computes it has run, its output allocated beside it, as inductor's code frees it.

    Example:
        >>> def step(x):
        ...     h = x * 3
        ...     return (h.cos() * 2).sum()
        >>> graph = torch.fx.experimental.proxy_tensor.make_fx(step)(torch.ones(4)).graph
        >>> nodes = {node.name: node for node in graph.nodes}
        >>> freed = kernel_last_uses(graph, {nodes["cos"], nodes["mul_1"]})
        >>> sorted(node.name for node in freed[nodes["sum_1"]])  # h is read by the sum's kernel, not by the cos
        ['cos', 'mul', 'mul_1']
    """
    nodes = list(graph.nodes)
    in_kernel: set[torch.fx.Node] = set()
    for node in nodes:  # a fused value, or a view of one, is computed inside its readers' kernels
        if node in fused or (_is_view(node) and node.args and node.args[0] in in_kernel):
            in_kernel.add(node)
    kernel: dict[torch.fx.Node, int] = {}
    for index in range(len(nodes) - 1, -1, -1):
        node = nodes[index]
        kernel[node] = max(kernel[user] for user in node.users) if node in in_kernel and node.users else index
    last_uses: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for node in nodes:
        if node.users:
            last_uses.setdefault(nodes[max(kernel[user] for user in node.users)], []).append(node)
    return last_uses


def _replay(graph_module: torch.fx.GraphModule, example_inputs: Any, *, lowered: bool, backward: bool = False
            ) -> Callable[[list[Any]], Any]:
    """AOTAutograd's compiler of a dry run's forward and backward graphs: each run operator by operator, values freed
    as inductor's generated code frees them, the values its kernels compute inside them made uncounted.

    ``lowered`` (a step estimated for the CPU): inductor's own lowering decides what is stored
    (:func:`stored_by_inductor`), and what a fused computation reads lives until its kernel runs
    (:func:`kernel_last_uses`). Otherwise (a step estimated for a GPU, on fake tensors of either device), and where
    the lowering fails, the rule of :func:`inlined_nodes` decides, each value freed after its last reader: on the
    issue's H100 step that estimate is 1.03 of the allocated peak (reserved 1.05), the lowering's 0.98 (0.95)."""
    graph = graph_module.graph
    stored = stored_by_inductor(graph_module, example_inputs, backward=backward) if lowered else None
    if stored is None:
        fused, last_uses = inlined_nodes(graph), None
    else:
        fused = {node for node in graph.nodes if node.op == "call_function" and node not in stored
                 and node.target is not operator.getitem and not _is_view(node)
                 and isinstance(node.meta.get("val"), torch.Tensor)}
        last_uses = kernel_last_uses(graph, fused)

    class Replay(torch.fx.Interpreter):
        def __init__(self) -> None:
            super().__init__(graph_module)
            if last_uses is not None:
                self.user_to_last_uses = last_uses

        def run_node(self, node: torch.fx.Node) -> Any:
            if node in fused:
                with inlined():
                    return super().run_node(node)
            return super().run_node(node)

    def run(args: list[Any]) -> Any:
        return Replay().boxed_run(args)

    run._boxed_call = True  # type: ignore[attr-defined]  # AOTAutograd hands the arguments over as a list it owns
    return run


_TARGET_DEVICE: contextvars.ContextVar[str | None] = contextvars.ContextVar("memlab_compile_target", default=None)
"""The device type a dry run's compiled step is estimated for, while :class:`Compile`'s forward compiles it (a GPU
estimate made without one runs on CPU fake tensors); :func:`fused_replay_backend` reads it (None: its inputs')."""


def fused_replay_backend(graph_module: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Any:
    """The ``torch.compile`` backend of a dry run: AOTAutograd with inductor's decompositions and its own
    ``partition_fn`` (the joint-graph passes, then the min-cut partitioner: what the compiled step saves for
    backward), its graphs run by
    :func:`_replay` instead of as plain eager code, so that what inductor would fuse is not counted.

    Example:
        >>> compiled = torch.compile(lambda x: (x.sin() * 2).sum(), backend=fused_replay_backend)
        >>> float(compiled(torch.zeros(4)))
        0.0
    """
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch import config as functorch_config
    from torch._guards import detect_fake_mode
    from torch._inductor import compile_fx
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import partition_fn, select_decomp_table
    from torch._inductor.virtualized import V

    from memlab.live.patching import patched

    # Inductor's own partition_fn: its joint-graph passes (a one-hot scatter on zeros made pointwise, for one, which
    # is cross-entropy's backward: a vocabulary-wide fp32 tensor) before the min-cut partitioner. Shape padding is
    # left out: its check times real matrix products, which fake tensors cannot run.
    # The passes that fold random operators (dropout's) make their seeds in inductor's fake mode, as its backend does;
    # the partition_fn's CUDA device context would set the real GPU's current device where there is one.
    fake_mode = detect_fake_mode(example_inputs)
    with (functorch_config.patch(unlift_effect_tokens=True), inductor_config.patch(shape_padding=False),
          patched(compile_fx, get_cuda_device_context=lambda graph: contextlib.nullcontext()),
          V.set_fake_mode(fake_mode) if fake_mode is not None else contextlib.nullcontext()):
        target = _TARGET_DEVICE.get() or next(
            (value.device.type for value in example_inputs if isinstance(value, torch.Tensor)), "cpu")
        lowered = target == "cpu"
        return aot_autograd(
            fw_compiler=functools.partial(_replay, lowered=lowered),
            bw_compiler=functools.partial(_replay, lowered=lowered, backward=True),
            decompositions=select_decomp_table, partition_fn=partition_fn,
        )(graph_module, example_inputs)


FAKE_BACKEND: Any = fused_replay_backend
"""The backend of a dry run's compiled forward (:func:`fused_replay_backend`)."""

BACKEND = "inductor"
"""The ``torch.compile`` backend a compiled trial runs: PyTorch's default, as ``model.compile()`` and the Trainer's
``torch_compile=True`` use it (tests that only need a compiled step may set ``"aot_eager"``, which skips inductor's
code generation)."""


class Compile(Technique):
    """``compile=True``: ``torch.compile`` on the model's forward for the trial (on fake tensors, AOTAutograd's
    graphs run eagerly: :data:`FAKE_BACKEND`).

    Example:
        >>> from torch import nn
        >>> from memlab.plan import Plan
        >>> COMPILE.put_on(StepParts(nn.Linear(2, 1), Plan(), torch.device("cpu"))) is None
        True
    """

    def put_on(self, parts: StepParts) -> Undo | None:
        if not parts.plan.compile:
            return None
        model = parts.model
        own = vars(model).get("forward")
        eager = model.forward
        # A dry run compiles the fixed shapes it runs, as a user's first compiled call does: left to make the
        # sequence symbolic, dynamo traced the rotary cosines without their batch dimension under the CUDA
        # attention mode, and every rotary family's compiled step for a GPU was estimated as the eager one.
        compiled = torch.compile(eager, backend=FAKE_BACKEND if parts.fake else BACKEND,
                                 dynamic=False if parts.fake else None)
        fell_back: list[str] = []

        @functools.wraps(compiled)
        def forward(*args: Any, **kwargs: Any) -> Any:
            if fell_back:
                return eager(*args, **kwargs)
            # The step's own device type: a GPU estimate made without one compiles CPU fake tensors.
            target = _TARGET_DEVICE.set(parts.optimizer_device_type if parts.fake else None)
            try:
                return compiled(*args, **kwargs)
            except Exception as error:
                if parts.fake:  # the estimate of the eager step, said in the trial's notes
                    why = _why(error)
                    fell_back.append(why)
                    if ESTIMATED_PARTITIONED in parts.late_notes:
                        parts.late_notes.remove(ESTIMATED_PARTITIONED)
                    parts.late_notes.append(ESTIMATED_EAGER.format(why=why))
                    return eager(*args, **kwargs)
                if not isinstance(error, torch._dynamo.exc.TorchDynamoException):
                    raise  # the model's own error, as the eager step would raise it
                raise MemlabError(
                    f"torch.compile could not compile this model's step ({_why(error)}); write compile=False"
                ) from error
            finally:
                _TARGET_DEVICE.reset(target)

        model.forward = forward  # type: ignore[method-assign]
        parts.compiled = True

        def undo() -> None:
            if own is None:
                vars(model).pop("forward", None)
            else:
                model.forward = own  # type: ignore[method-assign]
            torch.compiler.reset()

        return undo

    def notes(self, parts: StepParts) -> list[str]:
        if not parts.compiled or parts.fake:
            return []
        return ["compile: the first warm-up step compiles (its time is the trial's compile_seconds, kept out of the "
                "speed); the peak is the allocator's, the compiled kernels' memory counted under other"]

    def dry_run(self, parts: StepParts) -> list[str]:
        return [ESTIMATED_PARTITIONED] if parts.plan.compile else []


COMPILE = Compile()


def _why(error: BaseException) -> str:
    """The first line of the error under dynamo's wrappers (``BackendCompilerFailed`` says only which backend
    raised), with its type."""
    while (inner := getattr(error, "inner_exception", None) or error.__cause__) is not None:
        error = inner
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:200]}" if lines else type(error).__name__


def compile_conflicts(plan: PlanLike) -> str:
    """Why ``plan`` cannot compile with its other settings (``""`` when it can).

    Example:
        >>> from types import SimpleNamespace
        >>> compile_conflicts(SimpleNamespace(compile=True, loss="chunked")).split(";")[1]
        " write loss='full' (compile fuses the cross-entropy) or compile=False"
    """
    if plan.compile and plan.loss == "chunked":
        return ("compile wraps the model forward, which the chunked loss does not call (it runs the model's body and "
                "head itself); write loss='full' (compile fuses the cross-entropy) or compile=False")
    return ""


def compile_export(target: str) -> Export:
    """What ``target`` writes for ``compile``: the Trainer's ``torch_compile=True``, ``model.compile()`` in the plain
    loop and the accelerate script's model, accelerate's ``dynamo_config``; DeepSpeed's config does not compile.

    Example:
        >>> from types import SimpleNamespace
        >>> compile_export("trainer")(SimpleNamespace(compile=True)).keys
        {'torch_compile': True}
    """

    def fragment(plan: PlanLike) -> Fragment:
        if not plan.compile:
            return nothing_for(target)
        if target == "trainer":
            return Keys({"torch_compile": True})
        if target == "code":
            return Code(model=("model.compile()  # torch.compile on the forward (and its backward): the first step "
                               "compiles",))
        if target == "accelerate":
            return Accelerate(config={"dynamo_config": {"dynamo_backend": "INDUCTOR"}})
        if target == "deepspeed":
            return Elsewhere("compile is not a DeepSpeed setting: with the Trainer pass plan.to_training_arguments() "
                             "(torch_compile), in your own loop call model.compile() as plan.to_code() does")
        return Elsewhere()  # peft: a LoraConfig describes the adapters only

    return fragment


DECLARATIONS = (
    Lever(
        "compile",
        False,
        short="compiled",
        help="torch.compile on the model's forward (and backward): fused kernels, often less activation memory and "
        "faster steps; the first step compiles (seconds to minutes, reported apart from the speed)",
        technique=COMPILE,
        conflicts=compile_conflicts,
        activation_key=lambda value: value,
        speed={True: (1.2, 1.0)},
        from_arguments=lambda args: bool(getattr(args, "torch_compile", False)),
        exports=per_target(compile_export),
    ),
)
"""The ``compile`` lever (:data:`memlab.techniques.core.registry.REGISTRY` gathers it)."""
