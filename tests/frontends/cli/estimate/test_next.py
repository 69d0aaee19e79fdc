"""Every command ``memlab estimate`` prints runs: the suggestions after a table where nothing fits, the "Not
searched" lines after ``--gpus auto``, and the commands those print in turn, each run through the command line's
``main()`` with real dry runs (a tiny Llama config saved as config.json, on the CPU). None ends in a traceback or a
refusal, and each exits as ``--help`` says: 0 where the line said the plan is estimated to fit, 0 or 1 otherwise.
And where memlab itself fails, the command line says so in one line with its own exit status, never a traceback.
"""

from __future__ import annotations

import contextlib
import io
import shlex
from pathlib import Path

import pytest
from models import llama_config_dir

from memlab.frontends.cli.main import EXIT_FAILED, build_parser, main

PROMPT = "memlab estimate "


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(llama_config_dir(tmp_path_factory.mktemp("tiny_llama"), 64, heads=2, vocab=256))


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(argv)
    return status, out.getvalue(), err.getvalue()


def _printed_commands(out: str) -> list[tuple[str, bool]]:
    """Each command an estimate printed, and whether its line says the plan is estimated to fit."""
    commands = []
    in_fitting = False
    for line in out.splitlines():
        if line.startswith(("Next: estimated to fit", "Next: try the best", "Also estimated to fit")):
            in_fitting = True
        elif not line.startswith("  "):
            in_fitting = False
        if PROMPT in line:
            commands.append((line[line.index(PROMPT):], in_fitting))
    return commands


@pytest.mark.slow
def test_every_command_an_estimate_prints_runs_and_exits_as_help_says(config_dir: Path) -> None:
    folder = shlex.quote(str(config_dir))
    # Nothing fits 1 MiB in the plain plan: the suggestions (bf16 weights, QLoRA...) and the --gpus auto command;
    # that one prints the pure bf16 and adapter commands, which crashed before (FSDP2's cast of fake weights).
    queue = [(f"memlab estimate {folder} --batch 2x16 --budget 1MiB --device cpu", False)]
    seen: set[str] = set()
    ran = []
    while queue:
        command, fits = queue.pop(0)
        if command in seen:
            continue
        seen.add(command)
        argv = shlex.split(command)
        assert argv[:2] == ["memlab", "estimate"]
        status, out, err = _run(argv[1:])
        ran.append(command)
        assert "Traceback" not in out + err, command
        assert status in ((0,) if fits else (0, 1)), f"{command} exited {status}: {err.strip().splitlines()[-1:]}"
        queue += _printed_commands(out)
    printed = " | ".join(ran)
    assert len(ran) >= 5, printed
    assert any("--gpus auto --try precision=bf16 weights=bf16" in command for command in ran), printed
    assert any("--try adapter=" in command for command in ran), printed


def test_an_unexpected_failure_is_one_line_with_its_own_exit_status(
    config_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memlab.estimation.sharded import per_gpu as sharded

    def broken(*args: object, **keywords: object) -> None:
        raise RuntimeError("_apply(): Couldn't swap Embedding.weight")

    monkeypatch.setattr(sharded, "sharded_trials", broken)
    monkeypatch.delenv("MEMLAB_TRACEBACK", raising=False)
    status, out, err = _run(["estimate", str(config_dir), "--gpus", "2", "--device", "cpu"])
    assert status == EXIT_FAILED and status not in (0, 1, 2)
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("memlab estimate: failed: RuntimeError: _apply(): Couldn't swap Embedding.weight.")
    assert "MEMLAB_TRACEBACK=1" in last and "report it" in last
    monkeypatch.setenv("MEMLAB_TRACEBACK", "1")
    with pytest.raises(RuntimeError, match="Couldn't swap"):
        _run(["estimate", str(config_dir), "--gpus", "2", "--device", "cpu"])


def test_help_documents_every_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--help"], ["estimate", "--help"], ["demo", "--help"]):
        assert main(argv) == 0
        text = " ".join(capsys.readouterr().out.split())
        assert "Exit status:" in text, argv
        assert f"{EXIT_FAILED} when memlab itself failed" in text, argv
        assert "2 on wrong input" in text, argv
    estimate = build_parser()._subparsers._group_actions[0].choices["estimate"]  # type: ignore[union-attr]
    assert "1 when none fits" in " ".join(estimate.format_help().split())
