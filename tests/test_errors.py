"""Bad input and odd endings: one clear MemlabError that says what to write, and the model as it was.

Each test here failed before its fix (a raw TypeError or torch error, an "ok" trial for a NaN loss, a second
applied plan that could not be undone, finished trials lost on Ctrl-C).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest
import torch
from models import assert_same, fingerprint, lm_batch, mlp_batch, mlp_loss, tiny_llama, tiny_mlp

import memlab
from memlab.errors import MemlabError, UnsupportedTechnique
from memlab.techniques.checkpointing import is_checkpointing


def test_compare_without_plans_says_what_to_pass() -> None:
    with pytest.raises(MemlabError, match=r"no plans were given; write memlab.compare\(model, batch, \[memlab.Plan"):
        memlab.compare(tiny_mlp(), mlp_batch(), None, loss_fn=mlp_loss)


def test_measure_without_a_plan_measures_the_plain_plan_as_estimate_does() -> None:
    """measure(model, batch) on a model (a trainer has its own default) measured Plan() no more than estimate's
    default does: it raised compare's "no plans were given; write memlab.compare(...)"."""
    model = tiny_mlp()
    trial = memlab.measure(model, mlp_batch(), loss_fn=mlp_loss, steps=1, warmup=0)
    assert trial.status == "ok" and trial.plan == memlab.Plan()
    assert trial.breakdown == memlab.measure(model, mlp_batch(), memlab.Plan(), loss_fn=mlp_loss, steps=1,
                                             warmup=0).breakdown


def test_measure_given_a_list_points_to_compare_and_compare_takes_a_generator() -> None:
    model, batch = tiny_mlp(), mlp_batch()
    before = fingerprint(model)
    for plans in ([memlab.Plan()], [memlab.InferencePlan()], (p for p in [memlab.Plan()])):
        with pytest.raises(MemlabError, match="measure takes one plan; .*memlab.compare"):
            memlab.measure(model, batch, plans, loss_fn=mlp_loss)  # type: ignore[arg-type]
    assert_same(before, fingerprint(model))
    inputs = batch[0]  # inference runs model(inputs): the features alone
    report = memlab.compare(model, inputs, (plan for plan in [memlab.InferencePlan(), memlab.InferencePlan()]),
                            steps=1, noise=0, progress=False)
    assert [trial.status for trial in report.trials] == ["ok", "ok"]


def test_a_one_argument_loss_fn_is_refused_before_anything_runs() -> None:
    model = tiny_mlp()
    before = fingerprint(model)
    with pytest.raises(MemlabError, match=r"cannot be called as loss_fn\(model, batch\)"):
        memlab.measure(model, mlp_batch(), memlab.Plan(), loss_fn=lambda batch: batch[0].sum())
    assert_same(before, fingerprint(model))


def test_fp16_weights_with_fp16_precision_say_what_to_write() -> None:
    model = tiny_mlp().half()
    batch = tuple(t.half() for t in mlp_batch())
    trial = memlab.measure(model, batch, memlab.Plan(precision="fp16"), loss_fn=mlp_loss, steps=1, noise=0)
    assert trial.status == "error" and "load the model in fp32" in (trial.error or "")
    with pytest.raises(UnsupportedTechnique, match="precision='bf16'"):
        memlab.apply(model, memlab.Plan(precision="fp16"), loss_fn=mlp_loss)


def test_a_model_or_batch_on_the_meta_device_points_to_estimate() -> None:
    with torch.device("meta"):
        meta_model = tiny_mlp()
    with pytest.raises(MemlabError, match="meta device .* memlab.estimate"):
        memlab.measure(meta_model, mlp_batch(), memlab.Plan(), loss_fn=mlp_loss)
    meta_batch = tuple(t.to("meta") for t in mlp_batch())
    with pytest.raises(MemlabError, match="the batch is on the meta device"):
        memlab.measure(tiny_mlp(), meta_batch, memlab.Plan(), loss_fn=mlp_loss)


_SHAPES = {"input_ids": (1, 16), "labels": (1, 16)}
_GIVEN_A_CLASS: dict[str, Callable[[type], object]] = {  # every entry point that takes a model, given its class
    "measure": lambda cls: memlab.measure(cls, lm_batch(), memlab.Plan()),
    "compare": lambda cls: memlab.compare(cls, lm_batch(), [memlab.Plan()]),
    "fit": lambda cls: memlab.fit(cls, lm_batch(), budget="1GiB", batch_size=8),
    "apply": lambda cls: memlab.apply(cls, memlab.Plan()),
    "estimate": lambda cls: memlab.estimate(cls, _SHAPES, memlab.Plan(), device="cpu"),
    "limits": lambda cls: memlab.limits(cls, memlab.Plan(), budget="1GiB", batch=_SHAPES, device="cpu"),
    "panel": lambda cls: memlab.panel(cls, lm_batch()),
    "fit_inference": lambda cls: memlab.fit_inference(cls, lm_batch()),
}


@pytest.mark.parametrize("call", sorted(_GIVEN_A_CLASS))
def test_a_class_for_a_model_says_to_build_one_at_every_entry_point(call: str) -> None:
    """``memlab.measure(type(model), batch, plan)`` raised a raw ``TypeError: Module.parameters() missing 1 required
    positional argument`` (the meta-device check called ``parameters`` on the class); estimate, limits and panel said
    "not type" or "cannot estimate a type" without saying that a model is built from it."""
    model_class = type(tiny_llama())
    with pytest.raises(MemlabError, match=rf"memlab.{call} was given the class LlamaForCausalLM, not a model built "
                                          rf"from it; build one and pass it: model = LlamaForCausalLM\(config\)"):
        _GIVEN_A_CLASS[call](model_class)


def test_a_class_for_a_trainer_or_config_says_which_to_build() -> None:
    from transformers import LlamaConfig, Trainer

    with pytest.raises(MemlabError, match=r"memlab.watch takes a trainer, and was given the class LlamaForCausalLM; "
                                          r"build the trainer"):
        memlab.watch(type(tiny_llama()))
    with pytest.raises(MemlabError, match=r"memlab.measure was given the class Trainer, not a trainer built from it;"
                                          r" build one and pass it: trainer = Trainer\(model=model"):
        memlab.measure(Trainer)
    with pytest.raises(MemlabError, match=r"the class LlamaConfig, not a config built from it; .*config = "
                                          r"LlamaConfig\(...\)"):
        memlab.estimate(LlamaConfig, _SHAPES, memlab.Plan(), device="cpu")
    with pytest.raises(MemlabError, match=r"memlab.kv_cache_bytes was given the class LlamaConfig"):
        memlab.kv_cache_bytes(LlamaConfig, tokens=16)  # a raw TypeError before (get_text_config on the class)


def test_negative_shapes_in_estimate_are_refused() -> None:
    with pytest.raises(MemlabError, match="size below 1"):
        memlab.estimate(tiny_llama(), {"input_ids": (1, -8), "labels": (1, -8)}, device="cpu")


def test_estimate_given_a_list_of_training_plans_says_it_takes_one() -> None:
    """issue 71: a list of Plans was refused as "[Plan(...), ...] is not a memlab.Plan; write memlab.Plan(...)", which
    names no fix; the inference route's own words now hold for every route."""
    shapes = {"input_ids": (1, 8), "labels": (1, 8)}
    for model in (tiny_llama(), "llama-7b"):
        for plans in ([memlab.Plan(checkpointing=True)], (memlab.Plan(), memlab.Plan(precision="bf16"))):
            with pytest.raises(MemlabError, match=r"estimate takes one plan, and this is a list; .*estimate_plans"):
                memlab.estimate(model, shapes, plans, device="cpu")  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_non_finite_loss_is_an_error_never_ok(value: float) -> None:
    model = tiny_mlp()
    before = fingerprint(model)
    trial = memlab.measure(model, mlp_batch(), memlab.Plan(), loss_fn=lambda m, b: mlp_loss(m, b) * value,
                           steps=1, noise=0)
    assert trial.status == "error" and f"the loss is {value}" in (trial.error or "")
    assert_same(before, fingerprint(model))


def test_applying_twice_then_undoing_leaves_the_model_as_it_was() -> None:
    model = tiny_llama()
    before = fingerprint(model)
    first = memlab.apply(model, memlab.Plan(checkpointing=True))
    with pytest.warns(UserWarning, match="ckpt was still applied"):
        second = memlab.apply(model, memlab.Plan(checkpointing=True))
    assert not first.active and second.active
    second.undo()
    assert not is_checkpointing(model)
    assert_same(before, fingerprint(model))


@pytest.fixture
def warm_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if a trial had run on the CPU in this process already: no extra warm-up steps, so calls can be counted."""
    monkeypatch.setattr("memlab.runner.core._WARM_DEVICE_TYPES", {"cpu"})


def _interrupted_after(calls: int) -> Callable[[torch.nn.Module, object], torch.Tensor]:
    """mlp_loss, until Ctrl-C comes after ``calls`` calls (a plain plan takes 3 in a warm process with ``steps=1,
    noise=0``: warm-up, tracked, timed)."""
    count = {"n": 0}

    def loss(m: torch.nn.Module, b: object) -> torch.Tensor:
        count["n"] += 1
        if count["n"] > calls:
            raise KeyboardInterrupt
        return mlp_loss(m, b)

    return loss


def test_ctrl_c_during_compare_keeps_the_finished_trials(warm_process: None) -> None:
    model = tiny_mlp()
    before = fingerprint(model)
    plans = [memlab.Plan(), memlab.Plan(checkpointing=True), memlab.Plan(micro_batch=2, accumulation=4)]
    with pytest.raises(KeyboardInterrupt) as caught:
        memlab.compare(model, mlp_batch(), plans, loss_fn=_interrupted_after(4), steps=1, warmup=1, noise=0)
    report = caught.value.report  # type: ignore[attr-defined]
    assert [t.label for t in report] == ["plain"] and report[0].status == "ok"
    assert_same(before, fingerprint(model))


def test_an_interrupted_memfit_cell_raises_after_showing_what_it_measured_and_holds_no_memory(
    capsys, warm_process
) -> None:
    """Ctrl-C stops the notebook: under "Run All" the next cells must not run, so the cell ends in a
    KeyboardInterrupt, after the finished trials were shown; what IPython keeps of it holds no tensor of the cell."""
    import gc
    import weakref

    from IPython.testing import globalipapp

    from memlab.measure.held import cpu_tensors_held, unique_storage_bytes

    shell = globalipapp.get_ipython()
    shell.run_line_magic("load_ext", "memlab")
    net, pairs = tiny_mlp(), mlp_batch()
    shell.user_ns.update(net=net, pairs=pairs, calls=[], refs=[], weakref=weakref)
    line = "%%memfit net pairs --try checkpointing=off,on --steps 1 --noise 0 --quiet\n"
    body = (
        "calls.append(1)\n"
        "x, y = pairs\n"
        "out = net(x)\n"
        "refs.append(weakref.ref(out))\n"
        "if len(calls) > 4:\n"
        "    raise KeyboardInterrupt\n"
        "loss = (out.squeeze(-1) - y).pow(2).mean()"
    )
    warm = shell.run_cell(line + body.replace("> 4", "> 1000"))  # caches warm, as for the run after
    assert warm.success
    own = [*net.parameters(), *pairs]
    before = {id(t) for t in cpu_tensors_held(own)}
    shell.user_ns.update(calls=[], refs=[])
    capsys.readouterr()

    result = shell.run_cell(line + body)

    assert type(result.error_in_exec) is KeyboardInterrupt
    shown = capsys.readouterr()
    assert "Interrupted: 1 plan(s) were measured" in shown.out
    assert "plain" in shown.out and "ckpt" not in shown.out.split("Interrupted")[-1]  # the table of what finished
    assert [t.label for t in sys.last_value.report] == ["plain"]  # type: ignore[attr-defined]
    said = shown.out + shown.err
    assert "Traceback" not in said and "site-packages" not in said
    assert "KeyboardInterrupt: %%memfit stopped after 1 plan(s)" in said
    frames, tb = [], sys.last_traceback
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    # The cell's own frame reads the user's namespace (what other tests in this shell left there too): left out.
    held = [(f.f_code.co_name, k) for f in frames if f.f_globals is not shell.user_ns or f.f_code.co_name != "<module>"
            for k, v in f.f_locals.items() if isinstance(v, torch.Tensor)]
    assert not held
    gc.collect()
    refs = shell.user_ns["refs"]
    assert len(refs) > 4 and all(ref() is None for ref in refs), "the cell's activations are freed"
    after = [t for t in cpu_tensors_held(own) if id(t) not in before]
    assert unique_storage_bytes(after) == 0, [tuple(t.shape) for t in after]
    shell.user_ns.update(calls=[], refs=[])
    following = shell.run_cell(line + body.replace("> 4", "> 1000"))  # finds nothing the interrupted cell held
    assert following.success and following.result[0].breakdown == warm.result[0].breakdown
    for name in ("calls", "refs", "weakref"):
        shell.user_ns.pop(name)


def test_the_same_budget_rules_everywhere_a_budget_is_given() -> None:
    for call in (
        lambda: memlab.measure(tiny_mlp(), mlp_batch(), memlab.Plan(), loss_fn=mlp_loss, budget="1.5"),
        lambda: memlab.estimate(tiny_llama(), lm_batch(rows=1), budget="24", device="cpu"),
        lambda: memlab.panel(tiny_mlp(), mlp_batch(), loss_fn=mlp_loss, budget="24"),
    ):
        with pytest.raises(MemlabError, match="has no unit"):
            call()


# --- bounds and the CUDA paths, with fakes where the machine has no GPU ------------------------------------------


def test_no_cpu_trial_runs_unbounded() -> None:
    from memlab.measure.probes import CpuProbe
    from memlab.options import RunOptions
    from memlab.runner.trial import TrialRunner

    model = tiny_mlp()
    before = fingerprint(model)
    probe = CpuProbe(torch.device("cpu"))
    assert probe.machine_bound > 0
    probe.machine_bound = 64 * 1024  # as if the machine had almost nothing free
    runner = TrialRunner(model, mlp_batch(), RunOptions(loss_fn=mlp_loss, steps=1, noise=0), probe=probe)
    trial = runner.run(memlab.Plan(), capped=False)  # no budget, not capped: still bounded by the machine
    assert trial.status == "oom" and trial.budget is None
    assert_same(before, fingerprint(model))


class _FakeAllocatorPeak:
    """Stands in for CudaPeak: the allocator's numbers, set by the test."""

    def __init__(self, peak: int, context: int | None = None) -> None:
        self.peak_allocated = peak
        self.peak_reserved = peak
        self.start_allocated = 0
        self.context = context

    def __enter__(self) -> _FakeAllocatorPeak:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def _fake_cuda_probe(
    monkeypatch: pytest.MonkeyPatch, allocated: list[int], peak: int, context: int | None = None
) -> object:
    """A CudaProbe on the CPU whose allocator (and driver) answer what the test says (nothing here touches CUDA)."""
    import contextlib

    from memlab.measure import probes

    monkeypatch.setattr(probes, "synchronize", lambda device: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: allocated[0])
    probe = probes.CudaProbe(torch.device("cpu"))
    monkeypatch.setattr(probe, "cap", lambda budget: contextlib.nullcontext())
    monkeypatch.setattr(probe, "allocator_peak", lambda: _FakeAllocatorPeak(peak, context))
    return probe


def test_a_measured_cuda_trial_carries_the_context_and_is_judged_on_the_card(monkeypatch: pytest.MonkeyPatch) -> None:
    from memlab.options import RunOptions
    from memlab.runner.trial import TrialRunner

    model, batch = tiny_mlp(), mlp_batch()
    probe = _fake_cuda_probe(monkeypatch, [0], peak=10**7, context=5 * 10**6)
    for budget, fits in ((15 * 10**6, True), (14 * 10**6, False)):
        options = RunOptions(loss_fn=mlp_loss, steps=1, noise=0, budget=budget)
        trial = TrialRunner(model, batch, options, probe=probe).run(memlab.Plan())  # type: ignore[arg-type]
        assert trial.status == "ok" and trial.peak_bytes == trial.reserved_bytes == 10**7
        assert trial.context_bytes == 5 * 10**6 and trial.card_bytes == 15 * 10**6
        assert trial.fits is fits and trial.verdict_figure == "card"


def test_on_cuda_memory_held_before_is_read_once_so_torchs_workspaces_are_not_blamed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from memlab.options import RunOptions
    from memlab.runner.trial import TrialRunner

    model, batch = tiny_mlp(), mlp_batch()
    own = sum(t.numel() * t.element_size() for t in [*model.parameters(), *batch])
    allocated = [own + 1000]  # the user holds 1000 bytes of their own
    probe = _fake_cuda_probe(monkeypatch, allocated, peak=10**7)
    runner = TrialRunner(model, batch, RunOptions(loss_fn=mlp_loss, steps=1, noise=0), probe=probe)  # type: ignore[arg-type]
    with runner.session():
        first = runner.run(memlab.Plan())
        allocated[0] += 8 * 1024**2  # cuBLAS took a workspace during the first trial
        second = runner.run(memlab.Plan(checkpointing=True))
    assert first.preexisting_bytes == second.preexisting_bytes == 1000


def test_on_cuda_an_out_of_memory_in_the_first_step_keeps_the_peak_it_reached(monkeypatch: pytest.MonkeyPatch) -> None:
    from memlab.options import RunOptions
    from memlab.runner.trial import TrialRunner

    def out_of_memory(m: torch.nn.Module, b: object) -> torch.Tensor:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    probe = _fake_cuda_probe(monkeypatch, [0], peak=123_456_789)
    runner = TrialRunner(tiny_mlp(), mlp_batch(), RunOptions(loss_fn=out_of_memory), probe=probe)  # type: ignore[arg-type]
    trial = runner.run(memlab.Plan())
    assert trial.status == "oom" and trial.peak_bytes == 123_456_789


def test_the_default_cuda_budget_is_what_the_process_can_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    from memlab.live import device

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d: (30 * 1024**3, 80 * 1024**3))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d: 12 * 1024**3)  # the user's tensors and the cache
    assert device.cuda_capacity(torch.device("cuda", 0)) == 42 * 1024**3


@pytest.mark.parametrize(
    "plan",
    [
        memlab.Plan(),
        memlab.Plan(micro_batch=2, accumulation=4, checkpointing=True),
        memlab.Plan(precision="bf16"),
        memlab.Plan(optimizer="adamw8bit"),
        memlab.Plan(offload="all"),
    ],
    ids=lambda plan: plan.label(),
)
def test_an_lr_scheduler_drives_the_applied_optimizer(plan: memlab.Plan) -> None:
    model = tiny_mlp()
    with memlab.apply(model, plan, loss_fn=mlp_loss, lr=1e-3) as applied:
        scheduler = torch.optim.lr_scheduler.LambdaLR(applied.optimizer, lambda step: 0.5 ** step)
        applied.step(mlp_batch())
        scheduler.step()
        assert applied.optimizer.param_groups[0]["lr"] == pytest.approx(5e-4)
        applied.optimizer.param_groups[0]["lr"] = 1e-2  # set by hand, as people do
        before = [p.detach().clone() for p in model.parameters()]
        applied.step(mlp_batch())
        assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))


def test_the_offloaded_optimizer_follows_its_schedule_and_steps_like_adamw() -> None:
    from memlab.techniques.offload import OffloadedOptimizer

    torch.manual_seed(0)
    offloaded_model, plain_model = tiny_mlp(), tiny_mlp()
    offloaded = OffloadedOptimizer(list(offloaded_model.parameters()), lambda ps: torch.optim.AdamW(ps, lr=1e-3))
    plain = torch.optim.AdamW(plain_model.parameters(), lr=1e-3)
    assert isinstance(offloaded, torch.optim.Optimizer)
    schedules = [torch.optim.lr_scheduler.LambdaLR(o, lambda step: 1.0 / (step + 1)) for o in (offloaded, plain)]
    for _ in range(3):
        for model, optimizer in ((offloaded_model, offloaded), (plain_model, plain)):
            mlp_loss(model, mlp_batch()).backward()
            optimizer.step()
            optimizer.zero_grad()
        for schedule in schedules:
            schedule.step()
    assert offloaded.param_groups[0]["lr"] == pytest.approx(plain.param_groups[0]["lr"])
    for a, b in zip(offloaded_model.parameters(), plain_model.parameters(), strict=True):
        torch.testing.assert_close(a, b)


def test_estimate_takes_a_namedtuple_batch_as_measure_does() -> None:
    from collections import namedtuple

    Pair = namedtuple("Pair", ["inputs", "targets"])
    model, (inputs, targets) = tiny_mlp(), mlp_batch()
    batch = Pair(inputs, targets)
    measured = memlab.measure(model, batch, memlab.Plan(), loss_fn=mlp_loss, steps=1, noise=0)
    estimated = memlab.estimate(model, batch, memlab.Plan(), loss_fn=mlp_loss)
    assert measured.status == estimated.status == "ok", estimated.error
    step_alone = measured.peak_bytes - measured.preexisting_bytes  # the dry run cannot see this process's other tensors
    assert abs(estimated.peak_bytes - step_alone) <= 0.1 * step_alone


def test_an_estimate_from_a_config_is_for_a_gpu_even_without_one() -> None:
    from transformers import LlamaConfig

    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=2, vocab_size=128)
    trial = memlab.estimate(config, {"input_ids": (1, 16), "labels": (1, 16)})
    assert trial.device.startswith("cuda")
    assert memlab.estimate(tiny_mlp(), mlp_batch(), loss_fn=mlp_loss).device == "cpu"  # a live model: its device


def test_ctrl_c_during_fit_keeps_the_finished_trials(warm_process: None) -> None:
    model = tiny_mlp()
    before = fingerprint(model)
    with pytest.raises(KeyboardInterrupt) as caught:
        memlab.fit(model, mlp_batch(), budget="64MiB", loss_fn=_interrupted_after(4), steps=1, noise=0, progress=False,
                   space={"precision": ["fp32"], "optimizer": ["adamw"]})
    report = caught.value.report  # type: ignore[attr-defined]
    assert len(report) == 1 and report[0].status == "ok" and report.budget == 64 * 1024**2
    assert_same(before, fingerprint(model))


# --- a user's own inputs that reached a library's error (issue 44, item 7) -----------------------------------------


def test_a_trainer_over_untokenized_text_says_to_tokenize(tmp_path) -> None:
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    data = Dataset.from_dict({"text": ["a short line", "a somewhat longer line of text"] * 4})
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, save_strategy="no", max_steps=1,
                             per_device_train_batch_size=2)
    trainer = Trainer(model=tiny_llama(), args=args, train_dataset=data)
    before = fingerprint(trainer.model)
    for call in (lambda: memlab.measure(trainer, steps=1, noise=0, progress=False), lambda: memlab.estimate(trainer)):
        # transformers' own words were "No columns in the dataset match the model's forward method signature"
        with pytest.raises(MemlabError, match=r"only the column text, .*tokenize it first: dataset.map\(lambda e: "
                                              r"tokenizer\(e\['text'\].*SFTTrainer"):
            call()
    assert trainer.train_dataset is data and data.column_names == ["text"]
    assert_same(before, fingerprint(trainer.model))


def test_an_encoder_decoder_runs_inference_on_its_training_batch() -> None:
    from models import VOCAB, tiny_t5

    model = tiny_t5()
    before = fingerprint(model)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, VOCAB, (2, 12), generator=generator)
    labels = torch.randint(1, VOCAB, (2, 6), generator=generator)
    labels[:, -1] = -100  # padding in the target, as a collator writes it
    given = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    # transformers' own words were "You must specify exactly one of input_ids or inputs_embeds"
    trial = memlab.measure(model, given, memlab.InferencePlan(), steps=1, noise=0, progress=False)
    assert trial.status == "ok", trial.error
    assert any("decoder_input_ids made from the batch's labels" in note for note in trial.notes)
    # The decoder's tokens are the model's own (its training forward's shift of the labels): the same step as a
    # batch that names them.
    shifted = model.prepare_decoder_input_ids_from_labels(labels=labels)
    assert shifted[:, 0].eq(model.config.decoder_start_token_id).all() and shifted.min() >= 0
    explicit = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "decoder_input_ids": shifted}
    estimated = [memlab.estimate(model, batch, memlab.InferencePlan(), device="cpu") for batch in (given, explicit)]
    assert [t.status for t in estimated] == ["ok", "ok"]
    assert estimated[0].peak_bytes == estimated[1].peak_bytes > 0
    # Neither labels nor the decoder's inputs: one sentence that says what batch to give, for inference and training.
    for plan in (memlab.InferencePlan(), memlab.Plan()):
        with pytest.raises(MemlabError, match=r"encoder-decoder: .*add the target token ids to the batch as labels"):
            memlab.measure(model, {"input_ids": ids}, plan, steps=1, noise=0, progress=False)
        with pytest.raises(MemlabError, match=r"encoder-decoder: .*labels"):
            memlab.estimate(model, {"input_ids": ids}, plan, device="cpu")
    assert_same(before, fingerprint(model))
    # A bare T5 config is built with its language-model head, so its training batch trains and infers.
    shapes = {"input_ids": (2, 12), "labels": (2, 6)}
    for plan in (memlab.Plan(), memlab.InferencePlan()):
        assert memlab.estimate(model.config, shapes, plan, device="cpu").status == "ok"


@pytest.mark.parametrize(
    ("change", "words", "dry_run_sees_it"),
    [
        (lambda b: {**b, "input_ids": b["input_ids"].float()}, r"input_ids holds torch.float32 values, .*\.long\(\)",
         True),
        (lambda b: {k: v[0] for k, v in b.items()}, r"one sequence without its batch dimension; .*unsqueeze\(0\)",
         True),
        (lambda b: {**b, "labels": b["labels"][:, :5]}, r"labels has shape \(2, 5\) and input_ids \(2, 16\); .*"
                                                         r"input_ids.clone\(\)", True),
        # Values: a dry run's fake tensors have none.
        (lambda b: {**b, "input_ids": b["input_ids"] + 1000}, r"embeds 128 tokens .*resize_token_embeddings", False),
        (lambda b: {**b, "input_ids": b["labels"].masked_fill(b["labels"] < 50, -100)},
         r"input_ids holds -100, .*-100 marks positions without a loss in labels only", False),
    ],
    ids=["float ids", "one row", "labels shape", "past the vocabulary", "-100 in input_ids"],
)
def test_common_batch_slips_are_one_sentence_before_the_model_runs(change, words, dry_run_sees_it) -> None:
    model = tiny_llama()
    before = fingerprint(model)
    batch = change(lm_batch(rows=2))
    for plan in (memlab.Plan(), memlab.InferencePlan()):
        with pytest.raises(MemlabError, match=words):
            memlab.measure(model, batch, plan, steps=1, noise=0, progress=False)
    assert_same(before, fingerprint(model))
    if dry_run_sees_it:
        with pytest.raises(MemlabError, match=words):
            memlab.estimate(model, batch, memlab.Plan(), device="cpu")
