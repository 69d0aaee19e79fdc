"""Issue 71 item 14: ``%%memfit model batch --try nosuchknob=1`` answered with all 21 plan settings in one line. A
setting that is not one is said with the nearest ones ("did you mean ...") and where the whole list is, in the magic
and in ``memlab estimate --try`` alike (the message is made once, where a --try grid is read: memlab.plan).
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from test_magic import magic_shell, memfit

from memlab.frontends.cli import main
from memlab.plan import PLAN_FIELDS


@pytest.fixture(scope="module")
def shell() -> Iterator[InteractiveShell]:
    yield from magic_shell()


def _cli_error(item: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert main(["estimate", "llama-7b", "--device", "cpu", "--try", item]) == 2
    (line,) = err.getvalue().strip().splitlines()
    return line


def _listed(message: str) -> list[str]:
    """The plan settings a message names."""
    return [name for name in PLAN_FIELDS if name in message.replace("'", " ").split(" write ")[0].split()
            or f"{name}?" in message]


@pytest.mark.parametrize(("item", "meant"), [("nosuchknob=1", []), ("precison=bf16", ["precision"]),
                                             ("checkpoint=on", ["checkpointing"]), ("microbatch=2", ["micro_batch"])])
def test_an_unknown_setting_says_the_nearest_and_where_the_list_is(
    shell: InteractiveShell, item: str, meant: list[str]
) -> None:
    key = item.split("=")[0]
    with pytest.raises(UsageError) as caught:
        memfit(shell, f"model batch --try {item}")
    magic = str(caught.value)
    cli = _cli_error(item)
    for message, listed in ((magic, "%%memfit?"), (cli, "memlab estimate --help")):
        assert f"'{key}' is not a plan setting" in message, message
        assert message.endswith(f"write one of those {listed} lists, with their values"), message
        assert len(message) < 200 and _listed(message) == meant, message
        assert (f"did you mean {meant[0]}?" in message) if meant else ("nor near one" in message), message
