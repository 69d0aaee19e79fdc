"""Issue 6: binder/ holds what repo2docker needs to open the cookbook on a CPU-only Binder.

A binder/ folder makes repo2docker ignore the configuration files at the repository root (pyproject.toml
included), so these files alone must install a CPU torch and memlab itself.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
BINDER = ROOT / "binder"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
INDEX_OPTIONS = ("--extra-index-url", "--index-url")


def requirement_lines() -> tuple[list[Requirement], dict[str, list[str]]]:
    """The requirements and the pip options of binder/requirements.txt; anything else fails the test."""
    requirements: list[Requirement] = []
    options: dict[str, list[str]] = {}
    for number, raw in enumerate((BINDER / "requirements.txt").read_text().splitlines(), start=1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-"):
            name, _, value = line.partition(" ")
            assert name in INDEX_OPTIONS, f"line {number}: only index options belong here, not {name}"
            options.setdefault(name, []).append(value.strip())
            continue
        try:
            requirements.append(Requirement(line))
        except InvalidRequirement as error:
            pytest.fail(f"binder/requirements.txt line {number} is not a requirement: {line!r} ({error})")
    return requirements, options


def pyproject_dependencies() -> dict[str, Requirement]:
    """memlab's own dependencies (from the installed metadata, which pyproject.toml wrote), extras left out."""
    requirements = [Requirement(text) for text in metadata.requires("memlab") or []]
    return {r.name: r for r in requirements if r.marker is None}


def test_binder_has_what_repo2docker_reads_and_nothing_that_would_override_it():
    assert (BINDER / "requirements.txt").is_file()
    assert (BINDER / "postBuild").is_file()
    # environment.yml would make repo2docker use conda and skip requirements.txt; a Dockerfile skips everything.
    for overriding in ("environment.yml", "Dockerfile", "Pipfile", "setup.py"):
        assert not (BINDER / overriding).exists(), f"binder/{overriding} would change what repo2docker builds"


def test_every_requirement_line_parses():
    requirements, _ = requirement_lines()
    assert requirements
    assert len({r.name for r in requirements}) == len(requirements), "a package is listed twice"


def test_torch_is_pinned_to_a_cpu_build():
    requirements, options = requirement_lines()
    torch = [r for r in requirements if r.name == "torch"]
    assert len(torch) == 1, "binder/requirements.txt must pin torch"
    specifiers = list(torch[0].specifier)
    assert len(specifiers) == 1 and specifiers[0].operator == "==", f"pin one torch version: {torch[0]}"
    version = Version(specifiers[0].version)
    assert version.local == "cpu", f"pin the CPU build, e.g. torch=={version.public}+cpu"
    assert CPU_INDEX in options.get("--extra-index-url", []) + options.get("--index-url", []), (
        f"the CPU builds of torch come from {CPU_INDEX}; add --extra-index-url {CPU_INDEX}"
    )
    assert pyproject_dependencies()["torch"].specifier.contains(version.public), "the pin must satisfy pyproject"


def test_pins_satisfy_the_package_dependencies():
    """pip must not replace a pinned package (the CPU torch above all) when postBuild installs memlab."""
    requirements, _ = requirement_lines()
    wanted = pyproject_dependencies()
    for requirement in requirements:
        if requirement.name in wanted:
            for specifier in requirement.specifier:
                pinned = Version(specifier.version).public
                assert wanted[requirement.name].specifier.contains(pinned), f"{requirement} vs pyproject"


def test_runtime_names_a_python_the_package_supports():
    runtime = BINDER / "runtime.txt"
    if not runtime.exists():
        pytest.skip("no runtime.txt: repo2docker's default Python")
    match = re.fullmatch(r"python-(3\.\d+)", runtime.read_text().strip())
    assert match, "runtime.txt holds one line such as python-3.11"
    requires = metadata.metadata("memlab")["Requires-Python"]
    assert SpecifierSet(requires).contains(match.group(1) + ".0"), f"python-{match.group(1)} vs {requires}"


def postbuild_commands() -> list[list[str]]:
    commands = []
    for line in (BINDER / "postBuild").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            commands.append(shlex.split(line, comments=True))
    return commands


def test_postbuild_is_an_executable_bash_script_that_stops_on_the_first_error():
    text = (BINDER / "postBuild").read_text()
    assert text.startswith("#!/bin/bash\n") or text.startswith("#!/usr/bin/env bash\n"), "start with a shebang"
    assert postbuild_commands()[0] == ["set", "-e"], "the first command must be set -e"
    assert os.access(BINDER / "postBuild", os.X_OK), "chmod +x binder/postBuild"


def test_postbuild_installs_the_package_itself_from_the_repository_root():
    installs = []
    for words in postbuild_commands():
        if "pip" in words and "install" in words:
            after = words[words.index("install") + 1 :]
            installs.append([word for word in after if not word.startswith("--") or word == "-e"])
    assert any("." in args or ".[" in " ".join(args) for args in installs), (
        f"postBuild must pip install the repository (pip install -e .); it runs {installs}"
    )
    assert not any("torch" in " ".join(args) for args in installs), "torch comes from requirements.txt (CPU build)"


def postbuild_extras_installed() -> list[Requirement]:
    """The project's own installs in postBuild (``pip install -e ".[lab]"``), as requirements of memlab."""
    return [
        Requirement(word.replace(".", "memlab", 1))
        for words in postbuild_commands()
        if "pip" in words and "install" in words
        for word in words
        if word.startswith(".[")
    ]


def test_postbuild_installs_the_lab_extra():
    """The core leaves JupyterLab to the person's own Jupyter; on Binder the lab extra brings it and a kernel."""
    installed = postbuild_extras_installed()
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "lab" in extras, "pyproject has no lab extra"
    with_lab = {"lab"} | {name for name, items in extras.items() if any("memlab[lab]" in item for item in items)}
    assert any(with_lab & requirement.extras for requirement in installed), 'postBuild must install the lab extra'
    assert "jupyterlab" in {Requirement(text).name for text in extras["lab"]}


def test_start_hands_over_to_the_server_with_a_sane_thread_count():
    """binder/start (run at every session start) matches torch's threads to the CPUs the container may use."""
    start = BINDER / "start"
    if not start.exists():
        pytest.skip("no binder/start")
    text = start.read_text()
    assert text.startswith("#!/bin/bash\n") and os.access(start, os.X_OK)
    assert text.rstrip().endswith('exec "$@"'), 'binder/start must end with exec "$@" (it wraps the server)'
    env = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}
    for limit, most in ((None, os.cpu_count() or 1), ("0.5", 1), ("1", 1)):
        if limit is not None:
            env["CPU_LIMIT"] = limit
        shown = subprocess.run(
            [str(start), "bash", "-c", 'echo "$OMP_NUM_THREADS"'], env=env, capture_output=True, text=True, check=True
        ).stdout.strip()
        assert shown.isdigit() and 1 <= int(shown) <= most, (limit, shown)
    kept = subprocess.run(
        [str(start), "bash", "-c", 'echo "$OMP_NUM_THREADS"'],
        env={**env, "OMP_NUM_THREADS": "3"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert kept == "3", "a thread count the user set is kept"


def test_postbuild_installs_the_workshop_extra_with_what_the_notebooks_import_beyond_the_core():
    installed = postbuild_extras_installed()
    assert any("workshop" in requirement.extras for requirement in installed), 'pip install -e ".[workshop]"'
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {"trl", "datasets"} <= {Requirement(text).name for text in extras["workshop"]}


@pytest.mark.e2e
@pytest.mark.timeout(960)
def test_a_venv_built_as_binder_builds_it_imports_every_notebooks_imports():
    """Issue 39: a fresh venv (no system site-packages), ``pip install -r binder/requirements.txt``, then
    ``binder/postBuild`` (``tests/binder_venv.py``); in it every module a notebook imports imports, and JupyterLab
    and a Python kernel are there. Started in the background at collection: about two minutes of pip."""
    from binder_venv import BUILD, notebook_imports

    status = BUILD.wait()
    assert status == 0, BUILD.tail()
    python = BUILD.venv / "bin" / "python"
    config = (BUILD.venv / "pyvenv.cfg").read_text()
    assert "include-system-site-packages = false" in config  # nothing of the test environment leaks in
    modules = notebook_imports()
    assert {"memlab", "torch", "transformers", "trl", "datasets"} <= set(modules), modules
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    module = importlib.import_module(name)\n"
        "    where = getattr(module, '__file__', None) or ''\n"
        "    ours = name in sys.stdlib_module_names or name == 'memlab' or where.startswith(sys.prefix)\n"
        "    assert ours, (name, where)\n"
        "import torch; assert torch.__version__.endswith('+cpu'), torch.__version__\n"
        "print('imported', len(" + repr(modules) + "))"
    )
    imported = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=300,
                              env=BUILD.environment(), cwd=BUILD.folder)
    assert imported.returncode == 0, imported.stderr[-3000:]
    lab = subprocess.run([str(BUILD.venv / "bin" / "jupyter"), "lab", "--version"], capture_output=True, text=True,
                         timeout=120, env=BUILD.environment())
    assert lab.returncode == 0 and lab.stdout.strip().startswith("4."), lab.stderr[-2000:]
    kernels = subprocess.run([str(BUILD.venv / "bin" / "jupyter"), "kernelspec", "list"], capture_output=True,
                             text=True, timeout=120, env=BUILD.environment())
    assert "python3" in kernels.stdout and str(BUILD.venv) in kernels.stdout, kernels.stdout
    print(f"Binder-like venv built in {BUILD.seconds:.0f} s")


def test_the_readme_sends_people_to_the_notebooks_with_a_command_that_installs_jupyterlab():
    """Issue 39: the README's workshop paragraph names the command that installs what the notebooks need, JupyterLab
    included, and opens them; the extra it names brings JupyterLab and what Binder installs."""
    import tomllib

    readme = (ROOT / "README.md").read_text()
    workshop = readme[readme.index("## Workshop"):]
    workshop = workshop[: workshop.index("\n## ", 1)]
    command = next(line for line in workshop.splitlines() if line.startswith("pip install ") and "jupyter lab" in line)
    extra = re.search(r'-e "\.\[(\w+)\]"', command)
    assert extra and command.endswith("jupyter lab notebooks"), command
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "memlab[lab]" in extras[extra.group(1)] and "jupyterlab" in " ".join(extras["lab"])
    assert f'.[{extra.group(1)}]' in (BINDER / "postBuild").read_text()  # the same set as Binder's
