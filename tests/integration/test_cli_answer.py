"""Issue 61 item 3 (and item 4's presentation): ``memlab estimate`` answers in a short text to scan. The two
commands a new user runs first, run for real (dry runs of the real configs): the verdict and the best plan first,
each plan named once, one unit per column (no "< 1 MiB" in a GiB column), numbered notes that are sentences and only
those that change the reading, a ``--gpu`` where the budget is not the assumed GPU's memory, and every line within
120 columns. The checks are of structure, not of the figures (other work moves those).
"""

from __future__ import annotations

import contextlib
import io
import re

import pytest

from memlab.frontends.cli import main

WIDTH = 120


def _run(argv: list[str]) -> tuple[int, list[str]]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(argv)
    return status, out.getvalue().splitlines()


@pytest.fixture(scope="module")
def llama_7b() -> tuple[int, list[str]]:
    return _run(["estimate", "llama-7b", "--batch", "1x512", "--budget", "24GiB"])


@pytest.fixture(scope="module")
def gpt2_auto() -> tuple[int, list[str]]:
    return _run(["estimate", "gpt2", "--gpus", "auto", "--budget", "8GiB"])


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
    fitting = _run(["estimate", "llama-7b", "--batch", "1x512", "--budget", "24GiB",
                    "--try", "precision=bf16", "weights=bf16", "adapter=lora"])
    for _, lines in (llama_7b, fitting):
        said = " ".join(line for line in lines if not line.startswith("  memlab "))
        said = re.sub(r"\(memlab knows [^)]*\)", "", said)  # the list of the GPUs memlab knows
        assert said.count("H100-80GB") == 1 and said.count("24.00 GiB") == 1, said
        answer = [line for line in lines if line.startswith(("Verdict: ", "Best: "))]
        assert len(answer) == 2 and all(_depth(line) <= 1 for line in answer), answer
