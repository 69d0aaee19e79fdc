"""The ``%%memfit`` line's usage errors: one line that names the fix (:func:`usage_error`), argparse's complaints
said as what to write (:func:`line_sentence`), and the slips people make, caught before argparse's reading would
hide them: a space before a size's unit (``--budget 8 GiB`` -> ``--budget 8GiB``), a ``--try`` grid written with
spaces or colons (:func:`grid_slip`), an option misspelt or autocorrected into a dash, a run option's error in the
magic's own words (:func:`as_options`).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import Any

from IPython.core.error import UsageError

from memlab.frontends.cli.errors import EXAMPLES, sentence
from memlab.options import RunOptions
from memlab.plan import LEVERS_LISTED
from memlab.search import MAX_TRIALS

__all__ = ["USAGE", "as_options", "at_least_one", "grid_slip", "line_sentence", "usage_error"]

_DEFAULTS = RunOptions()


def usage_error(message: str) -> UsageError:
    """A UsageError whose message is exactly one line.

    Example:
        >>> str(usage_error("two\\nlines"))
        'two lines'
        >>> str(usage_error("fit needs a budget; write for example budget='8GiB'"))
        'fit needs a budget; write for example --budget 8GiB'
    """
    text = " ".join(str(message).split()).replace(LEVERS_LISTED, "%%memfit?")
    # the core's errors show a Python keyword (budget='8GiB'); a magic's line writes --budget 8GiB
    return UsageError(re.sub(r"\bbudget='([^']*)'", r"--budget \1", text))


USAGE = (
    "write %%memfit MODEL BATCH [--try KEY=V1,V2 ...] [--budget SIZE] [--batch-size N] [--steps N] "
    "[--warmup N] [--noise F] [--time-limit S] [--lr LR] [--search] [--apply] [--dry-run [--gpus N|auto] "
    "[--strategy fsdp1|fsdp2|zero2|zero3]] [--inference] [--quiet] [--verbose]; "
    "%%memfit? shows the help"
)
"""What the one-line error of an unreadable line ends with."""


def line_sentence(magic: Any, message: str, tokens: list[str]) -> str:
    """argparse's complaint about a ``%%memfit`` line (split into ``tokens``) as one sentence that says what to
    write.

    Example:
        >>> from memlab.frontends.jupyter.magic.parse import memfit_arguments
        >>> def memfit(line):
        ...     "Measure plans."
        >>> magic = memfit_arguments(memfit)
        >>> line_sentence(magic, "unrecognized arguments: GiB", ["m", "b", "--budget", "8", "GiB"])
        '--budget takes the size with its unit and no space between them; write --budget 8GiB'
        >>> line_sentence(magic, "unrecognized arguments: --bugdet", ["m", "b", "--bugdet", "8GiB"])
        '%%memfit has no option --bugdet; write --budget'
    """
    wrong_type = _WRONG_TYPE.search(message)
    if wrong_type is not None:
        return _wrong_type_sentence(*wrong_type.groups())
    if re.search(r"required: MODEL", message):
        return "MODEL is missing; write the names of your model and batch, e.g. %%memfit model batch"
    parser = getattr(magic, "parser", None)
    unknown = re.match(r"unrecognized arguments: (.*)", message)
    if parser is not None and unknown:
        extra = unknown.group(1).split()
        options = _options(parser)
        if extra[0].startswith("-") and extra[0].lstrip("-"):
            return _unknown_option_sentence(extra[0].split("=")[0], options)
        return _stray_value_sentence(parser, tokens, extra, options)
    expected = re.match(r"argument (--[a-z-]+): expected one argument", message)
    if expected and expected.group(1) in tokens:
        after = tokens[tokens.index(expected.group(1)) + 1:]
        if after and re.fullmatch(r"-[0-9.].*", after[0]):  # argparse reads '-1GiB' as an option
            option = expected.group(1)
            return f"{option} {after[0]} is negative; write a positive value, e.g. {option} {EXAMPLES.get(option, 1)}"
    if parser is not None and re.match(r"argument [^:]+: (expected|invalid choice)", message):
        return sentence(parser, message)
    return f"{message.rstrip('.')}; {USAGE}"


def _options(parser: Any) -> list[str]:
    """The magic's options, as written on the line (``--budget``...)."""
    return [name for action in parser._actions for name in action.option_strings if name.startswith("--")
            and name != "--help"]


def _unknown_option_sentence(name: str, options: list[str]) -> str:
    """``--foo`` -> the nearest option, else those the name begins like, else the list of every option."""
    spelt = "--" + name.lstrip("-\u2013\u2014").lower().replace("_", "-")
    near = [spelt] if spelt in options else difflib.get_close_matches(spelt, options, n=1, cutoff=0.7)
    if not near:
        near = [option for option in options if option.startswith(spelt[:3])] if len(spelt) > 2 else []
    if near:
        return f"%%memfit has no option {name}; write {_either(near)}"
    return f"%%memfit has no option {name}; write one of {_either(options)} (%%memfit? says what each does)"


def _stray_value_sentence(parser: Any, tokens: list[str], extra: list[str], options: list[str]) -> str:
    """A value argparse did not take (``GiB`` in ``--budget 8 GiB``), said with what the user meant: the value
    joined to its option's, the option it misspelt, or the option it should follow."""
    stray = extra[0]
    where = _last_index(tokens, stray)
    before = tokens[:where]
    owner = next((token for token in reversed(before) if token.startswith("-")), None)
    bare = stray.lstrip("-\u2013\u2014")
    if stray != bare or owner == "--":  # '\u2014budget' (a notebook's autocorrect), '-- budget'
        written = "--" + bare.lower().replace("_", "-")
        if written in options:
            given = stray if stray != bare else f"-- {bare}"
            return f"%%memfit has no {given}; write {written} (two hyphens, no space)"
    if owner is None or owner == "--":
        if _SIZE.fullmatch(stray):
            return f"%%memfit takes MODEL and BATCH, then options; write --budget {stray} for a budget"
        named = "--" + bare.lower().replace("_", "-")
        if named in options:
            return f"{stray!r} reads as a third name; write {named} (options begin with two hyphens)"
        return (f"%%memfit takes two names, MODEL and BATCH, then options; drop {stray!r} or write the option it is "
                f"for, e.g. %%memfit model batch --budget 8GiB")
    action = next((action for action in parser._actions if owner in action.option_strings), None)
    if action is not None and action.nargs == 0:
        return f"{owner} takes no value; write {owner} alone, without {stray!r}"
    value = before[-1] if before and before[-1] != owner else ""
    if owner == "--budget" and _UNIT.fullmatch(stray) and re.fullmatch(r"[0-9.]+", value):
        return f"--budget takes the size with its unit and no space between them; write --budget {value}{stray}"
    return f"{owner} takes one value; write {owner} {value or EXAMPLES.get(owner, 'VALUE')} and drop {stray!r}"


def _either(names: list[str]) -> str:
    return ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else "".join(names)


_UNIT = re.compile(r"(?i)[kmgt]i?b?|b(ytes?)?")
"""A size's unit written on its own (``GiB``, ``GB``, ``G``)."""

_SIZE = re.compile(r"(?i)[0-9.]+\s*(?:[kmgt]i?b?|b)")
"""A size with its unit (``8GiB``)."""


def _last_index(tokens: list[str], value: str) -> int:
    """Where ``value`` stands among ``tokens`` (argparse reports leftovers in order, the last one standing)."""
    found = [index for index, token in enumerate(tokens) if token == value]
    return found[0] if found else len(tokens)


def grid_slip(grid: list[str]) -> str | None:
    """A ``--try`` grid with a space or a colon where ``KEY=V1,V2`` has none (``precision fp32``,
    ``precision=fp32, bf16``, ``precision:bf16``): the sentence that writes it joined; None when each item is
    already ``KEY=...`` or when joining would not make it so (the grid's own parser then says what is wrong).

    Example:
        >>> grid_slip(["precision=fp32,", "bf16"])
        '--try precision=fp32, bf16 has a space or a colon where KEY=V1,V2 has none; write --try precision=fp32,bf16'
        >>> grid_slip(["precision=fp32,bf16"]) is None
        True
    """
    items = [item.replace(":", "=", 1) if "=" not in item and ":" in item else item for item in grid]
    joined: list[str] = []
    for item in items:
        previous = joined[-1] if joined else ""
        if joined and (previous.endswith((",", "=")) or item.startswith((",", "=")) or "=" not in previous
                       or "=" not in item and "=" in previous and not re.fullmatch(r"[A-Za-z_]\w*", item)):
            joined[-1] = previous + (item if previous.endswith(("=", ",")) or item.startswith(("=", ","))
                                     or "=" in previous else "=" + item)
        else:
            joined.append(item)
    shaped = all(re.fullmatch(r"[A-Za-z_]\w*=[^=\s]*[^=,\s]", item) for item in joined)
    if joined == grid or not shaped:
        return None
    return (f"--try {' '.join(grid)} has a space or a colon where KEY=V1,V2 has none; write --try "
            f"{' '.join(joined)}")


_WRONG_TYPE = re.compile(r"argument (--[a-z-]+): invalid (int|float) value: '(.*)'")
"""argparse's error for a value of the wrong type: the option, the type, the value."""

_EXAMPLES = {"--batch-size": 8, "--max-trials": MAX_TRIALS, "--steps": _DEFAULTS.steps, "--warmup": _DEFAULTS.warmup,
             "--noise": _DEFAULTS.noise, "--time-limit": _DEFAULTS.time_limit, "--lr": _DEFAULTS.lr}


def _wrong_type_sentence(option: str, kind: str, value: str) -> str:
    """``--steps many`` -> ``--steps 'many' is not a whole number; write for example --steps 3``."""
    what = "a whole number" if kind == "int" else "a number"
    example = _EXAMPLES.get(option, 1)
    return f"{option} {value!r} is not {what}; write for example {option} {example:g}"


def as_options(message: str, keywords: Mapping[str, Any]) -> str:
    """A run option's error in the magic's own words: ``steps=0 is not allowed; write a whole number >= 1`` ->
    ``--steps 0 is not allowed; write a whole number >= 1, e.g. --steps 3``.

    Example:
        >>> as_options("time_limit=0.0 is not allowed; write seconds such as time_limit=10", {"time_limit": 0.0})
        '--time-limit 0.0 is not allowed; write seconds such as --time-limit 10'
    """
    for key in keywords:
        option = "--" + key.replace("_", "-")
        written = re.sub(rf"\b{key}='?([^\s',;)]+)'?", rf"{option} \1", message)
        if written != message:
            fix = written.split(";", 1)[-1]
            return written if option in fix else f"{written}, e.g. {option} {EXAMPLES.get(option, 1)}"
    return message


def at_least_one(args: Any) -> None:
    """``--batch-size`` and ``--max-trials`` are counts of at least one; a one-line UsageError if not.

    Example:
        >>> from types import SimpleNamespace
        >>> at_least_one(SimpleNamespace(batch_size=0, max_trials=None))
        Traceback (most recent call last):
        ...
        IPython.core.error.UsageError: --batch-size 0 is not allowed; write a whole number >= 1, e.g. --batch-size 8
    """
    for option, value in (("--batch-size", args.batch_size), ("--max-trials", args.max_trials)):
        if value is not None and value < 1:
            raise usage_error(f"{option} {value} is not allowed; write a whole number >= 1, e.g. {option} "
                              f"{EXAMPLES[option]}")
