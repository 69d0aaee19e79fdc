"""What a ``%%memfit`` cell writes into the notebook: nothing of the machine (no path, no home directory), and what
libraries said while it ran, once and short, never lost."""

from __future__ import annotations

import logging
import sys
import sysconfig
import types
import warnings
from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell
from IPython.testing import globalipapp
from models import mlp_batch, tiny_mlp

from memlab.live.quiet import collecting, quiet, without_paths

SITE = sysconfig.get_path("purelib")
HOME = str(Path.home())
CHATTY = f"""
import logging, warnings

def chatter():
    warnings.warn("weights cached in {HOME}/.cache/fakelib/blob.bin")
    logging.getLogger("bitsandbytes.fake_ops").warning(
        "Failed to load CPU gemm_4bit_forward from {SITE}/kernels/cpu.so")
    logging.getLogger("transformers.fake_tokens").error("could not read {SITE}/fake/tokenizer.json")
"""


@pytest.fixture()
def chatty_library() -> types.ModuleType:
    """A module of an installed library (its file lies in site-packages) that warns and logs with the machine's
    paths, as bitsandbytes and transformers do: a warning of a library memlab does not drive, the chatter of one
    it drives (bitsandbytes' log line below ERROR, kept out) and an error logged by one (shown)."""
    library = types.ModuleType("fakelib.ops")
    library.__file__ = f"{SITE}/fakelib/ops.py"
    exec(compile(CHATTY, library.__file__, "exec"), library.__dict__)
    sys.modules["fakelib.ops"] = library
    yield library
    sys.modules.pop("fakelib.ops", None)


@pytest.fixture()
def ipython() -> InteractiveShell:
    shell = globalipapp.get_ipython()
    shell.run_line_magic("load_ext", "memlab")
    shell.user_ns.update(mlp=tiny_mlp(blocks=1, width=8), pairs=mlp_batch(rows=4, width=8))
    return shell


def test_a_cell_shows_library_warnings_once_short_and_without_the_machine_s_paths(
    ipython: InteractiveShell, chatty_library: types.ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    ipython.user_ns["chatter"] = chatty_library.chatter
    with warnings.catch_warnings():
        warnings.simplefilter("default")  # as in a notebook: a library's UserWarning is shown
        report = ipython.run_cell_magic(
            "memfit", "mlp pairs --try checkpointing=off,on --steps 1 --warmup 1 --noise 0 --quiet",
            "chatter()\nx, y = pairs\nloss = (mlp(x).squeeze(-1) - y).pow(2).mean()",
        )
    assert [trial.status for trial in report] == ["ok", "ok"]
    captured = capsys.readouterr()
    shown = captured.out + captured.err
    assert HOME not in shown and SITE not in shown and "site-packages" not in shown
    lines = shown.splitlines()
    assert "Libraries' warnings while memlab ran (each once; --verbose shows them as they come):" in lines
    # Said once each (not once per plan and step), in short form, the file's name kept; the chatter kept out.
    assert [line for line in lines if "weights cached in" in line] == ["  fakelib: weights cached in blob.bin"]
    assert [line for line in lines if "could not read" in line] == ["  transformers: could not read tokenizer.json"]
    assert "gemm_4bit_forward" not in shown


def test_verbose_lets_the_libraries_speak_as_they_wrote(
    ipython: InteractiveShell, chatty_library: types.ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    ipython.user_ns["chatter"] = chatty_library.chatter
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ipython.run_cell_magic("memfit", "mlp pairs --steps 1 --warmup 1 --noise 0 --quiet --verbose",
                               "chatter()\nx, y = pairs\nloss = (mlp(x).squeeze(-1) - y).pow(2).mean()")
    assert any(f"{HOME}/.cache" in str(w.message) for w in caught)
    assert "Libraries' warnings" not in capsys.readouterr().out


def test_a_trial_error_that_names_a_file_keeps_only_its_name(ipython: InteractiveShell) -> None:
    body = f"open({HOME + '/no/such/folder/data.bin'!r})"
    report = ipython.run_cell_magic("memfit", "mlp pairs --steps 1 --warmup 1 --noise 0 --quiet", body)
    assert report.trials[0].status == "error"
    assert HOME not in report.trials[0].error and "data.bin" in report.trials[0].error


def test_outside_a_front_end_each_remark_is_said_once_per_process(caplog: pytest.LogCaptureFixture) -> None:
    library = {"__name__": "peft.tuners", "logging": logging, "warnings": warnings}
    with caplog.at_level(logging.WARNING, logger="memlab"):
        for _ in range(3):
            with quiet():
                exec("logging.getLogger('peft.tuners').warning('chatter kept out, 7f3a')", library)
                exec("warnings.warn('a change said once per process, 7f3a', FutureWarning)", library)
    said = [record.getMessage() for record in caplog.records if "7f3a" in record.getMessage()]
    assert said == ["memlab: a library warned while plans ran: peft: FutureWarning: a change said once per process, "
                    "7f3a"]


def test_collecting_restores_the_libraries_loggers() -> None:
    bnb = logging.getLogger("bitsandbytes")
    handlers, propagate, filters, level = list(bnb.handlers), bnb.propagate, list(bnb.filters), bnb.level
    # A library's warning is said where logging lets it through: what ran before in this process (a library that
    # set the root logger's level, say) must not decide, so the library's own logger is at WARNING for the test.
    bnb.setLevel(logging.WARNING)
    try:
        with collecting() as remarks, quiet():
            logging.getLogger("bitsandbytes.made_inside").warning("from a logger made inside the block")
    finally:
        bnb.setLevel(level)
    assert remarks.lines(everything=True) == ["bitsandbytes: from a logger made inside the block"]
    assert (bnb.handlers, bnb.propagate, bnb.filters) == (handlers, propagate, filters)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (f"{HOME}/models/llama/config.json not found", "config.json not found"),
        ("see https://huggingface.co/docs/peft/index for more", "see https://huggingface.co/docs/peft/index for more"),
        ("a ratio of 1/3 and and/or stay", "a ratio of 1/3 and and/or stay"),
        ("/usr/lib/python3/site-packages/torch/nn/module.py:1501: UserWarning", "module.py:1501: UserWarning"),
    ],
)
def test_without_paths(text: str, shown: str) -> None:
    assert without_paths(text) == shown


def test_where_warnings_are_errors_a_library_remark_does_not_end_a_trial() -> None:
    import memlab

    library = {"__name__": "transformers.fake_chatter", "warnings": warnings}
    exec("def chatter():\n    warnings.warn('use_cache=True is incompatible with gradient checkpointing')", library)

    def loss(model, batch):  # type: ignore[no-untyped-def]
        library["chatter"]()
        return model(batch[0]).pow(2).mean()

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trial = memlab.measure(tiny_mlp(blocks=1, width=8), mlp_batch(rows=4, width=8), memlab.Plan(), loss_fn=loss,
                               steps=1, noise=0)
    assert trial.status == "ok", trial.error
