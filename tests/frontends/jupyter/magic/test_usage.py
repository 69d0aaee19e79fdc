"""``%%memfit``'s usage errors (memlab.frontends.jupyter.magic.usage): each names the fix.

Every usage error of ``%%memfit`` names the fix: a list generated over the magic's declared options (each one
misspelt, given without its value, with two values, with a value of the wrong kind, negative, or, for a switch,
with a value) and the slips people make (a space before a size's unit, ``--try key value``, an unknown option, a
third name, an autocorrected dash). Each case runs the whole magic and expects the one-line UsageError to contain
the exact text to write.

Issue 71 item 14: ``%%memfit model batch --try nosuchknob=1`` answered with all 21 plan settings in one line. A
setting that is not one is said with the nearest ones ("did you mean ...") and where the whole list is, in the magic
and in ``memlab estimate --try`` alike (the message is made once, where a --try grid is read: memlab.plan)."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
from collections.abc import Iterator

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.testing import globalipapp
from models import lm_batch, tiny_gpt2
from test_magic import magic_shell, memfit

from memlab.frontends.cli.errors import EXAMPLES
from memlab.frontends.cli.main import main
from memlab.frontends.jupyter.magic.parse import memfit_arguments
from memlab.plan import PLAN_FIELDS

LINE = "model batch"


def _parser() -> argparse.ArgumentParser:
    def memfit(line: str) -> None:
        """The magic."""

    parser: argparse.ArgumentParser = memfit_arguments(memfit).parser  # type: ignore[attr-defined]
    return parser


def _options() -> list[tuple[str, bool, type | None]]:
    """Each declared option: its name, whether it takes a value, its value type."""
    return [
        (action.option_strings[0], action.nargs != 0, action.type if callable(action.type) else None)
        for action in _parser()._actions if action.option_strings and action.option_strings[0] != "-h"
    ]


def _cases() -> list[tuple[str, str, str]]:
    """(id, line, text the error must contain)."""
    cases: list[tuple[str, str, str]] = []
    for option, takes_value, kind in _options():
        name = option[2:]
        value = "precision=bf16" if option == "--try" else EXAMPLES.get(option, "auto" if option == "--gpus" else "2")
        tail = f" {value}" if takes_value else ""
        if "-" in name:
            cases.append((f"{name}-underscore", f"{LINE} --{name.replace('-', '_')}{tail}", f"write {option}"))
        cases.append((f"{name}-capital", f"{LINE} --{name.capitalize()}{tail}", f"write {option}"))
        cases.append((f"{name}-one-dash", f"{LINE} -{name}{tail}", f"write {option}"))
        cases.append((f"{name}-dash-autocorrected", f"{LINE} \u2014{name}{tail}", f"write {option}"))
        cases.append((f"{name}-space-after-dashes", f"{LINE} -- {name}{tail}", f"write {option}"))
        cases.append((f"{name}-as-a-third-name", f"{LINE} {name}{tail}", f"write {option}"))
        if not takes_value:
            cases.append((f"{name}-given-a-value", f"{LINE} {option} yes", f"write {option} alone, without 'yes'"))
            continue
        cases.append((f"{name}-without-value", f"{LINE} {option}", f"write for example {option} "))
        if option != "--try":
            fix = f"write {option} {value} and drop"
            cases.append((f"{name}-two-values", f"{LINE} {option} {value} {value}x", fix))
        if kind in (int, float):
            cases.append((f"{name}-not-a-number", f"{LINE} {option} lots", f"; write for example {option} "))
            cases.append((f"{name}-negative", f"{LINE} {option} -3", f"{option}"))
    for unit in ("GiB", "GB", "MiB", "G"):
        cases.append((f"budget-space-before-{unit}", f"{LINE} --budget 8 {unit}", f"write --budget 8{unit}"))
    cases += [
        ("budget-negative", f"{LINE} --budget -1GiB", "write a positive value, e.g. --budget "),
        ("budget-without-unit", f"{LINE} --budget 24", "write the unit, such as 24GiB"),
        ("size-as-a-third-name", f"{LINE} 8GiB", "write --budget 8GiB"),
        ("unknown-option", f"{LINE} --foo", "write one of --try, --budget, --host-budget, --batch-size"),
        ("unknown-option-with-value", f"{LINE} --colour=red", "write one of --try, --budget"),
        ("misspelt-option", f"{LINE} --bugdet 8GiB", "write --budget"),
        ("short-option", f"{LINE} -b 8GiB", "write --budget or --batch-size"),
        ("third-name", f"{LINE} extra", "drop 'extra'"),
        ("try-key-space-value", f"{LINE} --try precision bf16", "write --try precision=bf16"),
        ("try-space-after-comma", f"{LINE} --try precision=fp32, bf16", "write --try precision=fp32,bf16"),
        ("try-space-after-equals", f"{LINE} --try precision= bf16", "write --try precision=bf16"),
        ("try-colon", f"{LINE} --try precision:bf16", "write --try precision=bf16"),
        ("try-two-keys-spaced", f"{LINE} --try precision fp32,bf16 checkpointing on",
         "write --try precision=fp32,bf16 checkpointing=on"),
        ("try-unknown-key", f"{LINE} --try colour=red", "nor near one; write one of those %%memfit? lists"),
        ("try-misspelt-key", f"{LINE} --try precison=bf16", "did you mean precision?"),
        ("try-unknown-value", f"{LINE} --try precision=fp64", "write one of fp32, bf16, fp16"),
        ("unclosed-quote", f'{LINE} --budget "8GiB', "close it"),
    ]
    return cases


CASES = _cases()


@pytest.fixture(scope="module")
def shell() -> Iterator[InteractiveShell]:
    ip = globalipapp.get_ipython()
    assert ip is not None
    ip.run_line_magic("load_ext", "memlab")
    saved = {name: ip.user_ns.get(name) for name in ("model", "batch")}
    ip.user_ns.update(model=tiny_gpt2(layers=1, width=16), batch=lm_batch(rows=2, length=8))
    yield ip
    ip.user_ns.update(saved)


def test_the_list_covers_every_option_of_the_declarations() -> None:
    options = {option for option, _, _ in _options()}
    assert options and all(any(f" {option}" in line for _, line, _ in CASES) for option in options)
    assert len(CASES) >= 100 and len({case for case, _, _ in CASES}) == len(CASES)


@pytest.mark.parametrize(("line", "fix"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_each_usage_error_names_the_fix(shell: InteractiveShell, line: str, fix: str) -> None:
    with pytest.raises(UsageError) as caught:
        shell.run_line_magic("memfit", line)
    message = str(caught.value)
    assert "\n" not in message and len(message) < 400, message
    assert fix in message, message
    assert re.search(r"\b(write|add|drop|close) ", message), message
    assert "lists the options" not in message and "%%memfit takes no value" not in message, message


@pytest.mark.parametrize("line", [f"{LINE} --try precompute_ref=on", f"{LINE} --try precompute_ref=on --dry-run",
                                  f"{LINE} --try vllm_sleep=on --dry-run",
                                  f"{LINE} --try vllm_memory=0.3 --budget 1GiB --search"])
def test_a_trainers_setting_on_a_model_is_one_usage_error(shell: InteractiveShell, line: str) -> None:
    """precompute_ref, vllm_memory and vllm_sleep are a built trainer's settings: on a model (not a Trainer as
    MODEL), refused before anything runs, with where they apply (the CLI's rule, refuse_trainer_levers)."""
    name = line.split("--try ")[1].split("=")[0]
    with pytest.raises(UsageError) as caught:
        shell.run_line_magic("memfit", line)
    message = str(caught.value)
    assert message.startswith(f"{name} is a setting of a TRL "), message
    assert "MODEL 'model' is a GPT2LMHeadModel" in message and f"or drop {name}" in message, message
    assert "\n" not in message and len(message) < 400, message


@pytest.fixture(scope="module")
def shell_magic_unknown_setting() -> Iterator[InteractiveShell]:
    yield from magic_shell()


def _cli_error(item: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert main(["estimate", "llama-7b", "--device", "cpu", "--try", item]) == 2
    lines = err.getvalue().strip().splitlines()
    assert lines[0].startswith("memlab estimate: ") and all(line.startswith("  ") for line in lines[1:]), lines
    return " ".join(" ".join(lines).split())  # one message, wrapped to the answer's width


def _listed(message: str) -> list[str]:
    """The plan settings a message names."""
    return [name for name in PLAN_FIELDS if name in message.replace("'", " ").split(" write ")[0].split()
            or f"{name}?" in message]


@pytest.mark.parametrize(("item", "meant"), [("nosuchknob=1", []), ("precison=bf16", ["precision"]),
                                             ("checkpoint=on", ["checkpointing"]), ("microbatch=2", ["micro_batch"])])
def test_an_unknown_setting_says_the_nearest_and_where_the_list_is(
    shell_magic_unknown_setting: InteractiveShell, item: str, meant: list[str]
) -> None:
    key = item.split("=")[0]
    with pytest.raises(UsageError) as caught:
        memfit(shell_magic_unknown_setting, f"model batch --try {item}")
    magic = str(caught.value)
    cli = _cli_error(item)
    for message, listed in ((magic, "%%memfit?"), (cli, "memlab estimate --help")):
        assert f"'{key}' is not a plan setting" in message, message
        assert message.endswith(f"write one of those {listed} lists, with their values"), message
        assert len(message) < 200 and _listed(message) == meant, message
        assert (f"did you mean {meant[0]}?" in message) if meant else ("nor near one" in message), message
