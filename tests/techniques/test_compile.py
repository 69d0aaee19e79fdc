"""The compile lever (memlab.techniques.compile): declared, exported, measured and estimated.

``Plan(compile=...)`` as a lever: its field, label, ``--try`` value, conflict and every export (issue 60).

``Plan(compile=True)`` measured live on the CPU (inductor, gcc here) and estimated (issue 60).

A compiled trial's first warm-up step compiles and is timed apart (``compile_seconds``), never in the speed; its peak is
the compiled step's, read from the CPU allocator's profile (memlab's tracker, a dispatch mode, would run it eagerly and
cannot see the compiled kernels' buffers); the model comes back as it was, with no compiled forward left on it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import memlab
from memlab import Plan
from memlab.errors import MemlabError
from memlab.measure.compiled import CpuAllocatorPeak
from memlab.measure.tracker import MemoryTracker
from memlab.plan import LEVERS, parse_grid
from memlab.techniques import compile as compile_technique
from memlab.techniques.compile import ESTIMATED_EAGER, ESTIMATED_PARTITIONED, inlined
from memlab.techniques.core.registry import REGISTRY, STEP_ORDER
from tests.models import assert_same, fingerprint, lm_batch, tiny_gpt2, tiny_llama, tiny_mixtral


def test_compile_is_a_bool_lever_labelled_and_tried() -> None:
    assert Plan().compile is False and LEVERS["compile"].type == "bool"
    assert Plan(compile=True).label() == "compiled"
    assert Plan(micro_batch=2, compile=True, precision="bf16").label() == "mb2x1 bf16 compiled"
    assert Plan(compile=True).describe() == "compile"
    assert [plan.compile for plan in parse_grid("compile=on,off")] == [True, False]
    assert STEP_ORDER[-1] == "compile"  # on the forward every other lever has changed
    with pytest.raises(MemlabError, match="compile='yes' is not allowed; write True or False"):
        Plan(compile="yes")


def test_compile_with_the_chunked_loss_is_refused_saying_what_to_write() -> None:
    with pytest.raises(MemlabError, match="write loss='full' .* or compile=False"):
        Plan(compile=True, loss="chunked")


def test_the_trainer_export_compiles_and_reads_back() -> None:
    from transformers import TrainingArguments

    kwargs = Plan(micro_batch=4, compile=True, precision="bf16").to_training_arguments()
    assert kwargs["torch_compile"] is True
    assert "torch_compile" not in Plan().to_training_arguments()
    args = TrainingArguments(output_dir="out", report_to=[], use_cpu=True, **kwargs)
    assert Plan.from_training_arguments(args) == Plan(micro_batch=4, compile=True, precision="bf16")


def test_the_code_export_compiles_the_model_after_the_other_model_lines() -> None:
    code = Plan(compile=True, checkpointing=True).to_code()
    assert "model.compile()" in code
    assert code.index("model.compile()") > code.index("gradient_checkpointing_enable")
    assert "compile()" not in Plan(checkpointing=True).to_code()


def test_the_accelerate_export_sets_its_dynamo_backend() -> None:
    for strategy in ("fsdp2", "zero2", "zero3"):
        config = Plan(compile=True).to_accelerate_config(gpus=2, strategy=strategy)
        assert config["dynamo_config"] == {"dynamo_backend": "INDUCTOR"}, strategy
        assert "dynamo_config" not in Plan().to_accelerate_config(gpus=2, strategy=strategy)


def test_deepspeed_says_where_compile_goes() -> None:
    config = Plan(compile=True).to_deepspeed()
    assert "torch_compile" in config.get("_comment", "")
    assert REGISTRY["compile"].refusal(Plan(compile=True), "deepspeed") == ""


def test_the_estimate_note_says_it_is_of_the_eager_step() -> None:
    assert "eager step" in ESTIMATED_EAGER


@pytest.fixture(scope="module")
def measured() -> tuple[memlab.Report, dict, dict, torch.nn.Module]:
    model = tiny_gpt2(layers=2, width=64)
    before = fingerprint(model)
    report = memlab.compare(model, lm_batch(rows=8, length=32), [Plan(), Plan(compile=True)], steps=2, noise=0)
    return report, before, fingerprint(model), model


@pytest.mark.slow  # the measured fixture compiles a GPT-2 with inductor: 33 s of a core
def test_the_compiled_step_is_measured_apart_from_its_compile_time(measured: tuple) -> None:
    report, _, _, _ = measured
    eager, compiled = report.trials
    assert (eager.status, compiled.status) == ("ok", "ok"), (eager.error, compiled.error)
    assert eager.compile_seconds is None
    assert compiled.compile_seconds is not None
    # The compile (seconds) is in no timed step (milliseconds), so not in the speed.
    assert max(compiled.step_times) * 20 < compiled.compile_seconds
    assert any("compile_seconds" in note for note in compiled.notes)
    assert compiled.to_dict()["compile_seconds"] == compiled.compile_seconds
    assert memlab.Trial.from_dict(compiled.to_dict()).compile_seconds == compiled.compile_seconds


@pytest.mark.slow  # the measured fixture compiles a GPT-2 with inductor: 33 s of a core
def test_the_peak_is_the_compiled_steps_not_the_eager_one(measured: tuple) -> None:
    report, _, _, _ = measured
    eager, compiled = report.trials
    # inductor frees GPT-2's intermediate activations the eager step keeps (fused kernels): about a fifth lower here.
    assert compiled.peak_bytes < 0.9 * eager.peak_bytes
    # What the tracker could not see (the compiled kernels' buffers) is read from the allocator, under "other".
    assert compiled.breakdown["other"] > eager.breakdown["other"]
    assert compiled.breakdown["params"] == eager.breakdown["params"]


@pytest.mark.slow  # the measured fixture compiles a GPT-2 with inductor: 33 s of a core
def test_the_model_comes_back_without_a_compiled_forward(measured: tuple) -> None:
    _, before, after, model = measured
    assert_same(before, after)
    assert "forward" not in vars(model)


def test_the_cpu_allocator_profile_agrees_with_the_tracker_on_an_eager_step() -> None:
    model = tiny_gpt2(layers=2, width=64)
    batch = {**lm_batch(rows=8, length=32)}
    batch["labels"] = batch["input_ids"]
    model(**batch).loss.backward()
    with MemoryTracker() as tracker, CpuAllocatorPeak(tracker.live_bytes) as peak:
        model(**batch).loss.backward()
    assert peak.peak_allocated == pytest.approx(tracker.peak_bytes, rel=0.01)


def test_a_plan_compile_cannot_run_is_an_error_trial_saying_why() -> None:
    import torch._inductor.config as inductor

    model = tiny_gpt2(layers=1, width=32)
    before = fingerprint(model)
    # inductor's own patch: on torch 2.11 a monkeypatched cpp.cxx was deleted, not restored, and every compile after
    # this test in the process failed with "torch._inductor.config.cpp.cxx does not exist"
    with inductor.patch({"force_disable_caches": True, "cpp.cxx": ("no-such-compiler",)}):
        trial = memlab.measure(model, lm_batch(rows=2, length=8), Plan(compile=True), steps=1, noise=0)
    assert trial.status == "error"
    assert "torch.compile could not compile this model's step" in trial.error and "compile=False" in trial.error
    assert_same(before, fingerprint(model))
    assert "forward" not in vars(model)


@pytest.mark.slow  # the measured fixture compiles a GPT-2 with inductor: 33 s of a core
def test_the_estimate_runs_the_compiled_steps_partition_on_fake_tensors(measured: tuple) -> None:
    report, _, _, model = measured
    batch = lm_batch(rows=8, length=32)
    eager = memlab.estimate(model, batch, Plan())
    compiled = memlab.estimate(model, batch, Plan(compile=True))
    assert ESTIMATED_PARTITIONED in compiled.notes and ESTIMATED_PARTITIONED not in eager.notes
    assert compiled.compile_seconds is None  # a dry run compiles nothing that runs
    # What the compiled step saves for backward is less than the eager step's activations, and inductor's fused
    # kernels hold no intermediates of their own: the estimate is within 5% of the compiled step measured (the memory
    # the process held before left out: it is no plan's), where AOTAutograd's partition run operator by operator was
    # 12.7% over it.
    measured_eager, measured_compiled = (trial.peak_bytes - trial.preexisting_bytes for trial in report.trials)
    assert eager.peak_bytes == pytest.approx(measured_eager, rel=0.01)
    assert compiled.peak_bytes == pytest.approx(measured_compiled, rel=0.05)
    assert compiled.peak_bytes < 0.95 * eager.peak_bytes


class _PointwiseChain(torch.nn.Module):
    """A weight, then four pointwise operators on a 1 MiB activation, then a reduction."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(512, 512))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ((x @ self.weight * 2).sin() * 3 + 1).exp().sum()


def test_the_intermediates_inductor_fuses_are_not_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    model, batch, mib = _PointwiseChain(), torch.ones(512, 512), 2**20
    plan = Plan(compile=True)

    def estimate() -> int:
        return memlab.estimate(model, batch, plan, loss_fn=lambda m, b: m(b)).peak_bytes

    fused = estimate()
    monkeypatch.setattr(compile_technique, "FAKE_BACKEND", "aot_eager_decomp_partition")
    one_by_one = estimate()
    # Run one by one, the chain's operators hold two 1 MiB values at once (an operator's input and its output); fused,
    # the matrix product's output and the kernel's own values alone are what the forward allocates.
    assert one_by_one - fused >= mib


def test_the_inlined_values_are_uncounted_and_their_frees_change_nothing() -> None:
    with MemoryTracker() as tracker:
        with inlined():
            fused = torch.ones(1024)
        stored = fused * 2
        del fused
        assert tracker.live_bytes == 4096
    assert tracker.peak_bytes == 4096 and stored.numel() == 1024


def test_a_compiled_cross_entropys_backward_holds_no_one_hot_target() -> None:
    # Inductor's joint-graph passes make cross-entropy's backward scatter of -1 onto zeros (a one-hot tensor as large as
    # the logits, in fp32) a pointwise select that its gradient's kernel computes: a compiled step's backward allocates
    # the logits' gradient alone. The dry run's partition once left the passes out and counted the one-hot tensor too
    # (the issue's H100 step: 12.81 GB estimated, 11.34 measured, its 151,936-token vocabulary's one-hot 1.24 GB).
    def backward_peak(loss_of: Callable[..., torch.Tensor]) -> int:
        logits = torch.randn(64, 4096, requires_grad=True)
        loss = loss_of(logits, torch.randint(0, 4096, (64,)))
        with MemoryTracker() as tracker:
            loss.backward()
        return tracker.peak_bytes

    torch.compiler.reset()
    logits_bytes = 64 * 4096 * 4
    compiled = torch.compile(torch.nn.functional.cross_entropy, backend=compile_technique.fused_replay_backend)
    try:
        assert backward_peak(compiled) <= logits_bytes + 1024
    finally:
        torch.compiler.reset()
    assert backward_peak(torch.nn.functional.cross_entropy) >= 2 * logits_bytes  # eager holds the one-hot too


class _TwoDropouts(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = torch.nn.Linear(64, 64), torch.nn.Linear(64, 1)
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.drop(self.first(self.drop(x)).relu())).sum()


def test_a_compiled_step_with_dropout_is_partitioned_not_estimated_eager() -> None:
    # Inductor's joint-graph passes fold the random operators' seeds in its fake mode (BERT's classifier in
    # benchmarks/compile_memory.py fell back to the eager estimate when the dry run's backend did not set it).
    estimated = memlab.estimate(_TwoDropouts(), torch.ones(32, 64), Plan(compile=True), loss_fn=lambda m, b: m(b))
    assert [note for note in estimated.notes if note.startswith("compile:")] == [ESTIMATED_PARTITIONED]


def test_a_value_read_twice_after_an_exp_is_stored_on_the_cpu_and_fused_elsewhere() -> None:
    # Inductor's CPU code stores a value more than one operator reads when its computation holds one of the operators
    # of its list (exp and sigmoid in every release CI runs; tanh, GPT-2's GELU, since 2.13) instead of computing it
    # in each reader; on a GPU it computes it in each.
    def step(x: torch.Tensor) -> torch.Tensor:
        y = x.exp() * 2
        return ((y + 1) * y.sin()).sum()

    def inlined_names(device: str) -> set[str]:
        graph = torch.fx.experimental.proxy_tensor.make_fx(step)(torch.ones(4, 4, device=device)).graph
        return {node.name for node in compile_technique.inlined_nodes(graph)}

    assert inlined_names("meta") == {"exp", "mul", "add", "sin", "mul_1"}
    assert inlined_names("cpu") == {"exp", "add", "sin", "mul_1"}  # the doubled exp, read by two, is stored


def test_inductors_lowering_stores_no_value_read_through_a_view_by_a_fused_kernel() -> None:
    # Qwen2's loss: its logits made fp32 and reshaped, then the log-softmax. Inductor computes the fp32 copy and the
    # log-probabilities inside the kernels that read them (its lowering follows the reshape); the rule of
    # inlined_nodes stops at the view and counted both (the compiled Qwen2 bf16 step estimated 1.05-1.09 here).
    from torch._inductor.compile_fx import select_decomp_table
    from torch._subclasses.fake_tensor import FakeTensorMode

    def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(logits.float().view(-1, 512), labels.view(-1))

    with FakeTensorMode():
        logits, labels = torch.ones(8, 32, 512, dtype=torch.bfloat16), torch.zeros(8, 32, dtype=torch.long)
        graph = torch.fx.experimental.proxy_tensor.make_fx(loss, select_decomp_table())(logits, labels)
        stored = compile_technique.stored_by_inductor(graph, [logits, labels], backward=False)
    assert stored is not None
    large = {node.name for node in graph.graph.nodes if node.op == "call_function"
             and isinstance(node.meta.get("val"), torch.Tensor) and node.meta["val"].numel() == 8 * 32 * 512}
    assert large and not large & {node.name for node in stored}
    assert large - {node.name for node in compile_technique.inlined_nodes(graph.graph)}  # the rule stored some


def test_a_fused_kernels_inputs_live_until_it_runs() -> None:
    # The backward's first kernel of a causal LM reads the logits' zero gradient and writes the logits' gradient: both
    # are held at once. Freed after its last fused reader, a value was gone before the kernel's output was allocated.
    def step(x: torch.Tensor) -> torch.Tensor:
        h = x * 3
        return (h.cos() * 2).sum() + x.sum()

    graph = torch.fx.experimental.proxy_tensor.make_fx(step)(torch.ones(4)).graph
    nodes = {node.name: node for node in graph.nodes}
    fused = {nodes["cos"], nodes["mul_1"]}
    freed_after = {value.name: user.name
                   for user, values in compile_technique.kernel_last_uses(graph, fused).items() for value in values}
    assert freed_after["mul"] == "sum_1"  # read by the cos, computed inside the sum's kernel
    assert freed_after["x_1"] == "sum_2"
    unfused = compile_technique.kernel_last_uses(graph, set())
    assert nodes["mul"] in unfused[nodes["cos"]]


def test_a_gpu_estimate_made_without_a_gpu_keeps_the_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    # Without a GPU, a CUDA estimate's dry run runs on CPU fake tensors: the step's target, not its tensors' device,
    # decides. Lowered for the CPU, the issue's H100 step was estimated at 0.98 of its allocated peak, 0.95 of its
    # reserved (the rule: 1.03 and 1.05).
    model, batch, plan = tiny_llama(layers=2, width=64), lm_batch(rows=2, length=16), Plan(precision="bf16",
                                                                                             compile=True)
    lowered: list[bool] = []
    lowering = compile_technique.stored_by_inductor

    def spied(*args: object, **kwargs: object) -> object:
        lowered.append(True)
        return lowering(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(compile_technique, "stored_by_inductor", spied)
    for_the_gpu = memlab.estimate(model, batch, plan, device="cuda")
    assert [note for note in for_the_gpu.notes if note.startswith("compile:")] == [ESTIMATED_PARTITIONED]
    assert not lowered
    memlab.estimate(model, batch, plan)
    assert lowered


def test_a_cpu_estimate_whose_lowering_fails_follows_the_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch._inductor.graph import GraphLowering

    model, batch = tiny_gpt2(layers=1, width=32), lm_batch(rows=2, length=16)
    lowered = memlab.estimate(model, batch, Plan(compile=True))

    def fails(self: object, *args: object) -> None:
        raise RuntimeError("no lowering for this")

    monkeypatch.setattr(GraphLowering, "run", fails)
    ruled = memlab.estimate(model, batch, Plan(compile=True))
    assert [note for note in ruled.notes if note.startswith("compile:")] == [ESTIMATED_PARTITIONED]
    assert ruled.peak_bytes != lowered.peak_bytes


# On the CPU it compiles and runs the step with inductor, 24 s of a core: slow; the CUDA estimate only partitions.
@pytest.mark.parametrize("device", [pytest.param("cpu", marks=pytest.mark.slow), "cuda"])
def test_a_compiled_step_with_checkpointing_is_partitioned_not_estimated_eager(device: str) -> None:
    # A compiled step with checkpointing fell back to the eager estimate: on the CPU, the recomputation's
    # run_and_save_rng_state had no rule for the dry run's fake mode (a subclass of FakeTensorMode, which a
    # higher-order operator's dispatch does not look through); for CUDA, the checkpoint's context_fn that carries the
    # emulation of CUDA's kernels into the recomputation gave no selective-checkpointing modes, which torch.compile
    # requires of a context_fn.
    from torch._inductor import compile_fx

    def touches_the_gpu(graph: torch.fx.GraphModule) -> None:
        raise AssertionError("the dry run set a real CUDA device")

    model, batch = tiny_llama(layers=2, width=64), lm_batch(rows=8, length=32)
    plan = Plan(checkpointing=True, compile=True)
    with pytest.MonkeyPatch.context() as patch:  # inductor's partition sets the current GPU where there is one
        patch.setattr(compile_fx, "get_cuda_device_context", touches_the_gpu)
        estimated = memlab.estimate(model, batch, plan, device=device)
    assert [note for note in estimated.notes if note.startswith("compile:")] == [ESTIMATED_PARTITIONED]
    if device == "cpu":
        measured = memlab.measure(model, batch, plan, steps=2, noise=0)
        assert measured.status == "ok", measured.error
        ratio = estimated.peak_bytes / (measured.peak_bytes - measured.preexisting_bytes)
        assert ratio == pytest.approx(1, abs=0.05)


class _ReadTwiceAfterTanh(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(1024))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = (x * self.weight).tanh() * 2
        return ((y + 1) * y.sin() * self.weight).sum()


def test_the_stored_values_are_the_installed_inductors() -> None:
    # A 4 MiB value read twice after a tanh: torch 2.13's inductor stores it on the CPU, 2.11's computes it in each
    # reader. The estimate follows the installed release's list either way (2.11 with 2.13's list: 1.99 times).
    model, batch, plan = _ReadTwiceAfterTanh(), torch.randn(1024, 1024), Plan(compile=True)
    estimated = memlab.estimate(model, batch, plan, loss_fn=lambda m, b: m(b))
    measured = memlab.measure(model, batch, plan, loss_fn=lambda m, b: m(b), steps=2, noise=0)
    assert measured.status == "ok", measured.error
    assert estimated.peak_bytes / (measured.peak_bytes - measured.preexisting_bytes) == pytest.approx(1, abs=0.05)


def test_an_estimate_dynamo_cannot_trace_is_of_the_eager_step_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuses(graph: torch.fx.GraphModule, inputs: list) -> None:
        raise RuntimeError("no fake kernels for this")

    monkeypatch.setattr(compile_technique, "FAKE_BACKEND", refuses)
    model = tiny_gpt2(layers=2, width=64)
    batch = lm_batch(rows=8, length=32)
    eager = memlab.estimate(model, batch, Plan())
    compiled = memlab.estimate(model, batch, Plan(compile=True))
    assert compiled.status == "ok" and compiled.peak_bytes == eager.peak_bytes
    said = [note for note in compiled.notes if note.startswith("compile:")]
    assert said == [ESTIMATED_EAGER.format(why=said[0].split("fake tensors: ")[1].split("); a compiled")[0])]
    assert "RuntimeError: no fake kernels for this" in said[0]


def _qwen2(width: int = 32, vocab: int = 128) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(hidden_size=width, intermediate_size=2 * width, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=1, vocab_size=vocab))


def _gpt2() -> torch.nn.Module:
    return tiny_gpt2(layers=2, width=64)


def _llama() -> torch.nn.Module:
    return tiny_llama(layers=2, width=64)


# Issue 69: the compiled estimate against inductor's compiled step measured on this CPU, per family of
# tests/models.py and precision (8 x 32 tokens). Those not yet within 5%, with their ratio (estimate / measured), per
# torch release CI runs (its inductor is what is measured). On 2.13 the rule of inlined_nodes gave GPT-2 0.957, 0.934
# and 0.870, Qwen2's bf16 steps 1.053 and 1.091: Qwen2's loss reads its fp32 logits through a reshape, which the rule
# stopped at, and a fused kernel's inputs were freed before its output was allocated (the backward's first kernel
# reads the logits' zero gradient and writes the logits' gradient, both 0.5 MiB here). Inductor's own lowering now
# decides what is stored on the CPU, and a fused computation's inputs live until its kernel runs. GPT-2's pure bf16
# step: its peak is a 230,528-byte scratch buffer that oneDNN's bf16 matrix product allocates inside the compiled
# backward (the allocator's profile sees it; no tensor holds it): CPU memory a GPU's matrix product does not take.
# On 2.11, Mixtral's bf16 step is 1.051 in a fresh process: its measured peak falls later in the backward (16 KB of
# gradients, 1.19 MB of activations, 0.55 MB that no tracked tensor holds) than the estimate's (49 KB of gradients,
# 1.84 MB of activations).
COMPILED_OFF = {
    "2.13": {("gpt2", "pure-bf16"): 0.944},  # the others 0.984 to 1.040
    "2.11": {("mixtral", "bf16"): 1.051},  # the others 0.974 to 1.033
}
FAMILIES = {"gpt2": _gpt2, "llama": _llama, "qwen2": lambda: _qwen2(width=64, vocab=512), "mixtral": tiny_mixtral}

# Each compiled step is estimated and measured in a process of its own. In one process, the measured peak of a
# compiled step depends on the ones compiled before it (on 2.11 up to 0.2 MB higher: Llama's bf16 step is 0.997 alone,
# 0.949 after the seven before it in this test's order), so a worker's order of tests would decide the ratio.
_COMPILED_RATIO = """
import json, sys
import memlab
from memlab import Plan
from tests.models import lm_batch
from tests.techniques.test_compile import ESTIMATED_PARTITIONED, FAMILIES
family, precision = sys.argv[1:3]
model, batch = FAMILIES[family](), lm_batch(rows=8, length=32)
plan = Plan(weights="bf16", compile=True) if precision == "pure-bf16" else Plan(precision=precision, compile=True)
estimated = memlab.estimate(model, batch, plan)
measured = memlab.measure(model, batch, plan, steps=2, noise=0)
print(json.dumps({"partitioned": ESTIMATED_PARTITIONED in estimated.notes, "measured_status": measured.status,
                  "error": measured.error, "estimated": estimated.peak_bytes,
                  "measured": measured.peak_bytes - measured.preexisting_bytes}))
"""


def _compiled_in_a_fresh_process(family: str, precision: str) -> dict[str, Any]:
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, "-c", _COMPILED_RATIO, family, precision], capture_output=True, text=True,
                          env=env, cwd=root, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("precision", ["fp32", "bf16", "pure-bf16"])
@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.slow
def test_the_compiled_estimate_against_the_compiled_step_measured_here(family: str, precision: str,
                                                                        request: pytest.FixtureRequest) -> None:
    off = COMPILED_OFF.get(".".join(torch.__version__.split(".")[:2]), {})
    if (family, precision) in off:
        ratio = off[family, precision]
        request.applymarker(pytest.mark.xfail(reason=f"not yet within 5% (ratio {ratio})", strict=True))
    step = _compiled_in_a_fresh_process(family, precision)
    assert step["partitioned"]
    assert step["measured_status"] == "ok", step["error"]
    ratio = step["estimated"] / step["measured"]
    assert abs(ratio - 1) <= 0.05, f"estimate / measured = {ratio:.3f}"


@pytest.mark.parametrize(("make", "precision"), [(tiny_llama, "bf16"), (_qwen2, "fp32"), (tiny_mixtral, "bf16")],
                         ids=["llama-bf16", "qwen2-fp32", "mixtral-bf16"])
@pytest.mark.slow
def test_a_compiled_step_estimated_for_a_gpu_without_one_is_partitioned(make, precision: str) -> None:
    # Issue 69: estimated for CUDA on the CPU, dynamo failed on every rotary family (with a symbolic sequence, under
    # the CUDA attention mode, the rotary cosines lost their batch dimension), so the compiled step was estimated as
    # the eager one. The dry run compiles the fixed shapes it runs.
    model, batch = make(), lm_batch(rows=2, length=16)
    eager = memlab.estimate(model, batch, Plan(precision=precision), device="cuda")
    compiled = memlab.estimate(model, batch, Plan(precision=precision, compile=True), device="cuda")
    assert [note for note in compiled.notes if note.startswith("compile:")] == [ESTIMATED_PARTITIONED]
    assert compiled.peak_bytes < eager.peak_bytes


_ISSUE_ESTIMATES = """
import json, sys
from benchmarks.gpu_sections_compile import estimates
print(json.dumps(estimates("full", sys.argv[1])))
"""


@pytest.mark.slow
def test_the_issues_compiled_step_estimated_here_is_within_5_percent_of_the_h100() -> None:
    # Issue 69's user loop (a Qwen2-0.5B shape, 2 x 1,024 tokens, bf16 autocast, fused AdamW) measured compiled and
    # eager on an H100 (2026-11-28), against the estimates this CPU makes for that GPU as the run's laptop side did:
    # in a process of its own, a plain one (no frozen collector, as the test session has). The compiled reserve was
    # 1.092 of the H100's there, and 1.033 in this session's process: a young collection freed a fake tensor held in
    # a reference cycle whenever the process's history made one run (memlab.runner.collection).
    root = Path(__file__).resolve().parents[2]
    result = root / "benchmarks" / "results" / "gpu_acceptance-cuda-nvidia-h100-80gb-hbm3-compile-levers.json"
    part = json.loads(result.read_text())["parts"]["compile"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, "-c", _ISSUE_ESTIMATES, part["estimated_for"]], capture_output=True,
                          text=True, env=env, cwd=root, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    made = json.loads(done.stdout.strip().splitlines()[-1])
    for variant in ("eager", "compiled"):
        measured = part["measured"][variant]
        assert made[variant]["status"] == "ok", made[variant]["error"]
        assert made[variant]["peak_bytes"] / measured["allocated_bytes"] == pytest.approx(1, abs=0.05), variant
        assert made[variant]["reserved_bytes"] / measured["reserved_bytes"] == pytest.approx(1, abs=0.05), variant
    assert made["compiled"]["note"] == ESTIMATED_PARTITIONED
