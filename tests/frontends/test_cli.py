"""The ``memlab`` command (memlab.frontends.cli.main): its words, help, the demo end to end, and bad arguments.

The command line's words (issue 48): Llama 3 8B by name, the built-in names listed for an unknown one, budget
units said plainly, a 4-bit error in the command's own flags, and "best" in --json.

The ``memlab`` command: help, the demo end to end (table, winner, HTML with the figure), and bad arguments."""

from __future__ import annotations

import html
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import memlab.runner.trial
import memlab.search
from memlab.errors import MemlabError
from memlab.estimation.configs import KNOWN_SHAPES, load_config
from memlab.frontends.cli.estimate.text import json_with_verdicts
from memlab.frontends.cli.main import build_parser, demo_space, main, plan_code
from memlab.plan import Plan, parse_budget
from memlab.report import Report, Trial
from memlab.report.format import budget_words


@pytest.mark.parametrize("name", ["llama-8b", "llama-3-8b", "Llama-8B"])
def test_llama_3_8b_is_built_in(name: str) -> None:
    config = load_config(name)
    assert (config.hidden_size, config.intermediate_size, config.num_key_value_heads, config.vocab_size) == (
        4096, 14336, 8, 128256)


def test_an_unknown_name_lists_the_built_in_names() -> None:
    with pytest.raises(MemlabError) as caught:
        load_config("llama-9z")
    for name in KNOWN_SHAPES:
        assert name in str(caught.value)


@pytest.mark.parametrize(("text", "gib", "words"), [
    ("24gb", 24e9 / 2**30, "GB = 10^9 bytes"), ("24GB", 24e9 / 2**30, "GB = 10^9 bytes"),
    ("24G", 24.0, "G read as GiB"), ("24g", 24.0, "G read as GiB"), ("24GiB", 24.0, "24GiB = 24.00 GiB"),
    ("24gib", 24.0, "= 24.00 GiB"), ("512mb", 512e6 / 2**30, "MB = 10^6 bytes"),
])
def test_budget_units_are_read_the_same_in_any_case_and_said(text: str, gib: float, words: str) -> None:
    assert parse_budget(text) == pytest.approx(gib * 2**30, abs=1)
    assert words in budget_words(text)


def test_the_cli_says_which_unit_it_read(capsys: pytest.CaptureFixture[str]) -> None:
    main(["estimate", "gpt2", "--batch", "1x8", "--budget", "24gb", "--device", "cpu"])
    header = " ".join(" ".join(capsys.readouterr().out.splitlines()[:2]).split())  # within 120 columns
    assert "budget 24gb = 22.35 GiB (GB = 10^9 bytes; write 24GiB for 2^30)" in header


def test_a_4_bit_error_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "gpt2", "--batch", "1x8", "--load-in-4bit"]) == 2
    err = capsys.readouterr().err
    assert "--try adapter=lora" in err and "adapter='lora'" not in err


def test_json_names_the_best_and_why() -> None:
    small = Trial(Plan(checkpointing=True), "ok", 500, {"params": 500}, None, None, None, "cuda", estimated=True)
    large = Trial(Plan(), "ok", 900, {"params": 900}, None, None, None, "cuda", estimated=True)
    data = json.loads(json_with_verdicts(Report([large, small], budget=1000)))
    assert data["best"] == {"label": "ckpt", "why": "best: ckpt, lowest peak among plans that fit (nothing was timed)"}
    assert json.loads(json_with_verdicts(Report([large], budget=800)))["best"] is None


def test_the_built_in_names_are_written_where_a_reader_looks() -> None:
    """They were only in ``--help``: the README's estimate line and the estimates page name every built-in shape."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    page, readme = (root / "docs" / "estimates.md").read_text(), (root / "README.md").read_text()
    assert all(f"`{name}`" in page for name in KNOWN_SHAPES), [name for name in KNOWN_SHAPES if name not in page]
    canonical = [name for name in KNOWN_SHAPES if name != "llama-8b"]  # llama-3-8b's other name
    assert all(name in readme for name in canonical)


def test_help_says_every_exit_status_and_names_the_shapes_as_the_readme_does(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 61 item 5: ``memlab --help`` leaves out no exit status the README's example returns (1: nothing fits),
    and ``estimate --help`` lists each built-in shape once, as the README's list, a second name in brackets."""
    import contextlib
    import re
    from pathlib import Path

    from memlab.frontends.cli.main import main

    for argv in (["--help"], ["estimate", "--help"]):
        with contextlib.suppress(SystemExit):
            main(argv)
        text = " ".join(capsys.readouterr().out.split())
        assert re.search(r"\b1 when (nothing|none) fits", text), text[-600:]
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    shapes = re.search(r"built-in shape: ([^.]+)\.", text)
    assert shapes is not None, text[:600]
    listed = re.sub(r" \(or [^)]*\)", "", shapes.group(1)).split(", ")
    readme_list = re.search(r"a shape built in:\s+([^)]+)\)", readme)
    assert readme_list is not None and listed == " ".join(readme_list.group(1).split()).split(", "), listed


ROOT = Path(__file__).resolve().parents[2]


def memlab_command(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -m memlab ARGS`` in a fresh interpreter, as a user's shell would run ``memlab ARGS``."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", "memlab", *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT
    )


def test_help_lists_the_commands() -> None:
    result = memlab_command("--help")
    assert result.returncode == 0, result.stderr
    assert "demo" in result.stdout and "estimate" in result.stdout
    demo = memlab_command("demo", "--help")
    assert demo.returncode == 0
    for option in ("--budget", "--batch-size", "--html", "--steps", "--noise", "--time-limit", "--verbose"):
        assert option in demo.stdout


@pytest.mark.slow
def test_demo_prints_a_table_and_a_winner_and_writes_html(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "out" / "report.html"
    monkeypatch.delenv("COLUMNS", raising=False)
    result = memlab_command("demo", "--steps", "1", "--noise", "0", "--html", str(target))
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    # piped (no terminal, no COLUMNS): still within 120 columns (the path of the report aside; it was 261), and no
    # carriage-return updates
    assert [line for line in out.splitlines() if len(line) > 120 and str(target) not in line] == [], out
    assert "\r" not in out and "\r" not in result.stderr
    assert "plan" in out and "status" in out and "peak" in out and "samples/s" in out  # the table header
    assert "does not fit" in out  # the budget forces a real choice: the plain plan does not fit
    # the best and its ties said once (they were twice: "Best:" under the table and "Winner:" after it)
    best = [line for line in out.splitlines() if line.startswith("Best: ")]
    assert len(best) == 1 and "none" not in best[0] and "Winner" not in out, out
    assert sum(line.startswith(("\u2248 As fast", "As fast")) for line in out.splitlines()) <= 1, out
    assert str(target) in out
    page = target.read_text(encoding="utf-8")
    text = page.split("<pre>", 1)[1].split("</pre>", 1)[0]  # the text as a terminal of 120 columns prints it
    assert all(len(line) <= 120 for line in html.unescape(text).splitlines()), text
    assert "white-space:pre;" in page and "overflow-wrap:anywhere" not in page
    assert "<table" in page and "<svg" in page and "samples/s" in page
    # The figure is the static SVG a notebook keeps, inlined: the page opens offline and stays small (plotly.js
    # inlined made it 4.8 MB).
    assert "<script src=" not in page and 'src="http' not in page and len(page) < 200_000


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["demo", "--steps", "0"], "--steps must be a whole number of steps of at least 1, such as 3; got 0"),
        (["demo", "--batch-size", "many"], "--batch-size must be a whole number of rows such as 8; got 'many'"),
        (["demo", "--budget", "lots"], "budget 'lots' is not understood"),
        (["demo", "--noise", "5"], "--noise must be a fraction from 0 up to 1 such as 0.05 (that is 5%); got 5"),
        (["demo", "--time-limit", "0"], "--time-limit must be a positive number of seconds such as 10; got 0"),
        (["demo", "--colour"], "memlab demo has no option --colour; write one of --budget, --batch-size"),
        (["bogus"], "there is no command 'bogus'; write memlab demo or memlab estimate"),
    ],
    ids=[
        "zero-steps", "batch-size-not-a-number", "bad-budget", "noise-not-a-fraction", "no-time", "unknown-option",
        "unknown-command",
    ],
)
def test_bad_arguments_exit_non_zero_with_one_line(
    args: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(args) == 2
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip() and "kernels" not in line]
    assert len(lines) == 1, captured.err
    assert fragment in lines[0]
    assert captured.out == ""


def test_a_bad_argument_in_a_fresh_shell_is_one_line_and_exit_status_2() -> None:
    # The cases above call main() in this process; this one runs the command as a shell does, so that nothing a
    # fresh interpreter prints while importing (a library's warning) joins the one line.
    result = memlab_command("demo", "--steps", "0", timeout=120)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip() and "kernels" not in line]
    assert len(lines) == 1 and "--steps must be a whole number of steps of at least 1" in lines[0], result.stderr
    assert result.stdout == ""


def test_main_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert "memlab" in capsys.readouterr().out
    assert main([]) == 2  # no command: the help, and a line saying to choose one
    assert "choose a command" in capsys.readouterr().err
    assert main(["demo", "--budget", "-1"]) == 2


POSITIVE = "rows and tokens must be positive; write for example --batch 1x512"


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["estimate", "llama-7b", "--batch", "-1x512"], POSITIVE),
        (["estimate", "llama-7b", "--batch", "0x512"], POSITIVE),
        (["estimate", "llama-7b", "--batch", "1x-512"], POSITIVE),
        (["demo", "--budget", "-1GiB"], "budget '-1GiB'"),
        (["estimate", "llama-7b", "--strategy", "zero3"],
         "--strategy zero3 needs a number of GPUs; add --gpus N, e.g. --gpus 8"),
        (["estimate", "llama-7b", "--strategy", "fsdp2", "--budget", "24GiB"],
         "--strategy fsdp2 needs a number of GPUs"),
    ],
    ids=["negative-rows", "zero-rows", "negative-tokens", "negative-budget", "strategy-without-gpus",
         "strategy-without-gpus-with-budget"],
)
def test_wrong_values_are_one_sentence_saying_what_to_write(
    args: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(args) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip() and "reading the config" not in line]
    assert len(lines) == 1, err
    assert fragment in lines[0], err
    assert "expected one argument" not in err


# One case per kind of argument: each bad value is one sentence that names the option and shows what to write,
# never argparse's wording ("argument --steps:", "invalid choice", "expected one argument", "unrecognized").
ONE_SENTENCE = [
    ("whole-number", ["demo", "--steps", "many"], "memlab demo: error: --steps must be a whole number of steps such "
     "as 3; got 'many'"),
    ("whole-number-rows", ["demo", "--batch-size", "2.5"], "memlab demo: error: --batch-size must be a whole number "
     "of rows such as 8; got '2.5'"),
    ("fraction", ["demo", "--noise", "low"], "memlab demo: error: --noise must be a fraction from 0 up to 1 such as "
     "0.05 (that is 5%); got 'low'"),
    ("seconds", ["demo", "--time-limit", "soon"], "memlab demo: error: --time-limit must be a positive number of "
     "seconds such as 10; got 'soon'"),
    ("size", ["demo", "--budget", "24"], "memlab demo: error: budget '24' has no unit; write the unit, such as 24GiB "
     "or 24MB"),
    ("missing-value", ["demo", "--budget"], "memlab demo: error: --budget needs a value after it; write for example "
     "--budget 20MiB"),
    ("near-option", ["demo", "--batchsize", "8"], "memlab demo: error: memlab demo has no option --batchsize; write "
     "--batch-size"),
    ("stray-value", ["demo", "8"], "memlab demo: error: memlab demo takes no value '8' here; write its options, "
     "--budget, --batch-size, --steps, --html, --noise, --time-limit or --verbose, each with its value"),
    ("top-option", ["--colour"], "memlab: error: memlab has no option --colour; write a command first, memlab demo "
     "or memlab estimate"),
    ("missing-model", ["estimate"], "memlab estimate: error: memlab estimate needs MODEL; write for example memlab "
     "estimate llama-7b"),
    ("choice", ["estimate", "llama-7b", "--strategy", "zero9"], "memlab estimate: error: --strategy must be one of "
     "none, fsdp2, fsdp1, zero2, zero3; got 'zero9'"),
    ("choice-missing", ["estimate", "llama-7b", "--device"], "memlab estimate: error: --device needs a value after "
     "it; write for example --device cuda"),
    ("gpus", ["estimate", "llama-7b", "--gpus", "many"], "memlab estimate: --gpus 'many' is not a number of GPUs; "
     "write for example --gpus 8, or --gpus auto with --budget"),
    ("rows-x-tokens", ["estimate", "llama-7b", "--batch", "1y2"], "memlab estimate: batch '1y2' is not ROWSxTOKENS; "
     "write for example --batch 1x512"),
    ("estimate-option", ["estimate", "llama-7b", "--precision", "fp9"], "memlab estimate: error: memlab estimate has "
     "no option --precision; write one of --config, --batch"),
]


@pytest.mark.parametrize(("args", "line"), [case[1:] for case in ONE_SENTENCE], ids=[case[0] for case in ONE_SENTENCE])
def test_each_kind_of_bad_argument_is_one_sentence_saying_what_to_write(
    args: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    [said] = [text for text in captured.err.splitlines() if text.strip()]
    assert said.startswith(line), said
    for argparse_words in ("argument --", "invalid choice", "expected one argument", "unrecognized", "see memlab"):
        assert argparse_words not in said


def test_demo_pieces() -> None:
    assert build_parser().parse_args(["demo"]).batch_size is None
    assert demo_space(8)["micro_batch"] == [8, 4, 2]
    assert plan_code(Plan(precision="bf16")) == "memlab.Plan(precision='bf16')"


class RecordedRuns:
    """Stands in for ``measure`` and ``fit`` (what ``memlab demo`` calls) and keeps the keywords of every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def measure(self, model: Any, batch: Any, plan: Plan, **options: Any) -> Trial:
        self.calls.append(("measure", options))
        return Trial(plan, "ok", 10 * 2**20, {"params": 10 * 2**20}, 0.1, 80.0, None, "cpu")

    def fit(self, model: Any, batch: Any, **options: Any) -> Report:
        self.calls.append(("fit", options))
        return Report([], budget=options["budget"])


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> RecordedRuns:
    runs = RecordedRuns()
    monkeypatch.setattr(memlab.runner.trial, "measure", runs.measure)
    monkeypatch.setattr(memlab.search, "fit", runs.fit)
    return runs


def test_verbose_noise_and_time_limit_reach_the_run_options(recorded: RecordedRuns, tmp_path: Path) -> None:
    args = ["demo", "--verbose", "--noise", "0.1", "--time-limit", "3", "--steps", "4", "--html", str(tmp_path / "r")]
    assert main(args) == 0
    assert [name for name, _ in recorded.calls] == ["measure", "fit"]
    for _, options in recorded.calls:
        assert options["verbose"] is True and options["time_limit"] == 3.0
    fit_options = recorded.calls[1][1]
    assert fit_options["noise"] == 0.1 and fit_options["steps"] == 4 and fit_options["warmup"] == 1
    assert fit_options["budget"] == int(10 * 2**20 * 0.6)  # the demo's budget from the plain plan's peak
    assert recorded.calls[0][1]["steps"] == 1  # the plain plan is measured only for its peak


def test_the_demo_is_quiet_by_default(recorded: RecordedRuns) -> None:
    assert main(["demo", "--budget", "20MiB", "--html", os.devnull]) == 0
    assert [name for name, _ in recorded.calls] == ["fit"]  # a budget given: no plain measurement
    options = recorded.calls[0][1]
    assert options["verbose"] is False and options["noise"] == 0.05 and options["time_limit"] == 10.0
    assert options["budget"] == 20 * 2**20 and options["steps"] == 2


# --- memlab estimate: the allocated peak, what the card will show, and the verdict on the latter --------------------

GIB, MIB = 1024**3, 1024**2


def _estimates_with_reserve(reserved: int | None) -> Any:
    """Stands in for ``estimate_plans``: a 7B plan whose allocated peak fits 24 GiB, with the allocator's reserve the
    test gives (the reserve's model is not the CLI's concern), as an estimate for CUDA."""

    def estimate_plans(model: Any, batch: Any, plans: Any, *, budget: Any = None, device: Any = None,
                       gpu: Any = None, load: Any = None) -> Report:
        trials = [Trial(plan, "ok", 20 * GIB, {"params": 13 * GIB}, None, None, None, "cuda", budget=budget,
                        reserved_bytes=reserved, estimated=True) for plan in plans]
        return Report(trials, budget=budget)

    return estimate_plans


@pytest.mark.parametrize(("reserved", "status"), [(23 * GIB + 512 * MIB, 1), (22 * GIB, 0)])
def test_estimate_prints_the_allocated_peak_the_card_figure_and_the_verdict_on_the_card(
    reserved: int, status: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    estimate_module = importlib.import_module("memlab.estimation.estimate")
    from memlab.estimation.cuda.gpus import GPUS

    monkeypatch.setattr(estimate_module, "estimate_plans", _estimates_with_reserve(reserved))
    assert main(["estimate", "llama-7b", "--batch", "1x512", "--budget", "24GiB"]) == status
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "batch 1x512, 1 plan, for an H100-80GB" in lines[0]
    table = next(i for i, line in enumerate(lines) if line.split()[:2] == ["plan", "status"])
    assert lines[table].split()[:6] == ["plan", "status", "peak", "GiB", "card", "GiB"]
    card = (reserved + GPUS["H100-80GB"].context_bytes) / GIB
    row = lines[table + 1].split()
    assert row[row.index("20.0") + 1] == f"{card:.1f}"
    assert ("ok (estimate)" in lines[table + 1]) is (status == 0)  # 20 GiB allocated fits; the card decides
    said = " ".join(out.split())
    assert ("The card column is the caching allocator's reserve + the CUDA context, 774.8 MiB (what nvidia-smi "
            "shows); fits are judged on it.") in said


def test_estimate_says_the_card_figure_is_unknown_without_a_reserve_and_names_the_gpu(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    estimate_module = importlib.import_module("memlab.estimation.estimate")

    monkeypatch.setattr(estimate_module, "estimate_plans", _estimates_with_reserve(None))
    assert main(["estimate", "llama-7b", "--budget", "24GiB", "--gpu", "L4-24GB"]) == 0
    out = capsys.readouterr().out
    assert "for an L4-24GB" in out.splitlines()[0] and "card GiB" not in out
    said = " ".join(out.split())
    assert ("Card figure unknown (the allocator's reserve or the CUDA context is not known); fits are judged on the "
            "allocated peak") in said
    assert main(["estimate", "llama-7b", "--gpu", "TPU"]) == 2
    assert "--gpu must be one of H100-80GB, " in (err := capsys.readouterr().err) and "got 'TPU'" in err


def test_estimate_json_carries_the_card_fields(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    estimate_module = importlib.import_module("memlab.estimation.estimate")

    monkeypatch.setattr(estimate_module, "estimate_plans", _estimates_with_reserve(22 * GIB))
    assert main(["estimate", "llama-7b", "--budget", "24GiB", "--json"]) == 0
    (trial,) = json.loads(capsys.readouterr().out)["trials"]
    assert trial["reserved_bytes"] == 22 * GIB and trial["context_bytes"] > 0
    assert trial["card_bytes"] == trial["reserved_bytes"] + trial["context_bytes"]
    assert trial["verdict_figure"] == "card" and trial["fits"] is True


def test_estimate_gpus_auto_prints_each_gpus_card_figure_and_the_verdict_on_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from memlab.estimation.cuda.context import card_context
    from memlab.estimation.sharded import per_gpu as sharded

    asked: dict[str, Any] = {}

    def sharded_trials(model: Any, batch: Any, plans: Any, **keywords: Any) -> list[Any]:
        asked.update(keywords)
        rows = []
        for name, gpus, reserved in (("fsdp2", 4, 22 * GIB), ("zero3", 4, 23 * GIB + 512 * MIB)):
            trial = sharded.ShardedTrial(Plan(), "ok", 20 * GIB, {"params": 5 * GIB}, None, None, None, "cuda",
                                         budget=keywords["budget"], reserved_bytes=reserved, estimated=True,
                                         gpus=gpus, strategy=name, detail={"sharded_params": 5 * GIB})
            rows.append((Plan(), name, card_context(trial, keywords["gpu"])))
        return [*rows, (Plan(), "zero2", None)]

    monkeypatch.setattr(sharded, "sharded_trials", sharded_trials)
    assert main(["estimate", "llama-7b", "--batch", "1x512", "--budget", "24GiB", "--gpus", "auto",
                 "--gpu", "H200-141GB"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert asked["gpus"] == "auto" and asked["gpu"].name == "H200-141GB"  # the kind, resolved once by the command
    assert out[0] == ("llama-7b: LlamaForCausalLM, per-GPU batch 1x512, --gpus auto, for an H200-141GB, budget 24GiB "
                      "= 24.00 GiB")
    assert out[1] == ("Best: plain with fsdp2 on 4 GPUs (card 22.76 GiB per GPU): the fewest GPUs that fit, then the "
                      "lowest figure")
    rows: dict[tuple[str, ...], list[str]] = {}
    for line in out[: out.index("Where the peak goes, per GPU (MiB):")]:
        if line.startswith(" plain "):
            rows[tuple(line.split()[:2])] = line.split()[2:]
    where = out.index("Where the peak goes, per GPU (MiB):")
    assert out[where + 1].split() == ["part", "fsdp2", "zero3"] and out[where + 2].split() == ["sharded_params",
                                                                                             "5,120", "5,120"]
    assert rows[("plain", "fsdp2")] == ["4", "20.0", "22.8", "fits", "(card", "figure)"]
    assert rows[("plain", "zero3")] == ["4", "20.0", "24.3", "does", "not", "fit", "(card", "figure)"]
    assert rows[("plain", "zero2")] == ["-", "-", "-", "fits", "on", "no", "number", "of", "GPUs", "up", "to", "1024",
                                        "[1]"]
    # why zero2 fits nowhere: its whole fp32 weights (6.74B parameters, 25.1 GiB) on every GPU pass the budget
    note = out[out.index("Notes:") + 1]
    assert note.startswith("  1. ZeRO-2 keeps the whole weights on every GPU") and "25.10 GiB" in note, note
    assert all(len(line) <= 120 for line in out)
    assert main(["estimate", "llama-7b", "--budget", "24GiB", "--gpus", "auto", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["card_bytes"] == rows[0]["reserved_bytes"] + rows[0]["context_bytes"]
    assert rows[0]["verdict_figure"] == "card" and rows[1]["fits"] is False
    assert [row["verdict"] for row in rows] == ["ok (estimate)", "does not fit (over budget)",
                                                "does not fit (on no number of GPUs up to 1024)"]


def test_the_demo_runs_on_one_torch_thread_on_a_cpu_and_gives_the_callers_threads_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import io

    import torch

    from memlab.frontends.cli.main import run_demo

    seen: list[int] = []
    def fit_seeing_threads(*args: Any, **kwargs: Any) -> Report:
        seen.append(torch.get_num_threads())
        return Report([], budget=kwargs.get("budget"))

    monkeypatch.setattr(memlab.search, "fit", fit_seeing_threads)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        out = io.StringIO()
        assert run_demo(steps=1, noise=0.0, budget="1GiB", html_path=None, out=out, progress=False) == 0
        assert seen == [1] and torch.get_num_threads() == 2
        first_sentence = " ".join(out.getvalue().split("\n\n")[0].split())  # wrapped at the terminal's width
        assert "on cpu (one torch thread)." in first_sentence
    finally:
        torch.set_num_threads(before)


# --- one verdict per trial, the effective batch, the next step -------------------------------------------------------


def _estimates_by_plan(peaks: dict[str, float]) -> Any:
    """Stands in for ``estimate_plans``: each plan's allocated peak from ``peaks`` (GiB, by label; 30 GiB for a plan
    not named), its card figure the peak plus 1 GiB of reserve and the GPU's modelled CUDA context."""

    def estimate_plans(model: Any, batch: Any, plans: Any, *, budget: Any = None, device: Any = None,
                       gpu: Any = None, load: Any = None) -> Report:
        trials = []
        for plan in plans:
            peak = int(peaks.get(plan.label(), 30) * GIB)
            trials.append(Trial(plan, "ok", peak, {"params": peak // 2, "other": 20_000}, None, None, None, "cuda",
                                budget=budget, reserved_bytes=peak + GIB, estimated=True))
        return Report(trials, budget=budget)

    return estimate_plans


def _table_statuses(out: str) -> dict[str, str]:
    """``{label: status cell}`` of the rows of an estimate's table."""
    import re

    lines = out.splitlines()
    start = next(number for number, line in enumerate(lines) if line.split()[:2] == ["plan", "status"])
    statuses = {}
    for line in lines[start + 1:]:
        if not line.strip():
            break
        found = re.match(r"^\W*(\S+)\s+(does not fit \((?:over budget|OOM)\)|ok \(estimate\)|ok|error)\s", line)
        assert found, line
        statuses[found.group(1)] = found.group(2)
    return statuses


def test_the_table_the_json_and_the_exit_status_give_one_verdict_per_trial(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    estimate_module = importlib.import_module("memlab.estimation.estimate")
    monkeypatch.setattr(estimate_module, "estimate_plans", _estimates_by_plan({"plain": 26, "ckpt": 18}))
    argv = ["estimate", "llama-7b", "--budget", "24GiB", "--try", "checkpointing=off,on"]
    assert main(argv) == 0
    table = _table_statuses(capsys.readouterr().out)
    assert main([*argv, "--json"]) == 0
    rows = {row["label"]: row for row in json.loads(capsys.readouterr().out)["trials"]}
    assert table == {"plain": "does not fit (over budget)", "ckpt": "ok (estimate)"}
    assert {label: row["verdict"] for label, row in rows.items()} == table
    assert [rows[label]["fits"] for label in ("plain", "ckpt")] == [False, True]
    # No plan fits: the exit status says so, whatever the JSON's status ("ok": the dry run ran) says.
    # (the same question with other dry runs: --no-cache, or the first answers, kept, would be read)
    monkeypatch.setattr(estimate_module, "estimate_plans", _estimates_by_plan({"plain": 26, "ckpt": 24}))
    assert main([*argv, "--json", "--no-cache"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert {row["verdict"] for row in data["trials"]} == {"does not fit (over budget)"}
    assert not any(row["fits"] for row in data["trials"])


def test_a_gpu_named_without_a_budget_is_the_budget(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    estimate_module = importlib.import_module("memlab.estimation.estimate")
    monkeypatch.setattr(estimate_module, "estimate_plans", _estimates_by_plan({"plain": 52.5}))
    # A card figure of about 54 GiB on an A100-40GB does not fit it, though no --budget was written.
    assert main(["estimate", "llama-7b", "--gpu", "A100-40GB"]) == 1
    out = capsys.readouterr().out
    assert "for an A100-40GB, budget: its memory, 39.49 GiB" in out.splitlines()[0]
    assert _table_statuses(out) == {"plain": "does not fit (over budget)"}
    assert main(["estimate", "llama-7b", "--gpu", "H100-80GB"]) == 0
    assert _table_statuses(capsys.readouterr().out) == {"plain": "ok (estimate)"}
    assert main(["estimate", "llama-7b"]) == 0  # no GPU named, no budget: no verdict on memory
    assert "budget" not in capsys.readouterr().out.splitlines()[0]


def test_try_micro_batch_keeps_the_effective_batch_as_the_magic_does(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from memlab.frontends.jupyter.magic.run import keep_rows as magic_keep_rows
    from memlab.search.space import keep_rows

    assert magic_keep_rows is keep_rows  # one function for both faces
    estimate_module = importlib.import_module("memlab.estimation.estimate")
    asked: list[str] = []

    def estimate_plans(model: Any, batch: Any, plans: Any, **keywords: Any) -> Report:
        asked.extend(plan.label() for plan in plans)
        return _estimates_by_plan({})(model, batch, plans, **keywords)

    monkeypatch.setattr(estimate_module, "estimate_plans", estimate_plans)
    assert main(["estimate", "llama-7b", "--batch", "4x512", "--try", "micro_batch=1,2,4"]) == 0
    out = capsys.readouterr().out
    assert asked == ["mb1x4", "mb2x2", "mb4x1"]
    assert "accumulation = 4 // micro_batch: every plan trains 4 rows per optimizer step" in out
    asked.clear()
    assert main(["estimate", "llama-7b", "--batch", "2x512", "--try", "micro_batch=4"]) == 2
    assert asked == []
    assert ("micro_batch=4 does not divide the 2 rows of --batch 2x512; write one of 1, 2"
            in capsys.readouterr().err)
    assert main(["estimate", "llama-7b", "--batch", "4x512", "--try", "micro_batch=2", "accumulation=1"]) == 0
    assert asked == ["mb2x1"]  # accumulation named: the grid is measured as written


def test_when_nothing_fits_the_cli_prints_the_suggestions_and_the_commands_that_try_them(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    estimate_module = importlib.import_module("memlab.estimation.estimate")
    def estimate_plans(model: Any, batch: Any, plans: Any, **keywords: Any) -> Report:
        # adapters fit (LoRA at 14 GiB, QLoRA at 6 GiB), everything else is at 30 GiB
        peaks = {plan.label(): {"lora": 14, "qlora": 6}.get(plan.adapter, 26 if plan == Plan() else 30)
                 for plan in plans}
        return _estimates_by_plan(peaks)(model, batch, plans, **keywords)

    monkeypatch.setattr(estimate_module, "estimate_plans", estimate_plans)
    assert main(["estimate", "llama-7b", "--batch", "1x512", "--budget", "24GiB"]) == 1
    out = capsys.readouterr().out
    lines = out.splitlines()
    # the best first, named once: QLoRA (the lower card figure among those expected as fast) or LoRA
    best = next(line for line in lines if line.startswith("Best: "))
    named = best.split("Best: ")[1].split(",")[0]
    assert named.endswith("lora") and sum(bool(re.search(rf"(^|\s){re.escape(named)}(\s|,|$)", line))
                                          for line in lines) == 1, out
    offered = [(lines[i - 1], line.strip()) for i, line in enumerate(lines)
               if line.startswith("  memlab estimate ") and " --try " in line and "--max-tokens" not in line]
    assert len(offered) == 2, out
    for above, command in offered:  # each with the command that tries exactly it
        assert command.startswith("memlab estimate llama-7b --batch 1x512 --budget 24GiB --try ")
        from memlab.plan import parse_grid

        (plan,) = parse_grid(command.split(" --try ")[1].split())
        assert plan.label() == named if above == "Next: try the best:" else f" {plan.label()} (" in above
    assert lines[-2:] == ["Or shard the training over the fewest GPUs that fit:",
                          "  memlab estimate llama-7b --batch 1x512 --budget 24GiB --gpus auto"]


def test_a_long_estimate_shows_a_bar_with_the_time_left_on_a_terminal() -> None:
    import io

    from memlab.frontends.cli.estimate.progress import EstimateProgress

    err = io.StringIO()
    with EstimateProgress(err, dry_runs=3, terminal=True) as say:
        say("reading the config of llama-70b")
        for number in (1, 2, 3):
            say(f"estimating plan {number} of 3: plain")
        assert say.bar is not None and say.bar.n == 2 and say.bar.total == 3
        say.expect(2)
        assert say.bar.total == 5
        import time

        drawn = len(err.getvalue())
        time.sleep(1.3)  # within one long dry run, the bar's clock still ticks
        assert len(err.getvalue()) > drawn
    shown = err.getvalue()
    assert "memlab estimate: estimating plan 3 of 3: plain" in shown and "dry runs" in shown
    assert "so far, about" in shown and "left]" in shown


def test_gpus_auto_says_what_it_searched_and_offers_bf16_and_adapters(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from memlab.estimation.sharded import per_gpu as sharded

    monkeypatch.setattr(sharded, "sharded_trials", lambda model, batch, plans, **keywords: [
        (plan, name, None) for plan in plans for name in ("fsdp2", "zero2", "zero3")])
    assert main(["estimate", "llama-70b", "--budget", "80GiB", "--gpus", "auto"]) == 1
    out = capsys.readouterr().out.splitlines()
    searched = next(i for i, line in enumerate(out) if line.startswith("Searched: "))
    assert " ".join(out[searched:searched + 2]).split() == (
        "Searched: plain (fp32 weights, fp32 compute, adamw) with fsdp2, zero2, zero3 on 1, 2, 4, ... 1024 GPUs "
        "(powers of two; --gpus N estimates another number).").split()
    assert out[out.index("Not searched: pure bf16 training:") + 1] == (
        "  memlab estimate llama-70b --batch 1x512 --budget 80GiB --gpus auto --try precision=bf16 weights=bf16")
    assert out[out.index("Not searched: adapters, which train on one GPU:") + 1] == (
        "  memlab estimate llama-70b --batch 1x512 --budget 80GiB --try adapter=lora,qlora precision=bf16")


def test_estimate_runs_without_full_collections_and_puts_the_collector_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    import gc

    from memlab.frontends.cli.estimate import command as estimate_cli

    monkeypatch.setenv("MEMLAB_CACHE_DIR", str(tmp_path))
    seen: list[tuple[int, ...]] = []
    monkeypatch.setattr(estimate_cli, "run", lambda args: seen.append(gc.get_threshold()) or 0)
    before = gc.get_threshold()
    assert main(["estimate", "gpt2", "--no-cache"]) == 0
    # none of its own, young ones included: a dry run's answer must not depend on when one runs
    assert seen and seen[0][1] == before[1] and seen[0][0] > 1000 * before[0] and seen[0][2] > 1000 * before[2]
    assert gc.get_threshold() == before


@pytest.mark.parametrize("dynamo_logs", [False, True])
def test_dynamos_exit_report_is_skipped_only_where_no_logger_would_show_it(dynamo_logs, monkeypatch):
    import atexit
    import logging

    import torch._dynamo.utils

    taken_off: list[Any] = []
    monkeypatch.setattr(atexit, "unregister", taken_off.append)
    dynamo_log = torch._dynamo.utils.log
    monkeypatch.setattr(dynamo_log, "level", logging.INFO if dynamo_logs else logging.WARNING)
    dynamo_log.manager._clear_cache()  # isEnabledFor keeps its answers per level
    assert main(["--version"]) == 0
    dynamo_log.manager._clear_cache()
    assert taken_off == ([] if dynamo_logs else [torch._dynamo.utils.dump_compile_times])


AN_ESTIMATES_IMPORTS = """
import importlib.util, sys
import torch
from memlab.frontends.cli.unused_imports import SkipUnusedImports
finder = SkipUnusedImports()
sys.meta_path.insert(0, finder)
from peft import LoraConfig, inject_adapter_in_model
layer = torch.nn.Sequential(torch.nn.Linear(8, 8))
inject_adapter_in_model(LoraConfig(r=2, target_modules=["0"]), layer)
import peft.import_utils as peft_checks
from transformers import LlamaConfig, LlamaForCausalLM
LlamaForCausalLM(LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                             vocab_size=32))
from transformers.utils import import_utils as transformers_checks
losses_took_scipy = "scipy.optimize" in sys.modules
from transformers import FNetConfig, FNetModel  # its Fourier transform takes scipy's where it is installed
# (without scipy, transformers' own fallback for it fails: the floor stack, which has none, builds the plain one)
fnet = FNetModel(FNetConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, vocab_size=32,
                            max_position_embeddings=8, tpu_short_seq_length=8,
                            use_tpu_fourier_optimizations=importlib.util.find_spec("scipy") is not None))
print(sorted(finder.waiting), "bitsandbytes" in sys.modules, losses_took_scipy, peft_checks.is_bnb_available(),
      transformers_checks.is_scipy_available(), type(layer[0]).__module__,
      importlib.util.find_spec("bitsandbytes") is not None, importlib.util.find_spec("scipy") is not None,
      hasattr(fnet.embeddings, "dft_mat_hidden") or any("dft" in name for name, _ in fnet.named_buffers()))
"""


@pytest.mark.slow  # a fresh process importing torch, transformers and peft: 5 s of a core
def test_the_estimate_command_imports_no_bitsandbytes_or_scipy_and_makes_its_adapters_and_models():
    # A fresh process, as the command is: peft's adapters and a transformers model made, neither package imported,
    # and neither hidden afterwards from code that asks for it by name.
    for package in ("peft", "bitsandbytes"):
        pytest.importorskip(package)
    scipy_installed = importlib.util.find_spec("scipy") is not None  # the floor stack has none
    done = subprocess.run([sys.executable, "-c", AN_ESTIMATES_IMPORTS], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    # Only the object-detection losses took scipy as missing: every check after them finds it where it is installed.
    assert done.stdout.split() == ["[]", "False", "False", "False", str(scipy_installed),
                                   "peft.tuners.lora.layer", "True", str(scipy_installed), str(scipy_installed)]


def test_only_the_estimate_command_line_skips_unused_imports(monkeypatch):
    import memlab.frontends.cli.main as cli
    from memlab.frontends.cli.unused_imports import SkipUnusedImports

    seen: list[bool] = []
    monkeypatch.setattr(cli, "main", lambda: seen.append(
        any(isinstance(finder, SkipUnusedImports) for finder in sys.meta_path)) or 0)
    monkeypatch.setattr(cli, "exit_without_teardown", sys.exit)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))  # the finder never outlives the test
    for words, installed in ((["memlab", "demo"], False), (["memlab", "estimate", "gpt2"], True)):
        monkeypatch.setattr(sys, "argv", words)
        with pytest.raises(SystemExit):
            cli.console_main()
        assert seen.pop() is installed


EXITS = """
import atexit, sys
marker = sys.argv[1]
atexit.register(lambda: open(marker, "w").write("atexit ran"))
sys.argv = ["memlab", "--version"]
from memlab.frontends.cli.main import console_main
console_main()
"""


def test_the_command_exits_without_teardown_after_its_own_exit_work(tmp_path):
    """The output flushed, the atexit hooks run, the status kept, and nothing printed by a teardown (nanobind's
    "leaked" objects where Triton is imported: gc.freeze before a normal exit kept them alive through it)."""
    marker = tmp_path / "atexit.txt"
    done = subprocess.run([sys.executable, "-c", EXITS, str(marker)], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0 and done.stdout.startswith("memlab "), (done.stdout, done.stderr)
    assert marker.read_text() == "atexit ran"
    if importlib.util.find_spec("triton") is not None:  # the GPU machines' stack: Triton imported, then the exit
        script = EXITS.replace("from memlab", "import triton.language, triton._C.libtriton\nfrom memlab")
        done = subprocess.run([sys.executable, "-c", script, str(marker)], capture_output=True, text=True,
                              timeout=120, check=False)
        assert done.returncode == 0 and "leaked" not in done.stderr, done.stderr[-2000:]
