import collections
import gc
import os
import shutil
import tempfile

import background
import models  # noqa: F401  (sets threads and warning filters for every test)
import pytest

ANSWERS_ENV = "MEMLAB_CACHE_DIR"


def pytest_configure(config):
    # memlab estimate's kept answers: never the user's folder, even for session fixtures (each process its own)
    config.stash[_ANSWERS] = tempfile.mkdtemp(prefix="memlab-cache-session-")
    os.environ[ANSWERS_ENV] = config.stash[_ANSWERS]
    # The session's shared folder for its background jobs (background.py), made by the first process to configure
    # (xdist's controller, before it starts the workers, which inherit the variable; or the only process), which
    # also ends the jobs and removes it at the end.
    if background.SHARED_ENV not in os.environ:
        background.shared_folder()
        config.stash[_OWNS_SHARED] = True


def pytest_unconfigure(config):
    # The frozen heap (below) back in the collector's care for the teardown: frozen, Triton's nanobind objects
    # outlived it and nanobind printed a hundred lines of "leaked" objects at each worker's exit.
    gc.unfreeze()
    shutil.rmtree(config.stash.get(_ANSWERS, ""), ignore_errors=True)
    if config.stash.get(_OWNS_SHARED, False):
        background.stop_all(background.shared_folder())
        del os.environ[background.SHARED_ENV]


_OWNS_SHARED = pytest.StashKey[bool]()
_ANSWERS = pytest.StashKey[str]()


@pytest.hookimpl(optionalhook=True)  # an xdist hook: pytest without xdist (the GPU run's -o addopts=) skips it
def pytest_xdist_auto_num_workers(config):
    # -n auto (pyproject.toml): one worker per core, at most four. Most tests are single-threaded Python (fake-tensor
    # dispatch, tiny models with one torch thread), so the suite ran on about one core of two before; more than four
    # workers would each import torch and transformers for little gain.
    return max(1, min(4, len(os.sched_getaffinity(0))))


# The tests whose slow part starts in the background as soon as the session has collected them, so that it runs
# while the other tests do (the session's end stops them: pytest_unconfigure, background.py): the Binder-like venv
# build (binder_venv, for test_binder.py) and the workshop notebooks' runs (notebook_runs, for test_notebooks.py).
VENV_TEST = "test_a_venv_built_as_binder_builds_it_imports_every_notebooks_imports"
RUN_TEST = "test_notebook_runs_top_to_bottom"


def _start_background_runs(session):
    if session.config.option.collectonly:
        return
    if any(item.name == VENV_TEST for item in session.items):
        from binder_venv import BUILD

        BUILD.start()
    names = [
        item.callspec.params["name"]
        for item in session.items
        if getattr(item, "originalname", None) == RUN_TEST and hasattr(item, "callspec")
    ]
    if not names:
        return
    from notebook_runs import RUNS, missing_apis

    RUNS.start([name for name in dict.fromkeys(names) if not missing_apis(name)])


def pytest_collection_finish(session):
    _start_background_runs(session)
    # What the session imported to collect the tests (torch, transformers, memlab, ...) lives until the end and
    # holds no garbage: freeze it out of the collector's generations, so that every full gc.collect() walks only
    # what the tests made since. memlab scans the live objects once per CPU measurement session and tests count
    # live tensors; over the whole library heap those collections were half of the integration tests' CPU time.
    # The frozen objects are no longer listed by gc.get_objects(): the only tensors among them are library
    # constants (bitsandbytes' 16-entry NF4/FP4 tables and two scalars), which CPU trials then leave out of "other".
    _import_what_trials_import_lazily()
    gc.collect()
    gc.freeze()


# Libraries memlab imports only when a trial needs them (import memlab stays light). Imported after the freeze they
# would stay outside it, and every CPU measurement's scan of the live objects would walk their hundreds of thousands
# of functions and classes again; imported here, with the session's heap, they are frozen with it.
_LAZY = (
    "peft", "peft.tuners.lora", "bitsandbytes", "bitsandbytes.optim", "accelerate", "torch.distributed.fsdp",
    "torch._inductor", "networkx", "torch.utils.checkpoint", "torch._functorch.aot_autograd",
    # memlab's own names, which `import memlab` imports on first use
    *(f"memlab.{name}" for name in ("estimation", "runner.trial", "runner.apply", "search", "inference", "report")),
)


def _import_what_trials_import_lazily() -> None:
    import importlib
    import importlib.util

    for name in _LAZY:
        if importlib.util.find_spec(name.split(".")[0]) is not None:
            importlib.import_module(name)


def pytest_runtest_setup(item):
    # Each test starts with what earlier tests left alive frozen out of the collector, for the reason above: a CPU
    # trial's scan of live objects then walks only what this test made (what earlier tests left made those scans a
    # third of the integration tests' time). Tensors that earlier tests left alive are then not "held" memory of
    # this test's trials, as they would not be in a fresh kernel; what this test makes still is.
    gc.collect()
    gc.freeze()


# Packages some tests need that `pip install -e ".[test]"` does not install, and how to get each. A test marked
# @pytest.mark.needs("name") is skipped with this reason where the package is missing, so that the README's test
# command passes on a fresh machine; .ci/run installs them afterwards and runs exactly these tests (`-m needs`).
OPTIONAL = {
    "deepspeed": "pip install deepspeed (DS_BUILD_OPS=0 is enough for its config parser; .ci/run installs it)",
}


# The fixtures that start JupyterLab or headless Chromium (tests/browser_lab.py).
_BROWSER_FIXTURES = frozenset({"lab", "chromium", "jupyter_server", "lab_with_memfit_and_panel"})


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    import importlib.util

    for item in items:
        # Under xdist (--dist loadgroup), a test file's tests run in one worker, so that its module-scoped fixtures
        # (the models several tests share) are built once; the browser tests share one JupyterLab and Chromium.
        if _BROWSER_FIXTURES & set(getattr(item, "fixturenames", ())) and not item.get_closest_marker("browser"):
            item.add_marker(pytest.mark.browser)  # a test that starts JupyterLab or Chromium is a browser test
        if item.get_closest_marker("browser") and not item.get_closest_marker("e2e"):
            item.add_marker(pytest.mark.e2e)  # before pytest's -m deselects by the markers (this hook runs first)
        if item.get_closest_marker("xdist_group") is None:
            group = "browser" if item.get_closest_marker("browser") else item.nodeid.split("::")[0]
            item.add_marker(pytest.mark.xdist_group(group))
        for marker in item.iter_markers("needs"):
            missing = [name for name in marker.args if importlib.util.find_spec(name) is None]
            if missing:
                how = {name: OPTIONAL.get(name, f"pip install {name}") for name in missing}
                reason = "; ".join(f"needs {name}, outside the [test] extra: {how[name]}" for name in missing)
                item.add_marker(pytest.mark.skip(reason=reason))
    items[:] = _in_scheduling_order(items)


def _in_scheduling_order(items):
    """The tests as xdist hands their groups out (pyproject.toml runs it with --no-loadscope-reorder): the browser
    tests first, then the other groups largest first (xdist's own order). The browser group is few tests but minutes
    long, mostly waiting on JupyterLab's kernels and Chromium: handed out last, as xdist's largest-first order did,
    it ran while the other worker had little left, and both cores waited; first, it runs beside the CPU-bound rest.

    Example:
        >>> class Item:
        ...     def __init__(self, group): self.group = group
        ...     def get_closest_marker(self, name): return pytest.mark.xdist_group(self.group).mark
        >>> [item.group for item in _in_scheduling_order([Item("a"), Item("b"), Item("browser"), Item("b")])]
        ['browser', 'b', 'b', 'a']
    """
    def group(item):
        return item.get_closest_marker("xdist_group").args[0]

    sizes = collections.Counter(group(item) for item in items)
    return sorted(items, key=lambda item: (group(item) != "browser", -sizes[group(item)]))


@pytest.fixture(scope="module", autouse=True)
def _answers_kept_apart_per_module(tmp_path_factory):
    # memlab estimate keeps its dry runs' answers in the user's cache (memlab/estimation/answers.py): every test module
    # (its module-scoped fixtures run the command before any test's fixture) and every test gets an empty folder of
    # its own, which subprocesses inherit, so that no test writes to the real home cache and none finds a question
    # another test asked answered without its dry runs (pytest_configure covers what runs before these).
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ANSWERS_ENV, str(tmp_path_factory.mktemp("memlab-cache-module")))
        yield


@pytest.fixture(autouse=True)
def _answers_kept_apart(tmp_path_factory, monkeypatch):
    monkeypatch.setenv(ANSWERS_ENV, str(tmp_path_factory.mktemp("memlab-cache")))


@pytest.fixture(autouse=True)
def _no_module_hooks_left_behind():
    # memlab hooks every module while it records a step (the timeline's module watch, the trainer's watch): a test
    # that leaves a global hook behind has found a path where a user's kernel keeps it, slowing every forward after.
    from torch.nn.modules import module

    hook_tables = (module._global_forward_pre_hooks, module._global_forward_hooks,
                   module._global_backward_pre_hooks, module._global_backward_hooks)
    before = [set(table) for table in hook_tables]
    yield
    leaked = [hook for table, kept in zip(hook_tables, before, strict=True)
              for key, hook in list(table.items()) if key not in kept]
    for table, kept in zip(hook_tables, before, strict=True):
        for key in [key for key in table if key not in kept]:
            del table[key]  # so that the tests after this one run as on a clean kernel
    if leaked:
        pytest.fail(f"the test left global module hooks behind: {leaked}")
