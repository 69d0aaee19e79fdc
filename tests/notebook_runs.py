"""The workshop notebooks executed for ``tests/test_notebooks.py``, in the background of the test session.

A notebook runs in its own kernel, a separate process, while the test process only waits: on a 2-core machine the
other core could run the rest of the suite. So when the session has collected notebook runs, a runner process
(this file run as a script) starts executing them one after the other, in a fresh kernel each, while the other
tests run; each notebook test then reads its notebook's result (how long it took, the warnings it printed, the
error it stopped on). A notebook that the runner has not started yet when its test comes is run by the test
itself (a claim file decides who runs it), so that near the end both cores execute notebooks.

Nothing is shared between notebooks: every one starts a new kernel, with the environment the session had when it
was collected (``OMP_NUM_THREADS=1`` unless set: one torch thread in the kernel, like the smallest Binder).
Run by hand: ``python tests/notebook_runs.py OUT_DIR 00_where_memory_goes.ipynb ...``.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import background
import nbformat

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
NAMES = sorted(path.name for path in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))

PER_NOTEBOOK_S = 180

KEEP_EXECUTED = "MEMLAB_EXECUTED_NOTEBOOKS"
"""An environment variable: a folder where each notebook that ran without an error is written with its outputs
(``.ci/run`` sets it, so that the documentation site reuses the runs: ``docs/_ext/memlab_docs.py``)."""

# noise=0: a notebook's speeds are for its reader; here it only has to run, so each plan times exactly one step.
SMALL = {"hidden": 32, "layers": 2, "vocab": 128, "rows": 4, "seq_len": 16, "steps": 1, "noise": 0}
OVERRIDES = {
    "04_8bit_adam.ipynb": {**SMALL, "curve_steps": 5},
    "08_lora_and_qlora.ipynb": {**SMALL, "curve_steps": 5},
    "07_will_7b_fit.ipynb": {
        "hidden": 64,
        "layers": 2,
        "heads": 4,
        "intermediate": 128,
        "vocab": 128,
        "seq_len": 32,
        "budget": "24GiB",
    },
    # Llama 3.1 8B's widths (on the meta device and fake tensors they cost nothing) in 2 of its 32 layers: 1.5
    # billion parameters, 22 GiB on one GPU; ZeRO-3 fits 8 GiB on 8 GPUs, beside DeepSpeed's reduce bucket (5e8
    # elements, 2 GB in fp32), which a model of a few thousand parameters could never shard its way under.
    "10_when_one_gpu_is_not_enough.ipynb": {"layers": 2, "seq_len": 32, "budget": "8GiB", "gpus": 2},
    # The long tail must stay long enough that the worst batch needs far more than a typical one (already small).
    "12_from_oom_to_a_plan_that_fits.ipynb": {
        "hidden": 64,
        "layers": 2,
        "rows": 4,
        "short_words": 10,
        "long_words": 190,
        "examples": 32,
        "long_examples": 4,
        "steps": 1,
        "noise": 0,
    },
    # The tiny model's budget at SMALL's sizes; the 8B keeps its shape but 2 of its 32 layers (a dry run of all 32
    # takes 10 to 60 s here, and limits makes up to 8 for each attention kernel).
    "13_how_long_can_my_sequences_be.ipynb": {**SMALL, "budget": "8MiB", "big_layers": 2},
    # A GRPO step of 4 completions (2 prompts x 2) of 6 tokens; the 8B keeps its shape in 2 of its 36 layers.
    "14_grpo_without_running_out_of_memory.ipynb": {"hidden": 32, "layers": 1, "rows": 2, "generations": 2,
                                                    "completion": 6, "train_steps": 2, "steps": 1, "noise": 0,
                                                    "big_layers": 2},
}


def _has_module(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def missing_apis(name: str) -> list[str]:
    """The APIs a notebook uses that this checkout does not have yet."""
    import memlab

    needs = {
        "06_memfit_and_panel.ipynb": {
            "memlab.fit": hasattr(memlab, "fit"),
            "memlab.panel": hasattr(memlab, "panel"),
            "memlab.frontends.jupyter.magic (%%memfit)": _has_module("memlab.frontends.jupyter.magic"),
        },
        "07_will_7b_fit.ipynb": {"memlab.estimation.estimate": hasattr(memlab, "estimate")},
        "10_when_one_gpu_is_not_enough.ipynb": {
            "memlab.estimation.sharded.per_gpu": _has_module("memlab.estimation.sharded.per_gpu"),
        },
        "13_how_long_can_my_sequences_be.ipynb": {"memlab.limits": hasattr(memlab, "limits")},
    }
    return [api for api, present in needs.get(name, {}).items() if not present]


def parameters_index(nb: nbformat.NotebookNode) -> int:
    tagged = [i for i, cell in enumerate(nb.cells) if "parameters" in cell.metadata.get("tags", [])]
    assert len(tagged) == 1, "a notebook needs exactly one cell tagged 'parameters'"
    return tagged[0]


def with_small_sizes(nb: nbformat.NotebookNode, name: str) -> nbformat.NotebookNode:
    """The notebook with a cell of smaller sizes injected after its parameters cell."""
    values = OVERRIDES.get(name, SMALL)
    source = "# Injected by tests/test_notebooks.py: small sizes for CI\n" + "\n".join(
        f"{key} = {value!r}" for key, value in values.items()
    )
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["tags"] = ["injected-parameters"]
    cell["id"] = "injected-parameters"
    nb.cells.insert(parameters_index(nb) + 1, cell)
    return nb


def warnings_printed(nb: nbformat.NotebookNode) -> list[str]:
    found = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream" and output.get("name") == "stderr":
                text = output.get("text", "")
                if "warn" in text.lower():
                    found.append(text.strip()[:300])
    return found


def kernel_environment() -> dict[str, str]:
    """The environment every notebook's kernel starts with: this process's, with one torch thread unless set (on a
    shared machine, threads that wait for each other make the small steps many times slower, and timings flaky)."""
    return {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}


@dataclass(frozen=True)
class NotebookRun:
    """What executing one notebook gave: its seconds, the warnings it printed, and the error it stopped on."""

    name: str
    seconds: float
    warnings: list[str]
    error: str | None = None
    saved_bytes: int | None = None
    """What the executed notebook weighs saved, without widget state (:func:`saved_size`)."""
    two_forms: int | None = None
    """Outputs that hold a figure twice: an SVG and plotly's JSON, of which JupyterLab would store a PNG too."""
    cpu_seconds: float | None = None
    """The kernel's own CPU time (user and system): what the notebook costs, which, unlike :attr:`seconds`, the
    rest of a busy machine barely changes (each kernel runs one torch thread)."""
    left_behind: list[str] | None = None
    """What the run left in the kernel's working folder (a reader's ``notebooks/``), by name."""


def execute(name: str, workdir: Path, env: dict[str, str]) -> NotebookRun:
    """Execute notebook ``name`` with the small sizes, in a fresh ``python3`` kernel whose working folder is
    ``workdir``."""
    from nbclient import NotebookClient

    nb = with_small_sizes(nbformat.read(NOTEBOOKS / name, as_version=4), name)
    workdir.mkdir(parents=True, exist_ok=True)
    client = NotebookClient(
        nb, timeout=PER_NOTEBOOK_S, kernel_name="python3", resources={"metadata": {"path": str(workdir)}}
    )
    started = time.perf_counter()
    # The kernel is a child of this process, waited for when the client shuts it down: the children's CPU time
    # grows by exactly the kernel's (this process runs one notebook at a time).
    children_before = _children_cpu_seconds()
    try:
        try:
            client.execute(env=env)
        except RuntimeError as error:
            # A kernel that died while starting ran no cell: the machine's failure, not the notebook's; once more.
            if "Kernel died before replying to kernel_info" not in str(error):
                raise
            client = NotebookClient(
                nb, timeout=PER_NOTEBOOK_S, kernel_name="python3", resources={"metadata": {"path": str(workdir)}}
            )
            client.execute(env=env)
    except Exception:  # noqa: BLE001 - the test reports it with the cell's traceback
        return NotebookRun(name, time.perf_counter() - started, warnings_printed(nb), traceback.format_exc()[-6000:])
    seconds = time.perf_counter() - started
    cpu_seconds = _children_cpu_seconds() - children_before
    keep = os.environ.get(KEEP_EXECUTED)
    if keep:  # for the documentation site's build, which then shows these outputs instead of running it again
        Path(keep).mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, Path(keep) / f"{name}.partial")
        os.replace(Path(keep) / f"{name}.partial", Path(keep) / name)  # whole, for a build reading it meanwhile
    two_forms = sum(
        {"image/svg+xml", "application/vnd.plotly.v1+json"} <= set(output.get("data", {}))
        for cell in nb.cells
        for output in cell.get("outputs", [])
    )
    return NotebookRun(name, seconds, warnings_printed(nb), saved_bytes=saved_size(nb), two_forms=two_forms,
                       cpu_seconds=cpu_seconds, left_behind=sorted(os.listdir(workdir)))


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def saved_size(nb: nbformat.NotebookNode) -> int:
    """What an executed notebook weighs saved: its cells and outputs, without the widget state (which JupyterLab saves
    only when asked to, and nbclient always keeps: a panel's live figure carries plotly.js, about 5 MB). What CI
    cannot add is the PNG that JupyterLab's plotly extension stores beside each plotly figure when it draws one (60
    to 150 kB a figure): tests/frontends/jupyter/browser/test_browser.py measures notebook 06 as JupyterLab saves it,
    PNG included.

    Example:
        >>> nb = nbformat.v4.new_notebook()
        >>> nb.metadata["widgets"] = {"state": "x" * 5_000_000}
        >>> saved_size(nb) < 1000
        True
    """
    kept = nbformat.from_dict(nb)
    kept.metadata.pop("widgets", None)
    return len(nbformat.writes(kept).encode())


def _write(folder: Path, run: NotebookRun) -> None:
    partial = folder / f"{run.name}.json.partial"
    partial.write_text(json.dumps(run.__dict__))
    os.replace(partial, folder / f"{run.name}.json")


def _read(folder: Path, name: str) -> NotebookRun | None:
    path = folder / f"{name}.json"
    return NotebookRun(**json.loads(path.read_text())) if path.exists() else None


class NotebookRuns:
    """The session's notebook runs: :meth:`start` the runner in the background (once per session, whichever
    pytest-xdist worker comes first: :mod:`background`), :meth:`result` of one notebook (waiting for the runner, or
    running it here). The session's end stops the runner (``tests/conftest.py``)."""

    def __init__(self) -> None:
        self.folder: Path | None = None
        self.env: dict[str, str] = {}

    def start(self, names: list[str]) -> None:
        self.folder = background.shared_folder() / "notebooks"
        self.folder.mkdir(exist_ok=True)
        self.env = kernel_environment()
        if names:
            background.start_once("notebooks", [sys.executable, __file__, str(self.folder), *names], cwd=ROOT,
                                  env=self.env, log=self.folder / "runner.log")

    def result(self, name: str) -> NotebookRun:
        if self.folder is None:  # no session hook started it (a test run by hand): run everything here
            self.start([])
        assert self.folder is not None
        while True:
            done = _read(self.folder, name)
            if done is not None:
                return done
            if background.claim(self.folder, name):
                run = execute(name, self.folder / name, self.env)
                _write(self.folder, run)
                return run
            if not background.running("notebooks"):
                done = _read(self.folder, name)  # it may have finished between the two reads
                if done is not None:
                    return done
                log = (self.folder / "runner.log").read_text(errors="replace")[-3000:]
                return NotebookRun(name, 0.0, [], f"the notebook runner stopped before {name} ended:\n{log}")
            time.sleep(0.2)


RUNS = NotebookRuns()
"""The session's runs (started by ``tests/conftest.py`` once the session has collected its tests)."""


def main(argv: list[str]) -> int:
    folder, names = Path(argv[0]), argv[1:]
    env = dict(os.environ)
    for name in names:
        if background.claim(folder, name):
            run = execute(name, folder / name, env)
            _write(folder, run)
            print(f"{name}: {run.seconds:.1f} s{' (failed)' if run.error else ''}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

