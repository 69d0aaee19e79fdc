"""%%memfit's options on a real InteractiveShell: run options, --apply, budgets and fit, dry runs and sharded dry runs,
the loss body, bad invocations and --try grids (the shell fixture is in test_magic.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from models import assert_same, fingerprint, lm_batch, mlp_batch, tiny_llama, tiny_mlp
from test_magic import FAST, MLP_LOSS, magic_shell, memfit

import memlab
from memlab.estimation.sharded.per_gpu import ShardedTrial
from memlab.frontends.jupyter.magic import MemfitMagics
from memlab.frontends.jupyter.magic import render as magic_render
from memlab.frontends.jupyter.magic import run as magic_run
from memlab.frontends.jupyter.magic.parse import body_loss_fn
from memlab.frontends.jupyter.magic.run import APPLIED_NAME
from memlab.options import RunOptions
from memlab.plan import parse_grid
from memlab.runner.apply import Applied


@pytest.fixture(scope="module")
def shell() -> Iterator[InteractiveShell]:
    yield from magic_shell()


def test_verbose_noise_and_time_limit_reach_the_run_options(
    shell: InteractiveShell, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[dict[str, Any]] = []

    def fake_compare(model: Any, batch: Any, plans: Any, **options: Any) -> memlab.Report:
        seen.append(options)
        return memlab.Report([])

    monkeypatch.setattr(magic_run, "compare", fake_compare)
    memfit(shell, "mlp pairs --steps 1 --quiet", MLP_LOSS)  # compare is stood in for: nothing runs
    memfit(shell, "mlp pairs --steps 1 --quiet --verbose --noise 0.02 --time-limit 30", MLP_LOSS)
    quiet, verbose = seen
    assert quiet["verbose"] is False and verbose["verbose"] is True  # quiet by default
    assert (quiet["noise"], quiet["time_limit"]) == (RunOptions().noise, RunOptions().time_limit)
    assert (verbose["noise"], verbose["time_limit"]) == (0.02, 30.0)


def test_apply_stores_memfit_applied(shell: InteractiveShell, capsys: pytest.CaptureFixture[str]) -> None:
    model = tiny_mlp(blocks=2, width=8)
    shell.user_ns["fresh"] = model
    before = fingerprint(model)
    body = MLP_LOSS.replace("mlp(", "fresh(")
    report = memfit(shell, f"fresh pairs --try micro_batch=4,2 checkpointing=on --apply {FAST}", body)
    applied = shell.user_ns[APPLIED_NAME]
    assert isinstance(applied, Applied) and applied.active
    assert report.best is not None and applied.plan == report.best.plan and applied.model is model
    assert f"{APPLIED_NAME}.undo()" in capsys.readouterr().out
    assert isinstance(applied.step(shell.user_ns["pairs"]), float)
    # Applying again takes the previous plan off first.
    memfit(shell, f"fresh pairs --try checkpointing=off --apply {FAST}", body)
    assert not applied.active and shell.user_ns[APPLIED_NAME] is not applied
    shell.user_ns[APPLIED_NAME].undo()
    after = fingerprint(model)
    for key in ("hooks", "patched", "checkpointing", "training", "requires_grad", "param_ids"):
        assert after[key] == before[key], key
    del shell.user_ns[APPLIED_NAME]


def test_budget_and_batch_size_search_through_fit(shell: InteractiveShell) -> None:
    before = fingerprint(shell.user_ns["model"])
    report = memfit(
        shell, f"model batch --budget 1GiB --batch-size 8 --search --try precision=fp32 optimizer=adamw {FAST}", "\n"
    )
    assert isinstance(report, memlab.Report) and report.budget == 1024**3
    assert report.best is not None and report.best.rows_per_step == 8
    for trial in report.trials:
        assert trial.plan.precision == "fp32" and trial.plan.optimizer == "adamw"
        assert 8 % (trial.plan.micro_batch or 4) == 0
    assert_same(before, fingerprint(shell.user_ns["model"]))


def test_apply_when_nothing_fits_applies_nothing(shell: InteractiveShell, capsys: pytest.CaptureFixture[str]) -> None:
    shell.user_ns.pop(APPLIED_NAME, None)
    before = fingerprint(shell.user_ns["mlp"])
    space = "--try precision=fp32 optimizer=adamw checkpointing=off"
    report = memfit(shell, f"mlp pairs --budget 1KiB {space} --apply {FAST}", MLP_LOSS)
    assert report.best is None
    assert APPLIED_NAME not in shell.user_ns
    assert "nothing was applied" in capsys.readouterr().out
    assert_same(before, fingerprint(shell.user_ns["mlp"]))


def test_dry_run(shell: InteractiveShell) -> None:
    report = memfit(shell, f"model batch --dry-run --try checkpointing=off,on {FAST}")
    assert len(report) == 2 and all(t.estimated for t in report.trials)


def test_a_dry_run_for_a_gpu_kind_from_a_cpu_kernel(shell: InteractiveShell) -> None:
    from memlab.estimation.cuda.gpus import gpu_kind

    shell.user_ns.update(llama=tiny_llama(layers=2, width=32), tokens=lm_batch(rows=2, length=16))
    before = fingerprint(shell.user_ns["llama"])
    kind = gpu_kind("RTX4090-24GB")
    report = memfit(shell, f"llama tokens --dry-run --gpu RTX4090-24GB --try checkpointing=off,on {FAST}")
    assert report.budget == kind.memory_bytes  # the card's memory judges it, as memlab estimate --gpu does
    for trial in report:
        api = memlab.estimate(shell.user_ns["llama"], shell.user_ns["tokens"], trial.plan, gpu="RTX4090-24GB")
        assert (trial.peak_bytes, trial.card_bytes) == (api.peak_bytes, api.card_bytes)
        assert trial.context_bytes == kind.context_bytes and trial.fits
    searched = memfit(shell, f"llama tokens --dry-run --gpu T4-16GB --budget 2GiB --search --try "
                             f"precision=fp32,fp16 {FAST}")
    assert searched.budget == 2 * 2**30 and searched.best is not None
    assert all(t.context_bytes == gpu_kind("T4-16GB").context_bytes for t in searched)
    assert_same(before, fingerprint(shell.user_ns["llama"]))


def test_an_inference_dry_run_for_a_gpu_kind(shell: InteractiveShell) -> None:
    from memlab.estimation.cuda.gpus import gpu_kind

    shell.user_ns.update(llama=tiny_llama(layers=2, width=32), tokens=lm_batch(rows=2, length=16))
    kind = gpu_kind("RTX4090-24GB")
    report = memfit(shell, "llama tokens --inference --dry-run --gpu RTX4090-24GB")
    assert report.budget == kind.memory_bytes and report.trials
    assert all(trial.context_bytes == kind.context_bytes and trial.card_bytes is not None for trial in report)


@pytest.mark.parametrize(("line", "said"), [
    ("llama tokens --inference --gpu RTX4090-24GB --budget 1GiB", "add --dry-run"),
    ("llama tokens --gpu RTX4090-24GB", "add --dry-run, e.g. %%memfit model batch --dry-run --gpu RTX4090-24GB"),
    ("llama tokens --dry-run --gpu RTX9999", "--gpu 'RTX9999' is not a GPU memlab knows; write one of H100-80GB"),
])
def test_a_gpu_kind_without_a_dry_run_or_unknown_is_one_usage_error(
        shell: InteractiveShell, line: str, said: str) -> None:
    shell.user_ns.update(llama=tiny_llama(layers=2, width=32), tokens=lm_batch(rows=2, length=16))
    before = fingerprint(shell.user_ns["llama"])
    with pytest.raises(UsageError) as raised:
        memfit(shell, line)
    assert said in str(raised.value) and "\n" not in str(raised.value)
    assert_same(before, fingerprint(shell.user_ns["llama"]))


def test_sharded_dry_run_gives_the_peak_per_gpu_of_every_strategy(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    shell.user_ns.update(llama=tiny_llama(layers=2, width=32), tokens=lm_batch(rows=2, length=16))
    before = fingerprint(shell.user_ns["llama"])
    # 3 GiB: ZeRO-3 holds DeepSpeed's whole reduce bucket (5e8 elements, 2 GB in fp32) beside this tiny model
    report = memfit(shell, f"llama tokens --dry-run --gpus 2 --budget 3GiB --try checkpointing=off,on {FAST}")
    printed = [line for line in capsys.readouterr().out.splitlines() if " x2: " in line]
    assert [(t.plan.checkpointing, t.strategy) for t in report] == [
        (ckpt, name) for ckpt in (False, True) for name in ("fsdp2", "zero2", "zero3")
    ]
    assert all(isinstance(t, ShardedTrial) and t.gpus == 2 and t.estimated and t.fits for t in report)
    assert len({t.label for t in report}) == 6 and report.budget == 3 * 1024**3
    assert len(printed) == 6 and all(line.endswith("fits") for line in printed)
    # The magic runs the core's own estimate: the same numbers as the Python API.
    api = memlab.estimate(shell.user_ns["llama"], shell.user_ns["tokens"], memlab.Plan(), gpus=2, strategy="zero3")
    assert report[2].peak_bytes == api.peak_bytes and report[2].breakdown == api.breakdown
    assert report[0].model_state_bytes < memlab.estimate(shell.user_ns["llama"], shell.user_ns["tokens"]).peak_bytes
    assert_same(before, fingerprint(shell.user_ns["llama"]))


def test_fsdp1_is_a_strategy_of_the_magic_as_of_the_python_api(shell: InteractiveShell) -> None:
    shell.user_ns.update(llama=tiny_llama(layers=2, width=32), tokens=lm_batch(rows=2, length=16))
    report = memfit(shell, f"llama tokens --dry-run --gpus 2 --strategy fsdp1 --budget 1GiB {FAST}")
    api = memlab.estimate(shell.user_ns["llama"], shell.user_ns["tokens"], memlab.Plan(), gpus=2, strategy="fsdp1")
    assert [t.strategy for t in report] == ["fsdp1"]
    assert report[0].peak_bytes == api.peak_bytes and report[0].breakdown == api.breakdown


def test_gpus_auto_finds_the_smallest_number_that_fits(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    shell.user_ns.update(llama=tiny_llama(layers=2, width=32), tokens=lm_batch(rows=2, length=16))
    llama, tokens = shell.user_ns["llama"], shell.user_ns["tokens"]
    one = memlab.estimate(llama, tokens, gpus=1, strategy="zero3")
    budget = one.peak_bytes - 1  # one GPU is a byte short
    capsys.readouterr()
    shown = FAST.replace(" --quiet", "")
    report = memfit(shell, f"llama tokens --dry-run --gpus auto --strategy zero3 --budget {budget}B {shown}")
    # Each dry run is said as it starts: a search over numbers of GPUs is not silent while it runs.
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("memlab: estimating")]
    assert said and said[0] == "memlab: estimating plain: the dry run that ZeRO's activations come from"
    quiet = memfit(shell, f"llama tokens --dry-run --gpus auto --strategy zero3 --budget {budget}B {FAST}")
    assert quiet[0].gpus == report[0].gpus
    assert not [line for line in capsys.readouterr().out.splitlines() if line.startswith("memlab: ")]
    (found,) = report.trials
    assert isinstance(found, ShardedTrial) and found.strategy == "zero3" and found.fits and found.gpus >= 2
    fewer = memlab.estimate(llama, tokens, gpus=found.gpus // 2, strategy="zero3", budget=budget)
    assert not fewer.fits


def _ones(module: torch.nn.Module) -> None:
    if isinstance(module, torch.nn.Linear):
        torch.nn.init.ones_(module.weight)


identity = torch.nn.Identity()


def test_body_loss_fn_alone() -> None:
    loss_fn = body_loss_fn("y = m(b)\nloss = y.sum()", {}, "m", "b")
    assert loss_fn is not None
    assert float(loss_fn(torch.nn.Linear(2, 2, bias=False).requires_grad_(False).apply(_ones), torch.ones(2))) == 4.0
    double = body_loss_fn("m(b).sum() * k", {"k": 2.0}, "m", "b")
    walrus = body_loss_fn("(loss := m(b).sum())", {}, "m", "b")
    assert double is not None and walrus is not None
    assert float(double(identity, torch.ones(2))) == 4.0
    assert float(walrus(identity, torch.ones(3))) == 3.0
    assert body_loss_fn("", {}) is None
    assert body_loss_fn("   \n\n", {}) is None
    # A stale loss in the notebook is never read back as this body's loss.
    fn = body_loss_fn("if False:\n    loss = 1", {"loss": torch.tensor(5.0)})
    assert fn is not None
    with pytest.raises(memlab.MemlabError, match="did not set loss"):
        fn(identity, torch.ones(1))


# --- what must be refused -------------------------------------------------------------------------------------

BAD = [
    ("unknown-model", "modl batch", "", "'modl' is not defined"),
    ("unknown-batch", "model batsh", "", "'batsh' is not defined"),
    ("unknown-attribute", "trainer.modle batch", "", "has no attribute 'modle'"),
    ("expression-name", "model[0] batch", "", "not a variable name"),
    ("not-a-module", "number batch", "", "not a torch nn.Module"),
    ("not-a-batch", "model words", "", "BATCH 'words'"),
    ("frozen-model", "frozen batch", "", "no trainable parameters"),
    ("unknown-option", "model batch --fast", "", "%%memfit has no option --fast; write one of --try, --budget"),
    ("near-option", "model batch --bugdet 8GiB", "", "%%memfit has no option --bugdet; write --budget"),
    ("option-without-value", "model batch --budget", "", "--budget needs a value after it; write for example --budget"),
    ("max-trials-without-search", "model batch --max-trials 5", "", "--max-trials limits a search"),
    ("max-trials-zero", "model batch --budget 8GiB --max-trials 0", "", "--max-trials 0 is not allowed"),
    ("max-trials-inference", "model batch --inference --budget 8GiB --max-trials 5", "", "--max-trials does not go"),
    ("missing-batch", "model", "", "BATCH is missing; write the name of your batch after the model's"),
    ("unclosed-quote", 'model batch --budget "8GiB', "", "a quote on the line is not closed; close it"),
    ("bad-budget", "model batch --budget lots", "", "budget 'lots' is not understood"),
    ("zero-budget", "model batch --budget 0GiB", "", "not positive"),
    ("budget-without-unit", "model batch --budget 24", "", "budget '24' has no unit"),
    ("unknown-value", "model batch --try precision=fp8", "", "precision='fp8' is not known"),
    ("unknown-key", "model batch --try colour=red,blue", "", "'colour' is not a plan setting"),
    ("unknown-attention", "model batch --try attention=flash", "", "attention='flash' is not known; write one of"),
    ("not-key-value", "model batch --try precision", "", "is not KEY=V1,V2"),
    ("key-twice", "model batch --try precision=fp32 precision=bf16", "", "given twice"),
    ("try-without-values", "model batch --try", "", "--try needs a value after it; write for example --try precision="),
    ("zero-micro-batch", "model batch --try micro_batch=0", "", "micro_batch=0 is not allowed"),
    ("negative-accumulation", "model batch --try accumulation=-1", "", "accumulation=-1 is not allowed"),
    ("bad-checkpointing", "model batch --try checkpointing=maybe", "", "write off, all, or a number of blocks"),
    ("zero-steps", "model batch --steps 0", "", "--steps 0 is not allowed"),
    ("negative-steps", "model batch --steps -2", "", "--steps -2 is not allowed"),
    ("steps-not-a-number", "model batch --steps many", "",
     "--steps 'many' is not a whole number; write for example --steps 3"),
    ("negative-warmup", "model batch --warmup -1", "", "--warmup -1 is not allowed"),
    ("zero-batch-size", "model batch --budget 1GiB --batch-size 0", "", "--batch-size 0 is not allowed"),
    ("negative-batch-size", "model batch --budget 1GiB --batch-size -8", "", "--batch-size -8 is not allowed"),
    (
        "micro-batch-not-dividing",
        "model batch --budget 1GiB --batch-size 8 --search --try micro_batch=3",
        "",
        "micro_batch=3 does not divide batch_size=8",
    ),
    (
        "micro-batch-not-dividing-rows",
        "model batch --budget 1GiB --search --try micro_batch=3",
        "",
        "does not divide batch_size=4",
    ),
    ("accumulation-in-search", "model batch --budget 1GiB --search --try accumulation=2,4", "", "restrict micro_batch"),
    ("search-without-try", "model batch --budget 1GiB --search", "", "add --try KEY=V1,V2"),
    ("batch-size-with-try", "model batch --batch-size 8 --try checkpointing=off,on", "", "add --search"),
    ("search-without-budget-on-cpu", "model batch --batch-size 8", "", "needs a budget"),
    ("zero-lr", "model batch --lr 0", "", "--lr 0.0 is not allowed"),
    ("noise-above-one", "model batch --noise 1.5", "", "--noise 1.5 is not allowed"),
    ("noise-not-a-number", "model batch --noise low", "",
     "--noise 'low' is not a number; write for example --noise 0.05"),
    ("zero-time-limit", "model batch --time-limit 0", "", "--time-limit 0.0 is not allowed"),
    ("lr-not-a-number", "model batch --lr fast", "", "--lr 'fast' is not a number; write for example --lr 1e-05"),
    ("apply-with-dry-run", "model batch --apply --dry-run", "", "drop one of the two"),
    ("gpus-without-dry-run", "model batch --gpus 2", "", "never shards a live run; add --dry-run"),
    ("strategy-without-dry-run", "model batch --strategy fsdp2 --budget 1GiB", "", "add --dry-run"),
    ("gpus-not-a-number", "model batch --dry-run --gpus two", "", "write an int >= 1 such as --gpus 8"),
    ("zero-gpus", "model batch --dry-run --gpus 0", "", "--gpus '0' is not a number of GPUs"),
    ("gpus-auto-without-budget", "model batch --dry-run --gpus auto", "", "add --budget"),
    ("unknown-strategy", "model batch --dry-run --gpus 2 --strategy ddp", "",
     "write --strategy fsdp1, fsdp2, zero2 or zero3"),
    ("strategy-without-gpus", "model batch --dry-run --strategy zero3", "", "add --gpus N"),
    ("search-with-gpus", "model batch --dry-run --gpus 2 --budget 1GiB --search --try checkpointing=off,on", "",
     "--search does not go with --gpus 2"),
    ("in-backward-sharded", "model batch --dry-run --gpus 2 --try optimizer_in_backward=on", "",
     "is not estimated sharded"),
    ("body-syntax-error", "model batch", "loss = model(**batch).loss +", "syntax error on line 1"),
    ("body-return", "model batch", "return model(**batch).loss", "syntax error"),
    ("body-without-loss", "model batch", "out = model(**batch)", "must set loss = ..."),
    ("tuple-batch-empty-body", "mlp pairs", "", "write the loss in the cell body"),
]


@pytest.mark.parametrize(("line", "body", "fragment"), [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_bad_invocations_raise_one_line_usage_errors(
    shell: InteractiveShell, monkeypatch: pytest.MonkeyPatch, line: str, body: str, fragment: str
) -> None:
    import IPython.display

    shown: list[Any] = []
    monkeypatch.setattr(IPython.display, "display", lambda obj, *args, **kwargs: shown.append(obj))
    monkeypatch.setattr(magic_render, "shows_widgets", lambda shell: True)
    models = {name: shell.user_ns[name] for name in ("model", "mlp")}
    before = {name: fingerprint(model) for name, model in models.items()}
    shell.user_ns.pop(APPLIED_NAME, None)
    with pytest.raises(UsageError) as caught:
        if body:
            memfit(shell, line, body)
        else:
            shell.run_line_magic("memfit", line)
    message = str(caught.value)
    assert fragment in message
    assert "\n" not in message and message.strip() == message and len(message) < 400
    assert shown == [], "nothing is displayed before the input is checked"
    assert APPLIED_NAME not in shell.user_ns
    for name, model in models.items():
        assert_same(before[name], fingerprint(model))


@pytest.mark.parametrize(
    "line",
    ["model batch --steps many", "model batch --steps 2.5", "model batch --noise low", "model batch --lr fast",
     "model batch --max-trials few", "model batch --budget 1GiB --batch-size eight", "model batch --time-limit soon",
     "model batch --warmup x"],
)
def test_a_value_of_the_wrong_type_is_one_sentence_not_the_usage(shell: InteractiveShell, line: str) -> None:
    with pytest.raises(UsageError) as caught:
        shell.run_line_magic("memfit", line)
    message = str(caught.value)
    option = line.split("--")[-1].split()[0]
    assert message.startswith(f"--{option} ") and "; write for example --" in message, message
    assert "[--warmup N]" not in message and "invalid" not in message, message


def test_at_least_fifteen_bad_invocations() -> None:
    assert len(BAD) >= 15 and len({case[0] for case in BAD}) == len(BAD)


def test_repeated_try_options_make_one_grid_and_warmup_zero_is_accepted(shell: InteractiveShell) -> None:
    report = memfit(
        shell, "mlp pairs --try checkpointing=off,on --try micro_batch=all,2 --steps 1 --warmup 0 --noise 0 --quiet",
        MLP_LOSS,
    )
    grid = parse_grid(["checkpointing=off,on", "micro_batch=all,2"])  # 2 rows of 4: accumulation 2 keeps the 4
    kept = [p if p.micro_batch is None else p.replace(accumulation=2) for p in grid]
    assert [t.label for t in report] == [p.label() for p in kept]
    assert len(report) == 4 and all(t.status == "ok" for t in report)
    python_side = memlab.measure(
        shell.user_ns["mlp"], shell.user_ns["pairs"], memlab.Plan(), warmup=0, steps=1, noise=0,
        loss_fn=lambda m, b: (m(b[0]).squeeze(-1) - b[1]).pow(2).mean(),
    )
    assert python_side.status == "ok"


def test_try_micro_batch_keeps_the_batch_rows_per_optimizer_step(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    shell.user_ns["eight"] = mlp_batch(rows=8, width=8)
    body = "x, y = eight\nloss = (mlp(x).squeeze(-1) - y).pow(2).mean()"
    report = memfit(shell, f"mlp eight --try micro_batch=1,2,4 {FAST}", body)
    assert [t.plan.micro_batch for t in report] == [1, 2, 4]
    assert [t.plan.accumulation for t in report] == [8, 4, 2]
    assert all(t.rows_per_step == 8 for t in report), [t.rows_per_step for t in report]
    assert "8 rows per optimizer step" in report.to_text().split("Best:")[-1]  # said under the table
    named = memfit(shell, f"mlp eight --try micro_batch=2 accumulation=1 {FAST}", body)  # the user's own, kept
    assert [(t.plan.micro_batch, t.plan.accumulation, t.rows_per_step) for t in named] == [(2, 1, 2)]
    with pytest.raises(UsageError, match=r"micro_batch=3 does not divide the 8 rows of eight; write one of 1, 2, 4, 8"):
        memfit(shell, f"mlp eight --try micro_batch=2,3 {FAST}", body)
    shell.user_ns.pop("eight")


def test_help_lists_every_lever(shell: InteractiveShell) -> None:
    from memlab.plan import LEVERS

    doc = MemfitMagics.memfit.__doc__  # what %%memfit? shows, generated from the argument declarations
    assert doc is not None
    flat = "".join(doc.split())  # argparse wraps the help, long tokens included
    for name, spec in LEVERS.items():
        assert f"{name}=" in flat and all(choice in flat for choice in spec.choices)


def test_try_switches_the_attention_implementation(shell: InteractiveShell) -> None:
    report = memfit(shell, f"model batch --try attention=model,eager,sdpa {FAST}")
    assert [t.plan.attention for t in report] == [None, "eager", "sdpa"] and all(t.status == "ok" for t in report)
    assert shell.user_ns["model"].config._attn_implementation == "sdpa"  # back as it was loaded


def test_try_with_a_budget_measures_exactly_the_grid_and_marks_it(shell: InteractiveShell) -> None:
    report = memfit(shell, f"mlp pairs --try checkpointing=off,on micro_batch=all,2 --budget 1GiB {FAST}", MLP_LOSS)
    grid = parse_grid(["checkpointing=off,on", "micro_batch=all,2"])
    expected = [p if p.micro_batch is None else p.replace(accumulation=2) for p in grid]  # the 4 rows of pairs kept
    assert [t.plan for t in report] == expected and not report.skipped
    assert all(t.rows_per_step == 4 for t in report)
    assert report.budget == 1024**3 and all(t.budget == 1024**3 and t.fits for t in report)
    tight = memfit(shell, f"mlp pairs --try checkpointing=off,on --budget 1KiB {FAST}", MLP_LOSS)
    assert [t.plan for t in tight] == parse_grid(["checkpointing=off,on"]) and tight.best is None
