"""The command line's words (issue 48): Llama 3 8B by name, the built-in names listed for an unknown one, budget
units said plainly, a 4-bit error in the command's own flags, and "best" in --json."""

from __future__ import annotations

import json

import pytest

from memlab.errors import MemlabError
from memlab.estimation.configs import KNOWN_SHAPES, load_config
from memlab.frontends.cli import main
from memlab.frontends.estimate.text import json_with_verdicts
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

    from memlab.frontends.cli import main

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
