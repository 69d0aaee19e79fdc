"""memlab's stack (issue 58): the floors it declares, the one message ``import memlab`` gives on an older stack, and
each private PyTorch name it relies on, found on the torch this suite runs on (CI runs it on every stack
CONTRIBUTING's table lists: the floors and the newest) and PyTorch's own code kept where one is missing."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.utils.checkpoint as checkpoint
from packaging.requirements import Requirement
from packaging.version import Version

from memlab.live import compat

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})


def test_pyproject_declares_the_floors_the_import_checks() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    block = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M)
    assert block is not None
    declared = {}
    for line in re.findall(r'^\s*"([^"]+)",', block.group(1), re.M):
        requirement = Requirement(line)
        floors = [spec.version for spec in requirement.specifier if spec.operator == ">="]
        if requirement.name in compat.FLOORS:
            declared[requirement.name] = floors[0]
    assert declared == compat.FLOORS


def test_ci_tests_exactly_the_declared_floors() -> None:
    """.ci/run's second stack is the floors pyproject.toml declares (core and extras): "declare only what CI tests"."""
    pins = {}
    for line in (ROOT / ".ci" / "floor-requirements.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            requirement = Requirement(line)
            pins[requirement.name] = next(iter(requirement.specifier)).version
    text = (ROOT / "pyproject.toml").read_text()
    floors = {}
    for line in re.findall(r'^\s*"([a-z][^"]*>=[^"]+)",', text, re.M):
        requirement = Requirement(line)
        if requirement.name in pins:
            floors.setdefault(requirement.name, set()).add(next(iter(requirement.specifier)).version)
    assert set(floors) == set(pins)
    for name, declared in floors.items():
        assert {Version(v).release for v in declared} == {Version(pins[name]).release[:len(Version(v).release)]
                                                           for v in declared}, (name, declared, pins[name])
    for name, floor in compat.FLOORS.items():
        assert Version(pins[name]).release[:len(Version(floor).release)] == Version(floor).release, name


# What the floor stack runs (.ci/run): every test but the Jupyter faces', the GPU's and the notebooks' runs.
FLOOR_TESTS = ("tests --ignore=tests/frontends/jupyter --ignore=tests/gpu"
               " --deselect tests/test_notebooks.py::test_notebook_runs_top_to_bottom")
_FAKE_PYTHON = """#!/bin/sh
echo "$(basename "$0") $*" >> "$CALLS"
case "$*" in *"pytest -q -p no:cacheprovider -m  $FLOOR_TESTS"*) exit "$FLOOR_STATUS";; esac
case "$*" in "-m pytest -q -p no:cacheprovider") exit "$NEWEST_STATUS";; esac
exit 0
"""


@pytest.mark.parametrize(("floor_status", "newest_status"), [(0, 0), (1, 0), (0, 1)])
def test_ci_runs_the_floor_and_the_newest_torch_stacks_always_and_fails_with_either(
    floor_status: int, newest_status: int, tmp_path: Path
) -> None:
    """.ci/run's stages after the README's stack's tests (DeepSpeed's ``-m needs``, the floor stack, the newest
    torch), played with a python that only says what it was asked: with no switch set, the floor stack's tests (all
    but the Jupyter faces', the GPU's and the notebooks' runs) run in ``MEMLAB_FLOOR_VENV`` after its pins are
    installed there, then the README's tests in ``MEMLAB_NEWEST_VENV`` after the newest torch is (whatever the floor
    said), and CI fails where either does."""
    script = (ROOT / ".ci" / "run").read_text()
    tail = script[script.index("# Then the tests that need a package"):]
    floor_venv, newest_venv = tmp_path / "floor", tmp_path / "newest"
    for python in (tmp_path / "bin" / "python3", floor_venv / "bin" / "python", newest_venv / "bin" / "python"):
        python.parent.mkdir(parents=True)
        python.write_text(_FAKE_PYTHON)
        python.chmod(0o755)
    calls = tmp_path / "calls"
    done = subprocess.run(["bash", "-c", "set -uo pipefail\n" + tail], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "CALLS": str(calls),
                                           "FLOOR_STATUS": str(floor_status), "NEWEST_STATUS": str(newest_status),
                                           "FLOOR_TESTS": FLOOR_TESTS, "MEMLAB_FLOOR_VENV": str(floor_venv),
                                           "MEMLAB_NEWEST_VENV": str(newest_venv), "HOME": str(tmp_path)})
    stacks = [line for line in calls.read_text().splitlines() if line.startswith("python ")]
    assert stacks == ["python -m pip install -q -r .ci/floor-requirements.txt -e .[test]",
                      # -m "": the e2e tests among them too (the fake python prints the empty argument as nothing)
                      f"python -m pytest -q -p no:cacheprovider -m  {FLOOR_TESTS}",
                      "python -m pip install -q -r .ci/newest-requirements.txt -e .[test]",
                      "python -m pytest -q -p no:cacheprovider"], done.stdout  # the README's, as it says it
    assert done.returncode == (floor_status or newest_status), done.stdout + done.stderr


def test_readme_pyproject_and_contributing_name_the_torch_releases_ci_tests() -> None:
    """The range CI tests at both ends, and the newest: the floor (.ci/floor-requirements.txt, pyproject's
    ``torch>=``), the README's pin and the newest torch (.ci/newest-requirements.txt) are the ones README.md,
    pyproject.toml and CONTRIBUTING.md's table of stacks name, the newest within pyproject's range."""
    newest = _pins(".ci/newest-requirements.txt")["torch"]
    floor = _pins(".ci/floor-requirements.txt")["torch"]
    readme = (ROOT / "README.md").read_text()
    pinned = re.search(r"pip install torch==([\d.]+) -e \"\.\[test\]\" && python -m pytest", readme)
    assert pinned is not None
    assert Version(floor) < Version(pinned.group(1)) < Version(newest)
    pyproject = (ROOT / "pyproject.toml").read_text()
    declared = next(Requirement(line.strip().strip('",')) for line in pyproject.splitlines()
                    if line.strip().startswith('"torch>='))
    assert newest in declared.specifier and floor in declared.specifier
    table = [row for row in (ROOT / "CONTRIBUTING.md").read_text().splitlines() if row.startswith("| ")]
    for text, where in ((readme, "README.md"), (pyproject, "pyproject.toml"), ("\n".join(table), "CONTRIBUTING.md")):
        for release in (floor, pinned.group(1), newest):
            assert release in text, (release, where)


def _pins(path: str) -> dict[str, str]:
    pins = {}
    for line in (ROOT / path).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            requirement = Requirement(line)
            pins[requirement.name] = next(iter(requirement.specifier)).version
    return pins


def test_this_stack_is_at_or_above_every_floor() -> None:
    assert compat.unsupported() == {}
    for package, floor in compat.FLOORS.items():
        installed = compat.installed_version(package)
        assert installed is not None and Version(installed).release >= Version(floor).release, (package, installed)


# What an old stack looks like to memlab, without installing one: the versions memlab reads are patched before
# memlab is imported, in a process of its own.
_OLD_STACK = """
import importlib.metadata as metadata
import torch
torch.__version__ = {torch!r}
real = metadata.version
metadata.version = lambda name: {{"transformers": {transformers!r}}}.get(name) or real(name)
try:
    import memlab
except ImportError as error:
    print(type(error).__name__, isinstance(error, ValueError), "|", error)
else:
    print("imported")
"""


def test_import_on_an_old_stack_says_once_which_versions_to_install() -> None:
    done = _run(_OLD_STACK.format(torch="2.8.0+cu128", transformers="4.55.4"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == (
        "UnsupportedStack True | memlab needs torch>=2.11, transformers>=5.17 (installed: torch 2.8.0+cu128, "
        "transformers 4.55.4); write: pip install --upgrade 'torch>=2.11' 'transformers>=5.17'"
    )
    assert "Traceback" not in done.stderr


def test_import_names_only_the_package_below_its_floor() -> None:
    done = _run(_OLD_STACK.format(torch=torch.__version__, transformers="5.16.1"))
    assert done.stdout.strip() == (
        "UnsupportedStack True | memlab needs transformers>=5.17 (installed: transformers 5.16.1); "
        "write: pip install --upgrade 'transformers>=5.17'"
    )


def test_the_floor_itself_and_builds_of_it_import() -> None:
    done = _run(_OLD_STACK.format(torch="2.11.0+cu130", transformers="5.17.0"))
    assert done.stdout.strip() == "imported", done.stderr[-2000:]


# --- the private names, on this torch ------------------------------------------------------------------------------


# What each torch CI runs has of the names that come and go (CONTRIBUTING's table of stacks): DTensor's
# _propagate_use_strided_shard_flag, which strided_flag_once makes cheaper, is not in torch 2.11 (nor its cost). A
# torch newer than the table is taken as its newest row.
HAS_STRIDED_FLAG = {(2, 11): False, (2, 13): True}


def test_every_private_name_is_found_on_this_torch() -> None:
    """Each look-up answers PyTorch's own object on every torch at or above the floor (2.11 and 2.13 in CI)."""
    release = Version(torch.__version__).release[:2]
    assert release in HAS_STRIDED_FLAG or release > max(HAS_STRIDED_FLAG), f"torch {release} is not in the table"
    assert compat.grouped_mm() is torch.ops.aten._grouped_mm.default
    assert compat.fake_cache_key_matches()
    assert torch.ops.prim.device.default in compat.fake_meta_handlers()
    fully_shard, policy = compat.fsdp2_api()
    assert callable(fully_shard) and policy(param_dtype=torch.bfloat16).param_dtype is torch.bfloat16
    assert compat.fsdp_mem_tracker_class().__name__ == "FSDPMemTracker"
    assert compat.mem_tracker_total_key() == "Total"
    found = compat.sharding_prop_strided_flag()
    if HAS_STRIDED_FLAG.get(release, release > max(HAS_STRIDED_FLAG)):
        assert found is not None and found[2].__name__ == "_StridedShard"
    else:
        assert found is None
    assert compat.dtensor_single_dim_strategy() is not None
    assert callable(torch._C._current_autograd_node) and compat.current_autograd_node() is None
    # The compiled checkpoint's and the higher-order operators' look-ups, not their fallbacks.
    assert callable(checkpoint._is_compiling) and compat.checkpoint_traced() is False
    assert "run_and_save_rng_state" in torch._ops._higher_order_ops


@pytest.mark.parametrize("reentrant", [False, True])
def test_every_checkpoints_recompute_goes_through_the_wrap_and_its_forward_does_not(reentrant: bool) -> None:
    # Both of torch's checkpoints, through their private _CheckpointFrame and CheckpointFunction: a model's own
    # checkpoint recomputes in backward under what the wrap adds (the CUDA emulation's modes).
    calls: list[str] = []

    def wrap(function: object) -> object:
        calls.append("forward")

        def recompute(*args: object, **kwargs: object) -> object:
            calls.append("recompute")
            return function(*args, **kwargs)  # type: ignore[operator]

        return recompute

    x = torch.ones(3, requires_grad=True)
    with compat.checkpoint_recomputations(wrap):
        y = checkpoint.checkpoint(torch.sin, x, use_reentrant=reentrant)
    assert (checkpoint._CheckpointFrame.__name__, checkpoint.CheckpointFunction.__name__) == (
        "_CheckpointFrame", "CheckpointFunction")  # put back
    y.sum().backward()
    assert calls == ["forward", "recompute"]
    assert torch.equal(x.grad, torch.ones(3).cos())


def test_a_torch_without_grouped_mm_or_with_another_cache_key_keeps_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    class Aten:  # an operator namespace without _grouped_mm, as before torch 2.8
        pass

    monkeypatch.setattr(torch.ops, "aten", Aten())
    assert compat.grouped_mm.__wrapped__() is None  # type: ignore[attr-defined]
    monkeypatch.undo()

    def older(self: object, result: list[object], args: object, state: object) -> None:  # one argument fewer
        pass

    monkeypatch.setattr(FakeTensorMode, "_prep_args_for_hash", older)
    assert compat.fake_cache_key_matches.__wrapped__() is False  # type: ignore[attr-defined]


_OLD_CACHE_KEY = """
from torch._subclasses.fake_tensor import FakeTensorMode
original = FakeTensorMode._prep_args_for_hash
def older(self, result, args, state, id_hashed_objects=None, extra=None):  # another signature than memlab's copy
    return original(self, result, args, state, id_hashed_objects)
FakeTensorMode._prep_args_for_hash = older
from memlab.estimation.dryrun.fake import FakeMode
import torch
print(FakeMode._prep_args_for_hash is older)
with FakeMode():
    print(tuple((torch.ones(3, 4) @ torch.ones(4, 2)).shape))
"""


def test_the_fake_mode_keeps_pytorchs_cache_key_where_the_signature_differs() -> None:
    done = _run(_OLD_CACHE_KEY)
    assert done.stdout.split() == ["True", "(3,", "2)"], done.stderr[-2000:]


_META_ENTERED = """
import sys
import torch
seen = []
class Watch:  # told of each import; records the default device the modeling module is imported on
    def find_spec(self, name, path=None, target=None):
        if name == "transformers.models.gpt2.modeling_gpt2":
            seen.append(torch.get_default_device().type)
sys.meta_path.insert(0, Watch())
from memlab.estimation.configs import load_config, meta_model
model = meta_model(load_config("gpt2"))
print(type(model).__name__, next(model.parameters()).device.type, seen)
"""


@pytest.mark.slow
def test_a_configs_modeling_module_is_imported_before_the_meta_device() -> None:
    """On torch 2.8 the first modeling import inside ``torch.device("meta")`` failed (it imports torch._dynamo)."""
    done = _run(_META_ENTERED)
    assert done.stdout.strip() == "GPT2LMHeadModel meta ['cpu']", done.stderr[-2000:]


def _global_shapes_made(apart: bool) -> list[tuple[int, ...]]:
    """The shapes of the tensors a dispatch mode above the dry run's fake mode sees made while DTensor propagates
    an uncached operator of a tensor sharded over 2 fake ranks (global 48 x 6, each rank's shard 24 x 6)."""
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor
    from torch.utils._python_dispatch import TorchDispatchMode

    from memlab.estimation.dryrun.fake import FakeMode
    from memlab.estimation.sharded.fsdp2 import fake_process_group

    made: list[tuple[int, ...]] = []

    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if DTensor in types:  # as FSDPMemTracker: DTensor runs first, the mode sees its local operators
                return NotImplemented
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor):
                made.append(tuple(out.shape))
            return out

    with fake_process_group(2) as mesh, FakeMode():
        shard = distribute_tensor(torch.empty(48, 6), mesh, [Shard(0)])
        with compat.propagation_apart() if apart else contextlib.nullcontext(), Seen():
            torch.add(shard, shard, alpha=0.25)  # a schema propagated for the first time: not in DTensor's cache
    return made


def test_dtensors_shape_propagation_is_not_memory_in_a_dry_run() -> None:
    """Issue 58: DTensor works out an output's shape on fake tensors of the global shape; in eager mode they live in
    a fake mode of their own, in a dry run in the dry run's, where every tracker saw them (torch 2.11 booked 2.09
    GiB of "optimizer" for GPT-2 on 2 GPUs this way, where the real run holds 475 MiB)."""
    assert (48, 6) in _global_shapes_made(apart=False)  # what the trackers saw without it
    assert (48, 6) not in _global_shapes_made(apart=True)


def test_the_allocator_settings_are_set_and_read_through_pytorchs_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """``set_allocator_settings`` reaches PyTorch's setting on this torch (2.11 and 2.13 both have
    ``_accelerator_setAllocatorSettings``; older ones ``torch.cuda.memory._set_allocator_settings``), and
    ``allocator_settings`` reads it back where torch has a getter (2.13), None where not (2.11)."""
    assert hasattr(torch._C, "_accelerator_setAllocatorSettings") or hasattr(torch.cuda.memory,
                                                                             "_set_allocator_settings")
    getter = hasattr(torch._C, "_accelerator_getAllocatorSettings")
    try:
        compat.set_allocator_settings("expandable_segments:True")
        assert compat.allocator_settings() == ("expandable_segments:True" if getter else None)
    finally:
        compat.set_allocator_settings("expandable_segments:False")
    assert compat.allocator_settings() in ("expandable_segments:False", None)
    seen: list[str] = []
    monkeypatch.delattr(torch._C, "_accelerator_setAllocatorSettings", raising=False)
    monkeypatch.setattr(torch.cuda.memory, "_set_allocator_settings", seen.append, raising=False)
    compat.set_allocator_settings("expandable_segments:True")  # a torch with only the older name
    assert seen == ["expandable_segments:True"]


def test_ci_runs_the_e2e_and_slow_tests_the_readme_leaves_out_before_the_site() -> None:
    """The README's command deselects the end-to-end and the slow tests (pyproject's addopts: ``-m 'not e2e and not
    slow'``); .ci/run runs exactly those as a stage of its own, after that command and before the site, which shows
    the notebooks they executed: together the two stages run every test."""
    import tomllib

    addopts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    assert "-m 'not e2e and not slow'" in addopts
    script = (ROOT / ".ci" / "run").read_text()
    readme, e2e, site = (script.index('bash -c "$test_command"'),
                         script.index("python3 -m pytest -q -m 'e2e or slow'\n"), script.index("python3 -m sphinx -W"))
    assert readme < e2e < site
