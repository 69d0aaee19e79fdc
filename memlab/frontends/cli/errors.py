"""The ``memlab`` command's argument errors: one sentence that says what to write, never argparse's own wording.

argparse says ``argument --steps: invalid int value: 'many'``, ``expected one argument``, ``invalid choice: ...
(choose from ...)`` or ``unrecognized arguments``; :class:`SentenceParser` turns each into a sentence that names
the option and shows a value to write (:data:`EXAMPLES`), and the value types here (:func:`whole_number`,
:func:`fraction`, :func:`seconds`) say it themselves: ``--steps must be a whole number of steps such as 3; got
'many'``. Each error is one line on stderr, ``memlab demo: error: <sentence>``, and the exit status is 2.
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

__all__ = ["DEFAULT_BATCH", "EXAMPLES", "EXIT_FAILED", "SentenceParser", "cli_words", "estimate_status", "fraction",
           "seconds", "sentence", "unknown_arguments", "whole_number"]

EXIT_FAILED = 3
"""The exit status when memlab itself failed (an exception that is no MemlabError), or, in ``memlab estimate``, a
plan could not be estimated (a row whose status is error): not "nothing fits" (1), not wrong input (2)."""


def estimate_status(*, fits: bool, judged: bool, errors: int) -> int:
    """``memlab estimate``'s exit status from its table, whatever the table (one GPU, ``--gpus``, ``--max-tokens``):
    :data:`EXIT_FAILED` where ``errors`` rows say error (a number the table could not give), else 0 where a plan
    ``fits`` or nothing was ``judged`` (no budget, GPU or host), else 1.

    Example:
        >>> estimate_status(fits=True, judged=True, errors=0), estimate_status(fits=False, judged=True, errors=0)
        (0, 1)
        >>> estimate_status(fits=False, judged=False, errors=0), estimate_status(fits=True, judged=True, errors=1)
        (0, 3)
    """
    if errors:
        return EXIT_FAILED
    return 0 if fits or not judged else 1


class _Default(str):
    """A default value that can be told apart from the same words typed: argparse keeps a default object as it is,
    and a typed string is never this object.

    Example:
        >>> DEFAULT_BATCH == "1x512", DEFAULT_BATCH is "1x512"[:]
        (True, False)
    """


DEFAULT_BATCH = _Default("1x512")
"""``memlab estimate --batch``'s default (``args.batch is DEFAULT_BATCH``: not typed)."""


EXAMPLES: dict[str, str] = {
    "--budget": "20MiB",
    "--batch-size": "8",
    "--steps": "3",
    "--html": "report.html",
    "--noise": "0.05",
    "--time-limit": "10",
    "--config": "llama-7b",
    "--batch": "1x512",
    "--try": "precision=fp32,bf16",
    "--gpus": "8",
    "--strategy": "fsdp2",
    "--device": "cuda",
    "--warmup": "1",
    "--lr": "1e-5",
    "--max-trials": "15",
    "MODEL": "llama-7b",
}
"""A value to show for each option in an error that says what to write (an option not listed shows its first
choice)."""


class WholeWords(argparse.HelpFormatter):
    """argparse's help, wrapped between words only: a setting with its values (``optimizer=adamw|adamw8bit|
    paged_adamw8bit``) or a name with hyphens stays whole on its line, never cut into two halves."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        import textwrap

        return textwrap.wrap(" ".join(text.split()), width, break_long_words=False, break_on_hyphens=False)


class SentenceParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one sentence on stderr that says what to write (:func:`sentence`), exit 2,
    and whose help breaks lines between words only (:class:`WholeWords`).

    Example:
        >>> import contextlib, io
        >>> parser = SentenceParser(prog="memlab demo")
        >>> _ = parser.add_argument("--steps", type=whole_number("--steps", "steps", 3))
        >>> err = io.StringIO()
        >>> with contextlib.redirect_stderr(err), contextlib.suppress(SystemExit):
        ...     parser.parse_args(["--steps", "many"])
        >>> err.getvalue()
        "memlab demo: error: --steps must be a whole number of steps such as 3; got 'many'\\n"
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", WholeWords)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {sentence(self, message)}\n")


def sentence(parser: argparse.ArgumentParser, message: str) -> str:
    """argparse's error ``message`` about ``parser``'s arguments, said as one sentence that says what to write.

    Example:
        >>> parser = argparse.ArgumentParser(prog="memlab estimate")
        >>> _ = parser.add_argument("--strategy", choices=("none", "fsdp2", "zero2", "zero3"))
        >>> choices = "(choose from 'none', 'fsdp2', 'zero2', 'zero3')"
        >>> sentence(parser, f"argument --strategy: invalid choice: 'zero9' {choices}")
        "--strategy must be one of none, fsdp2, zero2, zero3; got 'zero9'"
        >>> sentence(parser, "argument --strategy: expected one argument")
        '--strategy needs a value after it; write for example --strategy fsdp2'
    """
    message = " ".join(message.split())
    required = re.match(r"the following arguments are required: (.*)", message)
    if required:
        names = required.group(1)
        first = names.split(", ")[0]
        return f"{parser.prog} needs {names}; write for example {parser.prog} {EXAMPLES.get(first, first)}"
    unknown = re.match(r"unrecognized arguments: (.*)", message)
    if unknown:
        return unknown_arguments(parser, unknown.group(1).split())
    argument = re.match(r"argument ([^:]+?): (.*)", message)
    if not argument:
        return message
    option, rest = argument.group(1).split("/")[-1], argument.group(2)
    if rest.startswith(option):  # memlab's value types say it themselves
        return rest
    choices = _choices(parser, option)
    if rest.startswith("expected"):
        example = EXAMPLES.get(option) or (choices[0] if choices else "VALUE")
        return f"{option} needs a value after it; write for example {option} {example}"
    got = re.match(r"invalid choice: ('[^']*'|\S+)", rest)
    if got and option == "COMMAND":
        written = " or ".join(f"{parser.prog} {name}" for name in choices)
        return f"there is no command {got.group(1)}; write {written}"
    if got:
        return f"{option} must be one of {', '.join(choices)}; got {got.group(1)}"
    value = re.match(r"invalid (\w+) value: (.*)", rest)
    if value:
        kind = "a whole number" if value.group(1) == "int" else "a number"
        return f"{option} must be {kind} such as {EXAMPLES.get(option, '1')}; got {value.group(2)}"
    return f"{option}: {rest}"


def unknown_arguments(
    parser: argparse.ArgumentParser, extra: Sequence[str], *, options_hint: str | None = None, prog: str | None = None
) -> str:
    """The sentence for arguments ``parser`` (called ``prog``, default its own) does not take: the nearest option,
    or the options it has (or, where they are too many to list, ``options_hint``).

    Example:
        >>> parser = argparse.ArgumentParser(prog="memlab demo")
        >>> _ = parser.add_argument("--batch-size"); _ = parser.add_argument("--budget")
        >>> unknown_arguments(parser, ["--batchsize", "8"])
        'memlab demo has no option --batchsize; write --batch-size'
        >>> unknown_arguments(parser, ["8"])
        "memlab demo takes no value '8' here; write its options, --batch-size or --budget, each with its value"
    """
    options = [
        string for action in parser._actions for string in action.option_strings
        if string.startswith("--") and string not in ("--help", "--version")
    ]
    commands = [f"{parser.prog} {name}" for action in parser._actions
                if isinstance(action, argparse._SubParsersAction) for name in action.choices]
    listed = _either(options)
    first = extra[0]
    prog = prog or parser.prog
    if first.startswith("-"):
        name = first.split("=")[0]
        near = difflib.get_close_matches(name, options, n=1, cutoff=0.8)
        if near:
            return f"{prog} has no option {name}; write {near[0]}"
        if not options:
            return f"{prog} has no option {name}; write a command first, {_either(commands)}"
        return f"{prog} has no option {name}; " + (options_hint or f"write one of {listed}")
    if options_hint:
        return f"{prog} takes no value {first!r} here; {options_hint}"
    return f"{prog} takes no value {first!r} here; write its options, {listed}, each with its value"


def _either(names: Sequence[str]) -> str:
    return ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else "".join(names)


def whole_number(option: str, noun: str, example: int) -> Callable[[str], int]:
    """The value type of an option that takes a whole number >= 1 of ``noun``.

    Example:
        >>> whole_number("--batch-size", "rows", 8)("0")
        Traceback (most recent call last):
        ...
        argparse.ArgumentTypeError: --batch-size must be a whole number of rows of at least 1, such as 8; got 0
    """

    def read(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{option} must be a whole number of {noun} such as {example}; got {text!r}"
            ) from None
        if value < 1:
            raise argparse.ArgumentTypeError(
                f"{option} must be a whole number of {noun} of at least 1, such as {example}; got {value}"
            )
        return value

    return read


def fraction(option: str, example: str) -> Callable[[str], float]:
    """The value type of an option that takes a fraction from 0 up to (not including) 1.

    Example:
        >>> fraction("--noise", "0.05")("5")
        Traceback (most recent call last):
        ...
        argparse.ArgumentTypeError: --noise must be a fraction from 0 up to 1 such as 0.05 (that is 5%); got 5
    """
    percent = f"{float(example) * 100:g}%"
    return _number(option, f"a fraction from 0 up to 1 such as {example} (that is {percent})", lambda v: 0 <= v < 1)


def seconds(option: str, example: str) -> Callable[[str], float]:
    """The value type of an option that takes a positive number of seconds.

    Example:
        >>> seconds("--time-limit", "10")("0")
        Traceback (most recent call last):
        ...
        argparse.ArgumentTypeError: --time-limit must be a positive number of seconds such as 10; got 0
    """
    return _number(option, f"a positive number of seconds such as {example}", lambda v: 0 < v < float("inf"))


def _number(option: str, what: str, allowed: Callable[[float], bool]) -> Callable[[str], float]:
    """The value type of an option that takes a number for which ``allowed`` holds; ``what`` says which."""

    def read(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if value != value or not allowed(value):  # nan: not a number
            raise argparse.ArgumentTypeError(f"{option} must be {what}; got {text if value == value else repr(text)}")
        return value

    return read


def _choices(parser: argparse.ArgumentParser, option: str) -> list[str]:
    for action in parser._actions:
        if option in action.option_strings or option == action.metavar or option == action.dest:
            return [str(choice) for choice in (action.choices or ())]
    return []


_PYTHON_TO_FLAGS = (
    ("adapter='lora'", "--try adapter=lora"),
    ("adapter='qlora'", "--try adapter=qlora"),
    ("load_in_4bit=True", "--load-in-4bit"),
    ("load_in_8bit=True", "--load-in-8bit"),
    ("a load without quantization_config", "no --load-in-4bit / --load-in-8bit"),
    ("this load is load_in_8bit", "this load is --load-in-8bit"),
)


def cli_words(message: str) -> str:
    """A core error's message with its Python keywords as the command's flags, for a user of the command line.

    Example:
        >>> cli_words("a model loaded in nf4 trains adapters only; write adapter='lora' or adapter='qlora'")
        'a model loaded in nf4 trains adapters only; write --try adapter=lora or --try adapter=qlora'
    """
    from memlab.plan import LEVERS_LISTED

    for python, flag in (*_PYTHON_TO_FLAGS, (LEVERS_LISTED, "memlab estimate --help")):
        message = message.replace(python, flag)
    return message
