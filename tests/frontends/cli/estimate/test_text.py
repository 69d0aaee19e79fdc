"""``memlab estimate``'s answer as text (memlab.frontends.cli.estimate.text): short to scan, each budget said once,
every figure and exit status the one it names.

Issue 61 item 3 (and item 4's presentation): ``memlab estimate`` answers in a short text to scan. The two
commands a new user runs first, run for real (dry runs of the real configs): the verdict and the best plan first,
each plan named once, one unit per column (no "< 1 MiB" in a GiB column), numbered notes that are sentences and only
those that change the reading, a ``--gpu`` where the budget is not the assumed GPU's memory, and every line within
120 columns. The checks are of structure, not of the figures (other work moves those).

``memlab estimate --max-tokens`` says each budget once, in its header (as the one-GPU answer does), and its answer
names the host budget where ``--host-budget`` judged the sizes too.

Issue 71, the command line's words and exit codes: every figure a table labels is the figure it names, every
refusing status says which budget, every error row changes the exit status, a key the command cannot use is refused
up front. Real dry runs of a small Llama config saved as config.json (CUDA emulated on the CPU)."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import re
from pathlib import Path

import pytest
from models import llama_config_dir
from test_next import _run  # main() with its stdout, stderr and exit status

from memlab.frontends.cli.main import main
from memlab.frontends.cli.trainer import levers_asked

WIDTH = 120


def _run_answer(argv: list[str]) -> tuple[int, list[str]]:
    """main()'s exit status and stdout lines (the stderr apart)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(argv)
    return status, out.getvalue().splitlines()


@pytest.fixture(scope="module")
def llama_7b() -> tuple[int, list[str]]:
    return _run_answer(["estimate", "llama-7b", "--batch", "1x512", "--budget", "24GiB"])


@pytest.fixture(scope="module")
def gpt2_auto() -> tuple[int, list[str]]:
    return _run_answer(["estimate", "gpt2", "--gpus", "auto", "--budget", "8GiB"])


def _named(label: str, lines: list[str]) -> int:
    """How many lines name the plan ``label`` (as a whole: "lora" is not named in "qlora")."""
    pattern = re.compile(rf"(^|[\s(]){re.escape(label)}([\s,:;)]|$)")
    return sum(bool(pattern.search(line)) for line in lines)


def _notes(lines: list[str]) -> list[str]:
    """The numbered notes, each joined from its lines."""
    if "Notes:" not in lines:
        return []
    notes: list[str] = []
    for line in lines[lines.index("Notes:") + 1:]:
        if not line.strip():
            break
        if re.match(r"  \d+\. ", line):
            notes.append(line.strip())
        else:
            notes[-1] += " " + line.strip()
    return notes


def test_llama_7b_in_24_gib_answers_first_names_each_plan_once_and_fits_120_columns(
    llama_7b: tuple[int, list[str]],
) -> None:
    status, lines = llama_7b
    assert status == 1  # nothing tried fits
    assert all(len(line) <= WIDTH for line in lines), max(lines, key=len)
    header, verdict, best = lines[0], lines[1], next(line for line in lines if line.startswith("Best: "))
    assert header.startswith("llama-7b: LlamaForCausalLM, 6.74B parameters, batch 1x512") and "24.00 GiB" in header
    assert verdict.startswith("Verdict: plain does not fit") and lines.index(best) <= 3
    # each plan named once: the plan tried in its row, the best outside it in the Best line (its command under Next)
    plain_row = [line for line in lines if line.startswith(" plain ")]
    assert len(plain_row) == 1 and "does not fit (over budget)" in plain_row[0]
    named = best.split("Best: ")[1].split(",")[0]
    assert named != "plain" and _named(named, lines) == 1, lines
    suggested = [line.split(": ", 1)[1].rsplit(" (", 1)[0] for line in lines
                 if line.startswith("Also estimated to fit: ")]
    assert all(_named(label, lines) == 1 for label in suggested), lines
    assert not any(line.startswith(("Estimated to fit, outside", "Next: estimated to fit")) for line in lines)
    assert lines[lines.index("Next: try the best:") + 1].startswith("  memlab estimate llama-7b --batch 1x512 ")
    # one unit per column: the header says GiB, no cell carries a unit, no speed columns of dashes
    table = lines[lines.index(plain_row[0]) - 1]
    assert "peak GiB" in table and "card GiB" in table and "samples/s" not in table and "time/step" not in table
    assert not re.search(r"[KMG]iB", plain_row[0])
    # the notes: numbered sentences, none about how CUDA was emulated, and the --gpu that matches the budget
    notes = _notes(lines)
    assert 1 <= len(notes) <= 4 and not any(line.startswith("Note:") for line in lines), notes
    assert all(re.match(r"\d+\. [A-Za-z].*\.$", note) for note in notes), notes
    assert not any("emulated" in note or "reserved_bytes" in note for note in notes), notes
    assert any("--gpu RTX4090-24GB" in note for note in notes), notes


def test_gpt2_on_the_fewest_gpus_says_the_budget_the_best_and_what_it_searched(
    gpt2_auto: tuple[int, list[str]],
) -> None:
    status, lines = gpt2_auto
    assert all(len(line) <= WIDTH for line in lines), max(lines, key=len)
    header = lines[0]
    assert header.startswith("gpt2: GPT2LMHeadModel, per-GPU batch 1x512, --gpus auto") and "8.00 GiB" in header
    assert lines[1].startswith("Best: ")
    table_end = next(i for i, line in enumerate(lines) if line.startswith("Where the peak goes, per GPU ("))
    assert re.fullmatch(r"Where the peak goes, per GPU \((MiB|GiB)\):", lines[table_end])  # one unit for it all
    rows = [line.split() for line in lines[2:table_end] if line.startswith(" plain ")]
    # each strategy once in the table, and once as a column of where its peak goes
    assert sorted(row[1] for row in rows) == ["fsdp2", "zero2", "zero3"], lines
    columns = lines[table_end + 1].split()
    assert columns[0] == "part" and len(set(columns[1:])) == len(columns) - 1 <= 3, columns
    parts = [line.split() for line in lines[table_end + 2:] if line.strip()][:8]
    assert {"sharded_params", "optimizer", "activations"} <= {row[0] for row in parts}, lines
    for row in rows:  # a verdict or, where none fits, a numbered reason
        assert row[-1] in ("figure)", "peak)") or re.fullmatch(r"\[\d+\]", row[-1]), row
    searched = " ".join(line for line in lines if line.startswith("Searched: ") or "powers of two" in line)
    assert "powers of two" in searched, lines
    notes = _notes(lines)
    assert all(re.match(r"\d+\. [A-Za-z].*\.$", note) for note in notes), notes
    assert status == (0 if lines[1] != "Best: none fits" and not lines[1].startswith("Best: none") else 1)


def _depth(line: str) -> int:
    """How deep the parentheses of ``line`` nest."""
    depth = deepest = 0
    for char in line:
        depth += {"(": 1, ")": -1}.get(char, 0)
        deepest = max(deepest, depth)
    return deepest


def test_llama_7b_in_24_gib_says_the_gpu_and_the_budget_once_without_nested_parentheses(
    llama_7b: tuple[int, list[str]],
) -> None:
    """Issue 71 item 11: the H100-80GB was named three times (the header, the card note, the budget note), the budget
    three times (the header, the verdict, the budget note), and the Best line nested parentheses."""
    fitting = _run_answer(["estimate", "llama-7b", "--batch", "1x512", "--budget", "24GiB",
                    "--try", "precision=bf16", "weights=bf16", "adapter=lora"])
    for _, lines in (llama_7b, fitting):
        said = " ".join(line for line in lines if not line.startswith("  memlab "))
        assert "memlab knows" not in said and "T4-16GB" not in said  # no list of 14 GPU kinds in a note (issue 84)
        assert said.count("H100-80GB") == 1 and said.count("24.00 GiB") == 1, said
        answer = [line for line in lines if line.startswith(("Verdict: ", "Best: "))]
        assert len(answer) == 2 and all(_depth(line) <= 1 for line in answer), answer


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(llama_config_dir(tmp_path_factory.mktemp("llama_128"), 128, heads=4, vocab=1024))


def test_max_tokens_says_the_budgets_once_and_the_answer_names_the_host(config_dir: Path) -> None:
    status, out, _ = _run(["estimate", str(config_dir), "--batch", "1x64", "--budget", "2GiB", "--host-budget",
                           "3GiB", "--max-tokens"])
    assert status in (0, 1), out
    header, *rest = out.splitlines()
    assert "budget 2GiB = 2.00 GiB" in header and "host budget 3.00 GiB" in header, out
    assert out.count("2.00 GiB") == 1 and out.count("3.00 GiB") == 1, out
    answer = next(line for line in rest if line.startswith(("at most", "nothing fits")))
    assert "the budget and the host budget" in answer, out


LORA = ["--try", "precision=bf16", "weights=bf16", "adapter=lora"]


@pytest.fixture(scope="module")
def verdicts_config_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(llama_config_dir(tmp_path_factory.mktemp("llama_256"), 256, heads=4, vocab=1024))


@pytest.mark.slow
def test_max_tokens_judges_and_names_the_card_figure_of_the_same_plan(verdicts_config_dir: Path) -> None:
    """Item 1: --max-tokens showed a "peak" that was a card figure, and not the one the plan's own estimate gives
    (it dry-ran the meta model, loaded in fp32 and cast, where the estimate loads the config as the plan implies)."""
    command = ["estimate", str(verdicts_config_dir), "--batch", "1x64", "--budget", "1GiB", *LORA]
    status, out, _ = _run([*command, "--json"])
    assert status == 0
    (trial,) = json.loads(out)["trials"]
    status, out, _ = _run([*command, "--max-tokens", "--json"])
    assert status == 0
    tried = {size: figure for size, _, figure in json.loads(out)[0]["tried"]}
    assert tried[64] == trial["card_bytes"] != trial["peak_bytes"]
    status, out, _ = _run([*command, "--max-tokens"])
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("tokens "))
    assert header.split()[:2] == ["tokens", "card"] and "peak" not in header, out
    assert any(line.startswith("card: the allocator's reserve + the CUDA context") for line in lines), out


@pytest.mark.parametrize(("item", "owner"), [("precompute_ref=on", "DPOTrainer"), ("vllm_memory=0.3", "GRPOTrainer"),
                                             ("vllm_sleep=on", "GRPOTrainer")])
def test_a_trainers_own_setting_is_refused_up_front_and_not_offered(
    verdicts_config_dir: Path, item: str, owner: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 2: --try precompute_ref=on ran, printed an error row and "1 plan estimated", and exited 0."""
    estimate_module = importlib.import_module("memlab.estimation.estimate")

    def never(*args: object, **keywords: object) -> None:
        raise AssertionError("a refused setting reached a dry run")

    monkeypatch.setattr(estimate_module, "estimate_plans", never)
    status, out, err = _run(["estimate", str(verdicts_config_dir), "--device", "cpu", "--try", item])
    key = item.split("=")[0]
    assert status == 2 and out == "", out
    line = " ".join(err.split())  # one message, wrapped to the answer's width
    assert line.startswith(f"memlab estimate: {key} is a setting of a TRL {owner}"), line
    asked = levers_asked()[key]  # the command's own trainer question, not Python (issue 84, item 5)
    assert f"ask the trainer's question: memlab estimate {verdicts_config_dir} {asked}" in line, line
    assert all(len(text) <= 120 for text in err.splitlines()), err
    status, out, _ = _run(["estimate", "--help"])
    assert status == 0
    said = " ".join(out.split())
    settings = said.split("The settings")[1].split("Not here:")[0]
    assert "precision=fp32 | bf16 | fp16" in settings and f"{key}=" not in settings, settings
    assert key in said.split("Not here:")[1] and asked in said.split("Not here:")[1]


def _error_trial(plan: object, **more: object) -> object:
    from memlab.report import Trial

    return Trial(plan, "error", 0, {}, None, None, None, "cuda", error="RuntimeError: boom", estimated=True,
                 **more)


def test_every_error_row_makes_the_exit_status_non_zero(verdicts_config_dir: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 2: an error row (dashes in every column) exited 0 as if the table were whole: on one GPU, with --gpus,
    with --max-tokens, judged on a host budget or none."""
    estimate_module = importlib.import_module("memlab.estimation.estimate")
    from memlab.estimation.sharded import per_gpu
    from memlab.estimation.sharded.fsdp2 import ShardedTrial
    from memlab.frontends.cli.errors import EXIT_FAILED
    from memlab.report import Report

    def estimate_plans(model: object, batch: object, plans: list[object], **keywords: object) -> Report:
        return Report([_error_trial(plan) for plan in plans], budget=keywords.get("budget"))

    monkeypatch.setattr(estimate_module, "estimate_plans", estimate_plans)
    folder = str(verdicts_config_dir)
    for more in ([], ["--budget", "1GiB"], ["--host-budget", "64GiB"], ["--json"]):
        status, out, _ = _run(["estimate", folder, *more])
        assert status == EXIT_FAILED, (more, out)
    status, out, _ = _run(["estimate", folder])
    verdict = next(line for line in out.splitlines() if line.startswith("Verdict:"))  # the header may wrap
    assert "could not be estimated" in verdict and "1 plan estimated" not in out, out

    def sharded_trials(model: object, batch: object, plans: list[object], **keywords: object) -> list[object]:
        return [(plan, "zero3", ShardedTrial(plan, "error", 0, {}, None, None, None, "cuda", gpus=2, strategy="zero3",
                                             error="RuntimeError: boom")) for plan in plans]

    monkeypatch.setattr(per_gpu, "sharded_trials", sharded_trials)
    for more in ([], ["--json"], ["--budget", "80GiB"]):
        status, out, _ = _run(["estimate", folder, "--gpus", "2", *more])
        assert status == EXIT_FAILED, (more, out)

    def estimate(model: object, batch: object, plan: object, **keywords: object) -> object:
        return _error_trial(plan, budget=keywords.get("budget"))

    monkeypatch.setattr(estimate_module, "estimate", estimate)
    status, out, _ = _run(["estimate", folder, "--budget", "1GiB", "--max-tokens"])
    assert status == EXIT_FAILED and "RuntimeError: boom" in out, out


def _statuses(out: str) -> dict[str, str]:
    rows = {}
    for line in out.splitlines():
        found = re.match(r"^\W*(offload-\S+)\s+(does not fit \([^)]*\)|ok \(estimate\))", line)
        if found:
            rows[found.group(1)] = found.group(2)
    return rows


@pytest.mark.parametrize(("budget", "host", "status"), [("20MiB", "1MiB", "does not fit (over budget and host)"),
                                                        ("4GiB", "1MiB", "does not fit (host)"),
                                                        ("20MiB", "4GiB", "does not fit (over budget)")])
def test_a_refusing_status_says_which_budget_and_the_table_keeps_within_120_columns(
    verdicts_config_dir: Path, budget: str, host: str, status: str
) -> None:
    """Item 3: plans over the host budget (and the GPU's) said only "does not fit (over budget)", in a table that
    wrapped past 120 columns."""
    command = ["estimate", str(verdicts_config_dir), "--batch", "1x64", "--budget", budget, "--host-budget", host,
               "--try", "offload=optimizer,all"]
    code, out, _ = _run(command)
    assert code == 1
    assert _statuses(out) == {"offload-optimizer": status, "offload-all": status}, out
    said = [line for line in out.splitlines() if not line.startswith("  memlab estimate ")]  # commands stay whole
    assert all(len(line) <= 120 for line in said), max(said, key=len)
    code, out, _ = _run([*command, "--json"])
    assert {row["verdict"] for row in json.loads(out)["trials"]} == {status}


def test_a_zero_beside_less_than_a_hundredth_is_said_to_be_none_at_all(verdicts_config_dir: Path) -> None:
    """Item 5: a bare 0 (LoRA's grads, offload's optimizer state at the peak) beside "< 0.01" read as a small figure
    rounded down; the notes say which cells are none at all."""
    # On the CPU: a CUDA estimate's other holds cuBLAS's workspaces (64 MiB on the H100), no sliver.
    code, out, _ = _run(["estimate", str(verdicts_config_dir), "--batch", "1x64", "--device", "cpu", "--json", *LORA])
    (trial,) = json.loads(out)["trials"]
    assert trial["grads_bytes"] == 0 < trial["other_bytes"], trial  # the case: none at the peak, beside a sliver
    code, out, _ = _run(["estimate", str(verdicts_config_dir), "--batch", "1x64", "--device", "cpu", *LORA])
    lines = out.splitlines()
    header = next(number for number, line in enumerate(lines) if line.split()[:2] == ["plan", "status"])
    names = re.findall(r"(\w+) [KMG]iB", lines[header])
    cells = dict(zip(names, lines[header + 1].split("ok (estimate)")[1].replace("< ", "<").split(), strict=True))
    assert cells["grads"] == "0" and cells["other"] == "<0.01", (cells, out)
    note = " ".join(" ".join(lines[lines.index("Notes:"):]).split())
    assert "A 0 in a memory column is none at all at the peak" in note and "grads" in note.split("peak")[-1], note


def test_the_host_budgets_table_keeps_within_120_columns() -> None:
    """Item 3: llama-7b's offload plans judged on a 64 GiB host budget (116 and 157 GiB of host memory, card figures
    of 57 and 53 GiB) printed a table of 141 columns: the unit goes above the table once where every header's is too
    wide."""
    from memlab.frontends.cli.estimate.text import WIDTH, table_lines
    from memlab.plan import Plan
    from memlab.report import Report, Trial

    gib = 2**30
    trials = [Trial(Plan(offload=offload), "ok", int(50.3 * gib),
                     {"params": int(25.1 * gib), "grads": int(24.6 * gib), "activations": gib // 2, "other": 8196},
                     None, None, None, "cuda", budget=24 * gib, reserved_bytes=int(56.5 * gib), context_bytes=2**29,
                     host_bytes=host * gib, host_budget=64 * gib, estimated=True)
              for offload, host in (("optimizer", 116), ("all", 157))]
    lines = table_lines(Report(trials, budget=24 * gib), timed=False)
    assert max(map(len, lines)) <= WIDTH, "\n".join(lines)
    assert lines[0] == "Memory in GiB:" and lines[1].split()[2:6] == ["peak", "card", "host", "params"], lines
    assert "does not fit (over budget and host)" in lines[2], lines


def test_bf16_weights_with_qlora_load_the_weights_not_quantized_in_bf16_as_the_name_says(
        verdicts_config_dir: Path) -> None:
    """Item 4: "bf16 bf16-weights qlora" was estimated from a load whose note said the weights not quantized load in
    torch.float32, with a from_pretrained line without a dtype: the name, the note and the line now agree."""
    code, out, _ = _run(["estimate", str(verdicts_config_dir), "--batch", "1x64", "--json",
                         "--try", "precision=bf16", "weights=bf16", "adapter=qlora"])
    (trial,) = json.loads(out)["trials"]
    assert trial["label"] == "bf16 bf16-weights qlora"
    (note,) = [note for note in trial["notes"] if note.startswith("weights materialised as from_pretrained(")]
    assert note.startswith("weights materialised as from_pretrained(name, dtype=torch.bfloat16, "
                           "quantization_config=BitsAndBytesConfig(load_in_4bit=True"), note
    assert "float32" not in note, note
    code, out, _ = _run(["estimate", str(verdicts_config_dir), "--batch", "1x64", "--json", "--try", "adapter=qlora"])
    (plain_qlora,) = json.loads(out)["trials"]  # without weights=bf16: transformers' own dtype, said as such
    assert not any("from_pretrained(name, dtype=" in note for note in plain_qlora["notes"]), plain_qlora["notes"]


def test_gpus_auto_says_which_figure_judged_each_strategy_and_why_zero_has_no_card_figure(
    verdicts_config_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 6: --gpus auto judged ZeRO-3 on its allocated peak and FSDP2 on its card figure in one table, without a
    word on why ZeRO-3 has no card figure."""
    from memlab.estimation.sharded import per_gpu
    from memlab.estimation.sharded.fsdp2 import ShardedTrial

    gib = 2**30

    def sharded_trials(model: object, batch: object, plans: list[object], **keywords: object) -> list[object]:
        budget = keywords.get("budget")
        fsdp2 = ShardedTrial(plans[0], "ok", 30 * gib, {"activations": 30 * gib}, None, None, None, "cuda", gpus=4,
                             strategy="fsdp2", budget=budget, reserved_bytes=33 * gib, context_bytes=gib // 2)
        zero3 = ShardedTrial(plans[0], "ok", 29 * gib, {"activations": 29 * gib}, None, None, None, "cuda", gpus=4,
                             strategy="zero3", budget=budget, context_bytes=gib // 2)
        return [(plans[0], "fsdp2", fsdp2), (plans[0], "zero3", zero3)]

    monkeypatch.setattr(per_gpu, "sharded_trials", sharded_trials)
    status, out, _ = _run(["estimate", str(verdicts_config_dir), "--gpus", "auto", "--budget", "80GiB"])
    assert status == 0
    lines = out.splitlines()
    rows = {line.split()[1]: line for line in lines if line.startswith(" plain ")}
    assert rows["fsdp2"].endswith("fits (card figure)"), rows
    marker = re.search(r"fits \(allocated peak\) \[(\d+)\]$", rows["zero3"])
    assert marker, rows
    note = " ".join(" ".join(lines[lines.index("Notes:") + 1:]).split())
    said = note.split(f"{marker.group(1)}. ")[1]
    assert said.startswith("ZeRO-3 is judged on its allocated peak, the other strategies on the card figure: "), said
    assert "not a traced step" in said.split(". ")[0] and "CUDA context, 512.0 MiB" in said, said


def test_the_sharded_answer_says_the_budget_once_too() -> None:
    """Item 11's neighbour: --gpus auto said the budget in its header, its Best line and each strategy's reason."""
    import argparse

    from memlab.frontends.cli.estimate.text import sharded_text
    from memlab.plan import Plan

    args = argparse.Namespace(gpu="A100-40GB", device=None, gpus="auto")
    rows = [(Plan(), strategy, None) for strategy in ("fsdp2", "zero2", "zero3")]
    lines = sharded_text(args, "tiny: --gpus auto, for an A100-40GB, budget 1GiB = 1.00 GiB", rows, 2**30, [],
                         weights_bytes={"plain": 2**31})
    said = " ".join(lines)
    assert said.count("1.00 GiB") == 1 and said.count("budget") == 5, lines  # the header, Best, the three reasons
    assert lines[1] == "Best: none fits the budget on up to 1024 GPUs."


@pytest.mark.slow
def test_max_tokens_judges_the_host_budget_too_and_says_which_budget_refused(verdicts_config_dir: Path) -> None:
    """Item 3's neighbour: --max-tokens left --host-budget out (every size judged on the GPU's budget alone)."""
    command = ["estimate", str(verdicts_config_dir), "--batch", "1x64", "--budget", "4GiB", "--try", "offload=all",
               "--max-tokens"]
    code, out, _ = _run([*command, "--json"])
    (alone,) = json.loads(out)
    code, out, _ = _run([*command, "--json", "--host-budget", "60MiB"])
    (hosted,) = json.loads(out)
    assert 0 < hosted["value"] < alone["value"], (hosted, alone)
    code, out, _ = _run([*command, "--host-budget", "60MiB"])
    refused = [line for line in out.splitlines() if re.match(r"\d+ ", line) and " no" in line]
    assert refused and all(" no (host)" in line for line in refused), out


def test_where_the_peak_goes_says_a_zero_is_none_at_all() -> None:
    """Item 5's neighbour: --gpus' "where the peak goes" shows ZeRO-2's sharded parameters as 0 beside the inputs'
    "< 0.01"."""
    import argparse

    from memlab.estimation.sharded.fsdp2 import ShardedTrial
    from memlab.frontends.cli.estimate.text import sharded_text
    from memlab.plan import Plan

    detail = {"sharded_params": 0, "unsharded_params": 2**30, "inputs": 4096}
    zero2 = ShardedTrial(Plan(), "ok", 2**30 + 4096, {"params": 2**30 + 4096}, None, None, None, "cuda", gpus=2,
                         strategy="zero2", detail=detail)
    lines = sharded_text(argparse.Namespace(gpu=None, device=None, gpus="2"), "tiny", [(Plan(), "zero2", zero2)],
                         None, [])
    assert any(line.split() == ["sharded_params", "0"] for line in lines), lines
    said = " ".join(" ".join(lines).split())
    assert "A 0 under where the peak goes is none at all at the peak, not a small figure rounded" in said, lines
