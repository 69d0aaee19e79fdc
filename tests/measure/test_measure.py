"""Issue 3: measure() and compare() on tiny real models on CPU."""

from __future__ import annotations

import gc
import itertools

import psutil
import pytest
import torch
from models import (
    VOCAB,
    assert_same,
    fingerprint,
    lm_batch,
    mlp_batch,
    mlp_loss,
    tiny_bert,
    tiny_gpt2,
    tiny_llama,
    tiny_mlp,
    tiny_t5,
)

import memlab
from memlab.events import MemorySample, StepFinished, TrialFinished, TrialStarted
from memlab.options import RunOptions
from memlab.runner.remeasure import ROUNDS
from memlab.runner.trial import TrialRunner


def parameter_count(model) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def test_params_are_four_bytes_each_and_the_breakdown_adds_up():
    model = tiny_gpt2()
    trial = memlab.measure(model, lm_batch(rows=4), memlab.Plan(), steps=1, noise=0)
    assert trial.status == "ok", trial.error
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    assert trial.breakdown["params"] == 4 * parameter_count(model) + buffers
    assert set(trial.breakdown) == {"params", "grads", "optimizer", "activations", "other"}
    assert abs(sum(trial.breakdown.values()) - trial.peak_bytes) <= 0.05 * trial.peak_bytes
    # Steady state: AdamW's two moments exist before the measured step.
    assert trial.breakdown["optimizer"] >= 2 * 4 * parameter_count(model)
    assert trial.step_time_s > 0 and trial.samples_per_s > 0 and trial.tokens_per_s > 0


def test_8bit_adam_optimizer_bytes_are_under_30_percent_of_adamw():
    model, batch = tiny_gpt2(width=128), lm_batch(rows=2)
    report = memlab.compare(model, batch, [memlab.Plan(), memlab.Plan(optimizer="adamw8bit")], progress=False, steps=1,
                            noise=0)
    adamw, adam8 = (t.breakdown["optimizer"] for t in report.trials)
    assert adam8 <= 0.30 * adamw, (adam8, adamw)


def test_checkpointing_halves_activations_on_an_8_layer_model():
    model, batch = tiny_llama(layers=8, width=32), lm_batch(rows=4, length=32)
    plain, checkpointed = memlab.compare(
        model, batch, [memlab.Plan(), memlab.Plan(checkpointing=True)], steps=1, noise=0, progress=False
    ).trials
    assert checkpointed.breakdown["activations"] <= 0.5 * plain.breakdown["activations"]
    assert checkpointed.peak_bytes < plain.peak_bytes


def test_accumulation_lowers_the_peak_at_the_same_effective_batch():
    model, batch = tiny_llama(width=64), lm_batch(rows=8, length=32)
    whole, split = memlab.compare(
        model, batch, [memlab.Plan(), memlab.Plan(micro_batch=2, accumulation=4)], steps=1, noise=0, progress=False
    ).trials
    assert whole.rows_per_step == split.rows_per_step == 8
    assert split.breakdown["activations"] < whole.breakdown["activations"]


@pytest.mark.parametrize(
    "build, batch, loss_fn",
    [
        (tiny_llama, lambda: lm_batch(rows=4), None),
        (tiny_t5, lambda: {**lm_batch(rows=4), "labels": torch.randint(0, VOCAB, (4, 8))}, None),
        (tiny_bert, lambda: {**lm_batch(rows=4), "labels": torch.randint(0, 3, (4,))}, None),
        (tiny_mlp, mlp_batch, mlp_loss),
    ],
    ids=["causal-lm", "t5", "bert-classifier", "plain-module"],
)
def test_measure_works_across_model_kinds(build, batch, loss_fn):
    model = build()
    before = fingerprint(model)
    trials = memlab.compare(
        model, batch(), [memlab.Plan(), memlab.Plan(micro_batch=2, accumulation=2, checkpointing=True)],
        loss_fn=loss_fn, progress=False, steps=1, noise=0,
    ).trials
    assert [t.status for t in trials] == ["ok", "ok"], [t.error for t in trials]
    assert all(t.peak_bytes > t.breakdown["params"] > 0 for t in trials)
    assert (trials[0].tokens_per_s is None) == (loss_fn is not None)
    assert_same(before, fingerprint(model))


def test_a_budget_too_small_is_an_oom_with_the_peak_reached():
    model, batch = tiny_gpt2(), lm_batch(rows=4)
    plain = memlab.measure(model, batch, memlab.Plan(), steps=1, noise=0)
    budget = int(plain.peak_bytes * 0.8)
    trial = memlab.measure(model, batch, memlab.Plan(), budget=budget, steps=1, noise=0)
    assert trial.status == "oom" and "out of memory" in trial.error
    assert trial.peak_bytes > budget
    assert not trial.fits
    assert memlab.measure(model, batch, memlab.Plan(), budget=plain.peak_bytes + 1, steps=1, noise=0).status == "ok"


def test_compare_leaves_model_hooks_grads_and_user_optimizer_bit_exact():
    model, batch = tiny_gpt2(), lm_batch(rows=4)
    user_optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(**batch).loss.backward()
    user_optimizer.step()
    model(**batch).loss.backward()  # leave .grad fields filled, as a user's half-done step would
    model.transformer.h[0].register_forward_hook(lambda *args: None)
    model.eval()
    state_before = {k: v.clone() for k, v in user_optimizer.state[model.lm_head.weight].items()}
    before = fingerprint(model)
    plain_peak = memlab.measure(model, batch, memlab.Plan(), steps=1, noise=0).peak_bytes

    def broken_loss(model, batch):
        raise ValueError("my loss is broken")

    report = memlab.compare(
        model, batch, [memlab.Plan(), memlab.Plan(checkpointing=True), memlab.Plan(precision="bf16")],
        budget=int(plain_peak * 1.02), progress=False, steps=1, noise=0,
    )
    statuses = {t.plan.label(): t.status for t in report.trials}
    assert statuses == {"plain": "ok", "ckpt": "ok", "bf16": statuses["bf16"]}
    oom = memlab.measure(model, batch, memlab.Plan(accumulation=1), budget=int(plain_peak * 0.5), steps=1, noise=0)
    error = memlab.measure(model, batch, memlab.Plan(), loss_fn=broken_loss, steps=1, noise=0)
    assert oom.status == "oom" and error.status == "error" and "my loss is broken" in error.error
    assert_same(before, fingerprint(model))
    for key, value in state_before.items():
        assert torch.equal(user_optimizer.state[model.lm_head.weight][key], value)


def test_keyboard_interrupt_restores_the_model_then_propagates():
    model, batch = tiny_gpt2(), lm_batch(rows=2)
    model.eval()
    before = fingerprint(model)
    calls = itertools.count()

    def interrupted(model, batch):
        if next(calls) == 2:
            raise KeyboardInterrupt
        return model(**batch).loss

    with pytest.raises(KeyboardInterrupt):
        memlab.compare(model, batch, [memlab.Plan(checkpointing=True)], loss_fn=interrupted, progress=False, steps=1,
                       noise=0)
    assert_same(before, fingerprint(model))


def _live_tensor_count() -> int:
    gc.collect()
    return sum(1 for obj in gc.get_objects() if isinstance(obj, torch.Tensor))


def test_thirty_ooms_in_a_row_leave_nothing_behind():
    model, batch = tiny_gpt2(), lm_batch(rows=4)
    peak = memlab.measure(model, batch, memlab.Plan(), steps=1, noise=0).peak_bytes
    plans = [memlab.Plan(micro_batch=4, accumulation=1 + i % 2) for i in range(30)]
    memlab.compare(model, batch, plans[:2], budget=peak // 2, steps=1, noise=0, progress=False)  # warm caches
    tensors_before = _live_tensor_count()
    rss_before = psutil.Process().memory_info().rss
    report = memlab.compare(model, batch, plans, budget=peak // 2, steps=1, noise=0, progress=False)
    assert [t.status for t in report.trials] == ["oom"] * 30
    assert _live_tensor_count() <= tensors_before
    assert psutil.Process().memory_info().rss < 1.05 * rss_before


def test_steps_are_timed_by_the_median_and_warmup_is_not_timed(monkeypatch):
    from memlab.runner import step as step_module

    now = {"t": 0.0}
    durations = iter([3.0, 1.0, 2.0])  # the three timed steps
    real_call = step_module.TrainingStep.__call__

    def call_with_fake_duration(self, batch, tracker=step_module.NO_PHASES):
        # On CPU the warm-up runs tracked (bounded by the machine's memory), like the tracked step: neither is
        # timed, so each moves the clock by a long 100 s that must not show in the step time.
        now["t"] += 100.0 if tracker is not step_module.NO_PHASES else next(durations)
        return real_call(self, batch, tracker)

    monkeypatch.setattr(step_module.TrainingStep, "__call__", call_with_fake_duration)
    model, batch = tiny_mlp(), mlp_batch(rows=8)
    runner = TrialRunner(
        model, batch, RunOptions(loss_fn=mlp_loss, steps=3, warmup=1, noise=0), clock=lambda: now["t"]
    )
    trial = runner.run(memlab.Plan())
    assert trial.step_time_s == 2.0
    assert trial.step_times == (3.0, 1.0, 2.0)  # every timed step, in order
    assert trial.samples_per_s == 8 / 2.0


def test_progress_events_arrive_in_order():
    events = []
    model, batch = tiny_mlp(), mlp_batch()
    memlab.compare(
        model, batch, [memlab.Plan(), memlab.Plan(checkpointing=True)], loss_fn=mlp_loss, steps=2, noise=0,
        callback=events.append, progress=False,
    )
    kinds = [type(e).__name__ for e in events if not isinstance(e, MemorySample)]
    assert kinds[0] == "TrialStarted" and kinds[-1] == "TrialFinished"
    per_trial = [e for e in events if isinstance(e, StepFinished) and e.index == 1]
    assert [e.kind for e in per_trial] == ["warmup", "tracked", "timed", "timed"]
    assert sum(isinstance(e, TrialStarted) for e in events) == sum(isinstance(e, TrialFinished) for e in events) == 2
    assert any(isinstance(e, MemorySample) for e in events)


def test_no_memory_is_left_behind_by_trials_that_succeed_or_fail():
    model, batch = tiny_gpt2(), lm_batch(rows=4)

    def broken_loss(model, batch):
        raise RuntimeError("broken on purpose")

    plans = [memlab.Plan(), memlab.Plan(optimizer="adamw8bit", precision="bf16")]
    memlab.compare(model, batch, plans, steps=1, noise=0, progress=False)  # bitsandbytes makes its globals on first use
    before = _live_tensor_count()
    memlab.compare(model, batch, plans, steps=1, noise=0, progress=False)
    memlab.measure(model, batch, memlab.Plan(), loss_fn=broken_loss, steps=1, noise=0)
    assert _live_tensor_count() <= before


# Regressions found in review: each of these once broke a guarantee.


def test_a_plan_without_checkpointing_runs_without_it_even_if_the_model_has_it_on():
    model, batch = tiny_llama(layers=4), lm_batch(rows=4, length=32)
    clean = memlab.measure(model, batch, memlab.Plan(), steps=1, noise=0)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    before = fingerprint(model)
    on_already = memlab.measure(model, batch, memlab.Plan(), steps=1, noise=0)
    assert on_already.breakdown["activations"] == clean.breakdown["activations"]
    assert_same(before, fingerprint(model))  # and it is on again afterwards
    assert model.is_gradient_checkpointing


def test_checkpointing_wraps_the_blocks_not_the_layers_inside_them():
    class Block(torch.nn.Module):
        def __init__(self, width):
            super().__init__()
            self.mlp = torch.nn.Sequential(
                torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width),
                torch.nn.Dropout(0.0),
            )

        def forward(self, x):
            return x + self.mlp(x)

    class Net(torch.nn.Module):
        def __init__(self, width=32):
            super().__init__()
            self.blocks = torch.nn.ModuleList([Block(width) for _ in range(3)])

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return x

    model = Net()
    plain, checkpointed = memlab.compare(
        model, torch.randn(64, 32), [memlab.Plan(), memlab.Plan(checkpointing=True)],
        loss_fn=lambda m, b: m(b).pow(2).mean(), steps=1, noise=0, progress=False,
    ).trials
    assert checkpointed.breakdown["activations"] < 0.6 * plain.breakdown["activations"]


def test_fp16_is_measured_in_a_steady_state_with_the_optimizer_state_there():
    model, batch = tiny_gpt2(), lm_batch(rows=4)
    trial = memlab.measure(model, batch, memlab.Plan(precision="fp16"), steps=1, noise=0)
    assert trial.status == "ok", trial.error
    assert trial.breakdown["optimizer"] >= 2 * 4 * parameter_count(model)


def test_a_tokenizer_style_mapping_batch_counts_like_a_dict():
    from transformers import BatchEncoding

    model, batch = tiny_gpt2(), lm_batch(rows=4, length=32)
    as_dict = memlab.measure(model, batch, memlab.Plan(), steps=1, noise=0)
    as_encoding = memlab.measure(model, BatchEncoding(batch), memlab.Plan(), steps=1, noise=0)
    assert as_encoding.status == "ok"
    batch_bytes = sum(t.numel() * t.element_size() for t in batch.values())
    assert as_encoding.breakdown["other"] >= batch_bytes
    assert abs(as_encoding.peak_bytes - as_dict.peak_bytes) <= 0.02 * as_dict.peak_bytes


def test_a_kept_keyboard_interrupt_holds_no_trial_memory():
    model, batch = tiny_gpt2(), lm_batch(rows=2)
    memlab.measure(model, batch, memlab.Plan(), steps=1, noise=0)
    before = _live_tensor_count()
    real_step = torch.optim.AdamW.step

    def interrupted_step(self, *args, **kwargs):
        if self.state:  # after the warm-up: the state exists and would be held by the frames
            raise KeyboardInterrupt
        return real_step(self, *args, **kwargs)

    torch.optim.AdamW.step = interrupted_step
    try:
        with pytest.raises(KeyboardInterrupt) as kept:
            memlab.measure(model, batch, memlab.Plan(), steps=1, noise=0)
    finally:
        torch.optim.AdamW.step = real_step
    assert kept.value is not None  # the notebook keeps the exception, as IPython does
    assert _live_tensor_count() <= before


def test_a_buffer_reassigned_in_forward_is_put_back():
    class Counting(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
            self.register_buffer("seen", torch.zeros(()))

        def forward(self, x):
            self.seen = self.seen + x.shape[0]  # a new tensor object each call
            return self.layers(x)

    model = Counting()
    before = fingerprint(model)
    memlab.measure(model, torch.randn(4, 8), memlab.Plan(), loss_fn=lambda m, b: m(b).mean(), steps=1, noise=0)
    assert_same(before, fingerprint(model))


def test_memory_the_user_already_holds_counts_under_other_and_is_named():
    model, batch = tiny_gpt2(), lm_batch(rows=4)
    alone = memlab.measure(model, batch, memlab.Plan(), steps=1, noise=0)
    user_optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(**batch).loss.backward()
    user_optimizer.step()  # its state: 8 bytes per parameter, held by the user
    held = memlab.measure(model, batch, memlab.Plan(), steps=1, noise=0)
    state_bytes = sum(t.numel() * t.element_size() for s in user_optimizer.state.values() for t in s.values())
    assert held.preexisting_bytes >= state_bytes
    assert held.breakdown["other"] - alone.breakdown["other"] >= state_bytes
    # named at the top of the table only where it changes a verdict: here, a budget it alone pushes the plan over
    assert "Held before the trials" in memlab.Report([held], budget=held.peak_bytes - 1).to_text().splitlines()[0]
    assert "Held before the trials" not in memlab.Report([held]).to_text()


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda m, b: memlab.measure(m, b, memlab.Plan(), lr=-1), "lr=-1"),
        (lambda m, b: memlab.compare(m, b, "precision=bf16"), "parse_grid"),
        (lambda m, b: memlab.measure(m, {k: v[:0] for k, v in b.items()}, memlab.Plan()), "no rows"),
        (lambda m, b: memlab.apply(m, {"precision": "bf16"}), "memlab.Plan"),
    ],
    ids=["negative-lr", "plans-as-text", "empty-batch", "apply-a-dict"],
)
def test_more_bad_input_gets_one_clear_error(call, message):
    model, batch = tiny_gpt2(), lm_batch(rows=2)
    before = fingerprint(model)
    with pytest.raises(memlab.MemlabError, match=message):
        call(model, batch)
    assert_same(before, fingerprint(model))


def test_a_namedtuple_batch_is_cut_into_micro_batches():
    from collections import namedtuple

    Pair = namedtuple("Pair", "inputs targets")
    model, (inputs, targets) = tiny_mlp(), mlp_batch(rows=8)
    trial = memlab.measure(
        model, Pair(inputs, targets), memlab.Plan(micro_batch=2, accumulation=4),
        loss_fn=lambda m, b: mlp_loss(m, (b.inputs, b.targets)), steps=1, noise=0,
    )
    assert trial.status == "ok", trial.error


def _fake_step_clock(monkeypatch, timed_durations, warmup_durations=()):
    """Make TrainingStep calls advance a fake clock: the first calls by ``warmup_durations`` (on a CPU warm-up steps
    are tracked too), then tracked steps by 100 s and untracked (timed) ones by ``timed_durations`` in turn."""
    from memlab.runner import step as step_module

    now = {"t": 0.0}
    warmups, timed = iter(warmup_durations), iter(timed_durations)
    real_call = step_module.TrainingStep.__call__

    def call(self, batch, tracker=step_module.NO_PHASES):
        warmup = next(warmups, None)
        if warmup is not None:
            now["t"] += warmup
        else:
            now["t"] += 100.0 if tracker is not step_module.NO_PHASES else next(timed)
        return real_call(self, batch, tracker)

    monkeypatch.setattr(step_module.TrainingStep, "__call__", call)
    return lambda: now["t"]


def test_timing_goes_on_until_the_noise_is_bounded(monkeypatch):
    from memlab.report.noise import relative_half_width

    monkeypatch.setattr("memlab.runner.core._WARM_DEVICE_TYPES", {"cpu"})
    # Noisy at first, then steady: the interval of the median narrows only after enough steps.
    durations = [1.0, 2.0, 1.5] + [1.0 + 0.01 * (i % 5) for i in range(60)]
    clock = _fake_step_clock(monkeypatch, durations)
    runner = TrialRunner(
        tiny_mlp(), mlp_batch(rows=8), RunOptions(loss_fn=mlp_loss, steps=3, noise=0.05, time_limit=1000), clock=clock
    )
    trial = runner.run(memlab.Plan())
    assert len(trial.step_times) > 3
    assert relative_half_width(trial.step_times) <= 0.05
    assert relative_half_width(trial.step_times[:-1]) > 0.05  # it stopped as soon as the target was met


def test_a_few_steps_that_happen_to_agree_do_not_meet_the_noise_target(monkeypatch):
    from memlab.report.noise import fewest_values

    monkeypatch.setattr("memlab.runner.core._WARM_DEVICE_TYPES", {"cpu"})
    # Three identical steps have a spread of 0, but three values are no 95% interval of anything.
    clock = _fake_step_clock(monkeypatch, [1.0] * 20)
    runner = TrialRunner(
        tiny_mlp(), mlp_batch(rows=8), RunOptions(loss_fn=mlp_loss, steps=3, noise=0.05, time_limit=1000), clock=clock
    )
    assert len(runner.run(memlab.Plan()).step_times) == fewest_values() == 6


def test_timing_stops_at_the_time_limit_however_noisy(monkeypatch):
    monkeypatch.setattr("memlab.runner.core._WARM_DEVICE_TYPES", {"cpu"})
    clock = _fake_step_clock(monkeypatch, [1.0, 3.0] * 50)
    options = RunOptions(loss_fn=mlp_loss, steps=3, noise=0.01, time_limit=10)
    trial = TrialRunner(tiny_mlp(), mlp_batch(rows=8), options, clock=clock).run(memlab.Plan())
    # 1+3+1+3+1+3 = 12 s: the step that passes 10 s is the last.
    assert trial.step_times == (1.0, 3.0, 1.0, 3.0, 1.0, 3.0)


def test_the_first_trial_of_a_cold_process_warms_up_until_steady(monkeypatch):
    events = []
    monkeypatch.setattr("memlab.runner.core._WARM_DEVICE_TYPES", set())
    clock = _fake_step_clock(monkeypatch, [1.0] * 10, warmup_durations=[9.0, 4.0, 1.1, 1.0])
    options = RunOptions(loss_fn=mlp_loss, steps=3, warmup=1, noise=0, callback=events.append)
    runner = TrialRunner(tiny_mlp(), mlp_batch(rows=8), options, clock=clock)
    with runner.session():
        first = runner.run(memlab.Plan(), 0)
        second = runner.run(memlab.Plan(), 1)
    warmups = [[e.seconds for e in events if isinstance(e, StepFinished) and e.kind == "warmup" and e.index == i]
               for i in (0, 1)]
    assert warmups[0] == pytest.approx([9.0, 4.0, 1.1, 1.0])  # until two warm-up steps agree within 20%
    assert warmups[1] == [100.0]  # the process is warm now: the requested warm-up only
    assert first.step_times == second.step_times == (1.0, 1.0, 1.0)


def _library_remark():
    """A function that lives in a module named like transformers' (as a library warning is raised from there)."""
    import types

    library = types.ModuleType("transformers.fake_remarks")
    exec(
        "import logging, warnings\n"
        "def remark():\n"
        "    warnings.warn('a library remark, once per plan')\n"
        "    logging.getLogger('transformers.fake_remarks').warning('a library log line')\n",
        library.__dict__,
    )
    return library.remark


@pytest.mark.parametrize("verbose", [False, True])
def test_third_party_warnings_are_quiet_unless_verbose(verbose):
    import logging
    import warnings

    remark = _library_remark()
    logged: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())  # type: ignore[method-assign]
    library_logger = logging.getLogger("transformers.fake_remarks")
    library_logger.addHandler(handler)

    def loss_with_remarks(model, batch):
        remark()
        warnings.warn("the user's own remark", stacklevel=1)
        return mlp_loss(model, batch)

    level_before = logging.getLogger("transformers").level
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trial = memlab.measure(tiny_mlp(), mlp_batch(), memlab.Plan(), loss_fn=loss_with_remarks, steps=1,
                                   noise=0, verbose=verbose)
    finally:
        library_logger.removeHandler(handler)
    assert trial.status == "ok"
    messages = {str(w.message) for w in caught}
    assert "the user's own remark" in messages
    assert ("a library remark, once per plan" in messages) is verbose
    assert ("a library log line" in logged) is verbose
    assert logging.getLogger("transformers").level == level_before  # the kernel's logging is as it was


def test_the_progress_bar_says_which_plan_of_how_many_and_the_time_left(capsys, monkeypatch):
    monkeypatch.setattr("memlab.runner.progress._on_a_terminal", lambda: True)  # pytest's stderr is no terminal
    memlab.compare(tiny_mlp(), mlp_batch(), [memlab.Plan(), memlab.Plan(accumulation=2)], loss_fn=mlp_loss,
                   steps=1, noise=0, progress=True)
    shown = capsys.readouterr().err
    # No number before a plan has finished (nothing bounds it yet), an upper bound from then on.
    assert "plan 1 of 2: plain, warm-up step 1, time left unknown" in shown
    assert "plan 2 of 2: accum2, starting, at most " in shown and " left" in shown


def test_compare_times_a_close_race_again_in_turn_and_noise_zero_does_not(monkeypatch):
    # Two runs of one plan are as close as a race gets: compare times both again, in turn (A B A B).
    monkeypatch.setattr("memlab.runner.core._WARM_DEVICE_TYPES", {"cpu"})
    clock = _fake_step_clock(monkeypatch, [1.0, 1.01, 0.99] * 200)
    real_init = TrialRunner.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **{**kwargs, "clock": clock})

    monkeypatch.setattr(TrialRunner, "__init__", init)
    model, batch = tiny_mlp(), mlp_batch(rows=8)
    events: list[object] = []
    options = {"loss_fn": mlp_loss, "steps": 6, "noise": 0.05, "time_limit": 1000, "progress": False}
    report = memlab.compare(model, batch, [memlab.Plan(), memlab.Plan()], callback=events.append, **options)
    finished = [e for e in events if isinstance(e, TrialFinished)]
    assert len(finished) == 2 + 2 * ROUNDS and len(report.trials) == 2
    assert all(t.step_runs == (6,) * (1 + ROUNDS) and "timed again in turn" in t.notes[-1] for t in report.trials)
    assert len(report.ties) == 1
    events.clear()
    memlab.compare(model, batch, [memlab.Plan(), memlab.Plan()], callback=events.append, **{**options, "noise": 0})
    assert sum(isinstance(e, TrialFinished) for e in events) == 2


def test_a_plan_timed_again_is_drawn_within_its_own_interval():
    """Issue 71 (seen in the demo's report): a plan timed again in turn took the median of all its steps pooled as
    its speed, while its interval spans the runs' medians without the slowest and the fastest. A first run of many
    slow steps then set the speed and was left out of the interval: the best plan's bar at 113 samples/s under its
    whisker of 147 to 159. The speed is the median of the runs' medians (one vote a run), within the interval."""
    from memlab.plan import Plan
    from memlab.report import Trial
    from memlab.report.noise import runs_speed_interval
    from memlab.runner.remeasure import remeasure_interleaved

    def trial(times: tuple[float, ...]) -> Trial:
        median = sorted(times)[len(times) // 2]
        return Trial(Plan(), "ok", 9, {}, median, 8 / median, None, "cpu", rows_per_step=8, step_times=times)

    first = trial((1.0,) * 6)  # measured first, on a busier machine, with more steps
    again = iter([trial((0.5, 0.5)), trial((0.52, 0.52)), trial((0.55, 0.55))])
    [pooled] = remeasure_interleaved([first], lambda _: next(again), rounds=3)
    low, high = runs_speed_interval(pooled.step_times, pooled.step_runs, pooled.rows_per_step) or (0.0, 0.0)
    assert pooled.samples_per_s is not None and low <= pooled.samples_per_s <= high, (pooled.samples_per_s, low, high)
    assert pooled.step_time_s == pytest.approx((0.52 + 0.55) / 2)


def test_memlab_measure_stays_the_function_when_its_package_is_imported_first():
    """``memlab.measure`` (the function) and ``memlab/measure/`` (the package) share a name; an import of the package
    before the first ``memlab.measure`` leaves the function in place (memlab/__init__.py's _Package: issue 87)."""
    import subprocess
    import sys

    code = ("import types, memlab.measure.tracker, memlab; from memlab.measure.probes import Probe; "
            "print(isinstance(memlab.measure, types.FunctionType), memlab.measure.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "memlab.runner.trial"]
