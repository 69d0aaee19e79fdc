"""`memlab estimate` keeps its dry runs' answers (memlab/estimation/answers.py): a question asked again makes no dry
run and prints the same bytes; any input that decides an answer is in its key; --no-cache, a corrupt entry and an
unwritable folder make the answer again. The conftest gives every test an empty MEMLAB_CACHE_DIR of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from models import llama_config_dir

import memlab.estimation.answers as answers
import memlab.estimation.dryrun.single_gpu as single_gpu
import memlab.estimation.sharded.per_gpu as per_gpu
import memlab.frontends.cli.estimate.kept as estimate_kept
import memlab.live.cache as cache
from memlab.estimation.sharded.fsdp2 import ShardedTrial
from memlab.frontends.cli.main import main
from memlab.report import Report, Trial

ENTRY = sys.modules["memlab.estimation.estimate"]  # the module (the package's name for it is the function)


@pytest.fixture
def config(tmp_path: Path) -> str:
    return str(llama_config_dir(tmp_path / "tiny", 64, 2, 256))


def ask(capsys: pytest.CaptureFixture[str], *words: str) -> tuple[int, str]:
    """``memlab estimate WORDS`` in this process: its status and standard output."""
    capsys.readouterr()
    status = main(["estimate", *words])
    return status, capsys.readouterr().out


def kept_entries() -> list[Path]:
    return sorted((Path(os.environ["MEMLAB_CACHE_DIR"]) / "estimates").glob("*.json"))


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The real dry runs (one GPU and sharded), each counted by the plan it ran."""
    runs: list[str] = []
    one, sharded = single_gpu.estimate_plans, per_gpu.sharded_trials

    def estimate_plans(model: Any, batch: Any, plans: Any, **settings: Any) -> Any:
        runs.extend(plan.label() for plan in plans)
        return one(model, batch, plans, **settings)

    def sharded_trials(model: Any, batch: Any, plans: Any, **settings: Any) -> Any:
        runs.extend(f"{plan.label()} sharded" for plan in plans)
        return sharded(model, batch, plans, **settings)

    for module in (single_gpu, ENTRY):  # the entry's own name for it too (the CLI called that one before)
        monkeypatch.setattr(module, "estimate_plans", estimate_plans)
    monkeypatch.setattr(per_gpu, "sharded_trials", sharded_trials)
    return runs


@pytest.mark.parametrize("words", [
    ["--budget", "1GiB", "--try", "checkpointing=off,on"],
    ["--budget", "1GiB", "--try", "checkpointing=off,on", "--json"],
    ["--budget", "1GiB", "--gpus", "2", "--strategy", "zero3"],
], ids=["table", "json", "sharded"])
def test_a_question_asked_again_makes_no_dry_run_and_prints_the_same_bytes(
    capsys: pytest.CaptureFixture[str], config: str, counted: list[str], words: list[str]
) -> None:
    first = ask(capsys, config, "--batch", "1x32", *words)
    made = len(counted)
    assert made > 0 and kept_entries()
    again = ask(capsys, config, "--batch", "1x32", *words)
    assert len(counted) == made  # no dry run the second time
    assert again == first
    # and what a kept answer prints is what a fresh estimate prints
    assert ask(capsys, config, "--batch", "1x32", *words, "--no-cache") == first
    assert len(counted) == 2 * made


def test_an_answer_asked_again_builds_no_model(
    capsys: pytest.CaptureFixture[str], config: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import memlab.estimation.configs as configs

    built: list[str] = []
    meta_model = configs.meta_model

    def counted(model_config: Any) -> Any:
        built.append(type(model_config).__name__)
        return meta_model(model_config)

    for module in (configs, ENTRY):
        monkeypatch.setattr(module, "meta_model", counted)
    first = ask(capsys, config, "--batch", "1x32")
    assert built
    built.clear()
    assert ask(capsys, config, "--batch", "1x32") == first
    assert built == []  # the header's class and parameter count were kept with the answers


def test_a_sharded_trial_comes_back_whole(config: str) -> None:
    from memlab.plan import Plan

    rows = per_gpu.sharded_trials(json_config(config), {"input_ids": (1, 16), "labels": (1, 16)}, [Plan()], gpus=2,
                                  strategies=["fsdp2", "zero3"], device="cpu")
    for _, _, trial in rows:
        again = answers.trial_from_row(json.loads(json.dumps(answers.trial_row(trial))))
        assert isinstance(again, ShardedTrial) and again == trial and again.detail == trial.detail


def json_config(folder: str) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(folder)


# --- the key: stand-in dry runs, counted, so that each input is checked in a fraction of a second -----------------


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    runs: list[str] = []

    def estimate_plans(model: Any, batch: Any, plans: Any, **settings: Any) -> Report:
        runs.extend(plan.label() for plan in plans)
        return Report([Trial(plan, "ok", 2**20, {"params": 2**20}, None, None, None, "cuda", estimated=True,
                             budget=settings.get("budget")) for plan in plans], budget=settings.get("budget"))

    def sharded_trials(model: Any, batch: Any, plans: Any, *, strategies: Any = None, **settings: Any) -> list[Any]:
        runs.extend(plan.label() for plan in plans)
        return [(plan, name, ShardedTrial(plan, "ok", 2**20, {"params": 2**20}, None, None, None, "cuda", gpus=2,
                                          strategy=name, estimated=True))
                for plan in plans for name in strategies or ["fsdp2", "zero2", "zero3"]]

    for module in (single_gpu, ENTRY):  # the entry's own name for it too (the CLI called that one before)
        monkeypatch.setattr(module, "estimate_plans", estimate_plans)
    monkeypatch.setattr(per_gpu, "sharded_trials", sharded_trials)
    return runs


CHANGES = {  # each input that decides an answer: the question before and after it changes
    "batch": ([], ["--batch", "2x32"]),
    "plan": ([], ["--try", "checkpointing=on"]),
    "dtype": ([], ["--dtype", "bf16"]),
    "quantization": (["--load-in-4bit"], ["--load-in-4bit", "--bnb-4bit-quant-type", "nf4"]),
    "gpu": ([], ["--gpu", "L4-24GB"]),
    "described gpu's memory": (["--gpu-memory", "32GiB", "--gpu-capability", "8.6"],
                               ["--gpu-memory", "48GiB", "--gpu-capability", "8.6"]),
    "described gpu's capability": (["--gpu-memory", "32GiB", "--gpu-capability", "8.6"],
                                   ["--gpu-memory", "32GiB", "--gpu-capability", "8.9"]),
    "device": ([], ["--device", "cpu"]),
    "budget": (["--budget", "1GiB"], ["--budget", "2GiB"]),
    "allocator": ([], ["--expandable-segments"]),
    "gpus": (["--gpus", "2", "--strategy", "zero3"], ["--gpus", "4", "--strategy", "zero3"]),
    "strategy": (["--gpus", "2", "--strategy", "zero3"], ["--gpus", "2", "--strategy", "zero2"]),
    "sharded budget": (["--gpus", "2", "--budget", "1GiB"], ["--gpus", "2", "--budget", "2GiB"]),
}


@pytest.mark.parametrize("change", CHANGES, ids=list(CHANGES))
def test_every_input_that_decides_an_answer_is_in_its_key(
    capsys: pytest.CaptureFixture[str], config: str, stand_in: list[str], change: str
) -> None:
    before, after = CHANGES[change]
    ask(capsys, config, "--batch", "1x32", *before)
    made = len(stand_in)
    assert made > 0
    ask(capsys, config, "--batch", "1x32", *before)
    assert len(stand_in) == made  # the same question: kept
    ask(capsys, config, "--batch", "1x32", *after)
    assert len(stand_in) > made  # a changed one: made again


def test_the_whole_config_is_in_the_key_not_its_name(
    capsys: pytest.CaptureFixture[str], config: str, stand_in: list[str]
) -> None:
    ask(capsys, config)
    ask(capsys, config)
    assert len(stand_in) == 1
    path = Path(config) / "config.json"
    values = json.loads(path.read_text())
    path.write_text(json.dumps({**values, "rms_norm_eps": values["rms_norm_eps"] * 10}))  # the same path, another model
    ask(capsys, config)
    assert len(stand_in) == 2


@pytest.mark.parametrize("variable", ["CUBLAS_WORKSPACE_CONFIG", "PYTORCH_CUDA_ALLOC_CONF"])
def test_the_environment_the_card_figure_reads_is_in_the_key(
    capsys: pytest.CaptureFixture[str], config: str, stand_in: list[str], monkeypatch: pytest.MonkeyPatch,
    variable: str,
) -> None:
    monkeypatch.delenv(variable, raising=False)
    ask(capsys, config)
    ask(capsys, config)
    assert len(stand_in) == 1
    monkeypatch.setenv(variable, ":4096:8" if variable.startswith("CUBLAS") else "expandable_segments:True")
    ask(capsys, config)
    assert len(stand_in) == 2


@pytest.mark.parametrize("part", ["torch", "transformers", "peft", "trl", "bitsandbytes", "memlab", "memlab_files"])
def test_the_stack_and_memlabs_own_files_are_in_the_key(
    capsys: pytest.CaptureFixture[str], config: str, stand_in: list[str], monkeypatch: pytest.MonkeyPatch,
    part: str,
) -> None:
    ask(capsys, config)
    stamp = answers.stack_stamp()
    # where every key reads it: the dry runs' and the whole question's (memlab/live/cache.py)
    monkeypatch.setattr(cache, "stack_stamp", lambda: {**stamp, part: f"{stamp[part]}+changed"})
    ask(capsys, config)
    assert len(stand_in) == 2


def test_memlabs_files_hash_follows_any_change_but_pythons_caches(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "__pycache__").mkdir(parents=True)
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    before = answers.files_hash(tmp_path / "pkg")
    (tmp_path / "pkg" / "__pycache__" / "a.cpython-312.pyc").write_bytes(b"\0")
    assert answers.files_hash(tmp_path / "pkg") == before
    (tmp_path / "pkg" / "a.py").write_text("x = 2\n")
    assert answers.files_hash(tmp_path / "pkg") != before
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    (tmp_path / "pkg" / "b.json").write_text("{}")
    assert answers.files_hash(tmp_path / "pkg") != before


def test_no_cache_makes_every_dry_run_and_keeps_none(
    capsys: pytest.CaptureFixture[str], config: str, stand_in: list[str]
) -> None:
    ask(capsys, config, "--try", "checkpointing=off,on")
    first = ask(capsys, config, "--try", "checkpointing=off,on", "--no-cache")
    assert len(stand_in) == 4  # the kept answers were not read
    entries = {path: path.read_bytes() for path in kept_entries()}
    assert ask(capsys, config, "--try", "checkpointing=off,on", "--no-cache") == first
    assert len(stand_in) == 6
    assert {path: path.read_bytes() for path in kept_entries()} == entries  # nor written


@pytest.mark.parametrize("damage", ["", "{", "[]", '{"key": "another", "rows": []}', "\0\1\2"],
                         ids=["empty", "cut short", "a list", "another key", "bytes"])
def test_a_corrupt_entry_is_made_again(
    capsys: pytest.CaptureFixture[str], config: str, stand_in: list[str], damage: str
) -> None:
    first = ask(capsys, config)
    for path in kept_entries():
        path.write_text(damage)
    assert ask(capsys, config) == first
    assert len(stand_in) == 2
    ask(capsys, config)
    assert len(stand_in) == 2  # written again whole


def test_an_entry_whose_rows_do_not_make_a_trial_is_made_again(
    capsys: pytest.CaptureFixture[str], config: str, stand_in: list[str]
) -> None:
    first = ask(capsys, config)
    assert kept_entries()
    for path in kept_entries():
        entry = json.loads(path.read_text())
        path.write_text(json.dumps({**entry, "rows": [{"status": "no such status"}]}))
    assert ask(capsys, config) == first
    assert len(stand_in) == 2


def test_an_unwritable_folder_is_no_error(
    capsys: pytest.CaptureFixture[str], config: str, stand_in: list[str], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    blocked = tmp_path / "a file"
    blocked.write_text("")
    monkeypatch.setenv("MEMLAB_CACHE_DIR", str(blocked))
    first = ask(capsys, config, "--try", "checkpointing=off,on")
    assert first[0] == 0 and "plain" in first[1]
    assert ask(capsys, config, "--try", "checkpointing=off,on") == first
    assert len(stand_in) == 4


def test_the_folder_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MEMLAB_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert answers.cache_folder() == tmp_path / "xdg" / "memlab"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert answers.cache_folder() == tmp_path / "home" / ".cache" / "memlab"
    monkeypatch.setenv("MEMLAB_CACHE_DIR", str(tmp_path / "moved"))
    assert answers.cache_folder() == tmp_path / "moved"


@pytest.fixture(scope="module")
def module_fixtures_folder() -> Path:
    """Where a module-scoped fixture (several run the command once for a module's tests) keeps answers."""
    return answers.cache_folder()


def test_the_tests_never_write_to_the_real_cache(module_fixtures_folder: Path) -> None:
    home = answers.cache_folder({})
    assert answers.cache_folder() != home
    assert module_fixtures_folder != home


# --- reuse inside one ask ----------------------------------------------------------------------------------------


def test_gpus_auto_starts_zeros_basis_from_the_dry_run_fsdps_search_made(monkeypatch: pytest.MonkeyPatch) -> None:
    import memlab.estimation.sharded.zero as zero
    from memlab.plan import Plan

    config = json_config(str(llama_config_dir(Path(os.environ["MEMLAB_CACHE_DIR"]) / "model", 64, 2, 256)))
    batch = {"input_ids": (1, 16), "labels": (1, 16)}
    runs: list[tuple[int, int | None]] = []
    dry_run = per_gpu.fsdp2_dry_run

    def counted(request: Any) -> Any:
        runs.append((request.gpus, request.budget))
        return dry_run(request)

    monkeypatch.setattr(per_gpu, "fsdp2_dry_run", counted)
    monkeypatch.setattr(zero, "fsdp2_dry_run", counted)
    budget = 2 * 2**20  # FSDP2's search probes 2 GPUs, the number ZeRO's basis is dry-run on
    found = per_gpu.smallest_gpus(config, batch, Plan(), budget=budget, device="cpu")
    assert (zero.BASIS_GPUS, budget) in runs
    assert all(limit == budget for _, limit in runs)  # FSDP's search only: no dry run of ZeRO's basis apart
    searched = len(runs)
    # ZeRO's answers are those of a basis made by a dry run of its own
    alone = per_gpu.smallest_gpus(config, batch, Plan(), budget=budget, device="cpu", strategies=["zero2", "zero3"])
    assert runs[searched:] == [(zero.BASIS_GPUS, None)]
    assert found["zero2"] is not None
    assert (found["zero2"], found["zero3"]) == (alone["zero2"], alone["zero3"])


# --- the whole answer, read before torch is imported (memlab/frontends/cli/estimate/kept.py) --------------------------

ROOT = Path(__file__).resolve().parents[3]
_ASK_AGAIN = """
import sys
from memlab.frontends.cli.main import main
status = main(sys.argv[1:])
heavy = sorted(name for name in ("torch", "transformers", "peft", "memlab.estimation", "memlab.plan")
               if name in sys.modules)
print("imported:", heavy, file=sys.stderr)
raise SystemExit(status)
"""


@pytest.mark.parametrize("words", [["--budget", "1GiB", "--try", "checkpointing=off,on"], ["--budget", "1KiB"],
                                   ["--budget", "1GiB", "--json"]], ids=["fits", "none fits", "json"])
def test_asked_again_in_a_fresh_process_prints_the_same_bytes_and_imports_no_torch(
    capsys: pytest.CaptureFixture[str], config: str, words: list[str]
) -> None:
    first = ask(capsys, config, "--batch", "1x32", *words)
    environment = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    again = subprocess.run([sys.executable, "-c", _ASK_AGAIN, "estimate", config, "--batch", "1x32", *words],
                           capture_output=True, text=True, env=environment, timeout=120)
    assert (again.returncode, again.stdout) == first
    assert "imported: []" in again.stderr, again.stderr
    assert "the answer kept from an earlier ask" in again.stderr


def test_a_wrong_question_keeps_no_answer(capsys: pytest.CaptureFixture[str], config: str, stand_in: list[str]) -> None:
    assert ask(capsys, config, "--batch", "1 by 32")[0] == 2
    assert kept_entries() == []


def test_a_question_whose_plan_fails_is_asked_again(
    capsys: pytest.CaptureFixture[str], config: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs: list[str] = []

    def failing(model: Any, batch: Any, plans: Any, **settings: Any) -> Report:
        runs.extend(plan.label() for plan in plans)
        return Report([Trial(plan, "error", 0, {}, None, None, "no rule", "cuda", estimated=True) for plan in plans])

    for module in (single_gpu, ENTRY):
        monkeypatch.setattr(module, "estimate_plans", failing)
    assert ask(capsys, config)[0] == 3
    assert ask(capsys, config)[0] == 3
    assert len(runs) == 1  # the dry run's answer kept, the whole answer (status 3) not: the question ran again


def test_a_shape_answer_is_not_read_where_a_file_of_its_name_appears(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "kept"
    estimate_kept.keep(["llama-7b"], folder, {"kind": "shape", "source": "llama-7b"}, "a table\n", 1)
    assert estimate_kept.answered(["llama-7b"], folder) == ("a table\n", 1)
    (tmp_path / "llama-7b").write_text("{}")  # load_config reads a path before a shape of the same name
    assert estimate_kept.answered(["llama-7b"], folder) is None


def test_a_hub_name_keeps_no_whole_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert estimate_kept.config_identity("meta-llama/Llama-2-7b-hf", shape=False) is None
    file = tmp_path / "config.json"
    file.write_text('{"model_type": "llama"}')
    for source in (str(file), str(tmp_path)):  # a file, or the folder it is the config.json of
        identity = estimate_kept.config_identity(source, shape=False)
        assert identity is not None and identity["kind"] == "path"
        estimate_kept.keep([source], tmp_path / "kept", identity, "t\n", 0)
        assert estimate_kept.answered([source], tmp_path / "kept") == ("t\n", 0)
    file.write_text('{"model_type": "mistral"}')
    assert estimate_kept.answered([str(file)], tmp_path / "kept") is None
    assert estimate_kept.answered([str(tmp_path)], tmp_path / "kept") is None


@pytest.mark.parametrize("row", [{"stdout": 1, "status": 0}, {"stdout": "t", "status": 2},
                                 {"stdout": "t", "status": True},
                                 {"stdout": "t", "status": 0, "config": {"kind": "hub", "source": "x"}}, "text"])
def test_a_whole_answer_that_does_not_read_back_is_asked_again(tmp_path: Path, row: Any) -> None:
    words = ["llama-7b"]
    cache.write_rows(tmp_path, estimate_kept.question_key(words), [row])
    assert estimate_kept.answered(words, tmp_path) is None
