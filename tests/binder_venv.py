"""A fresh virtual environment built the way Binder builds the workshop's (for ``tests/test_binder.py``).

repo2docker installs ``binder/requirements.txt`` with pip, then runs ``binder/postBuild`` from the repository root.
:class:`BinderBuild` does the same in a new venv of its own (``python -m venv``, without the system's site-packages,
so nothing of the test environment leaks in): ``VENV/bin/pip install -r binder/requirements.txt``, then ``bash
binder/postBuild`` with the venv first on ``PATH`` (its ``pip`` and ``python`` are the venv's). The build takes about
two minutes (torch's CPU wheel is most of it), so the session starts it in the background once it has collected the
test (``tests/conftest.py``), and the test waits for it; run alone, the test starts it itself.

Here pip finds its packages in the machine's local wheel folder and index (its pip configuration) and on PyPI; the
PyTorch CPU index that ``requirements.txt`` names is not reachable from CI, so pip is told not to retry it
(``PIP_RETRIES=0``): the same torch CPU wheel comes from the local folder instead. Nothing else differs from Binder.
"""

from __future__ import annotations

import ast
import json
import os
import sys
import time
from pathlib import Path

import background

ROOT = Path(__file__).resolve().parents[1]
BUILD_LIMIT_S = 900
"""The longest the build may take (it took 124 s on a 2-core machine at load 3 to 5, 2026-11-24)."""


def notebook_imports() -> list[str]:
    """Every top-level module a workshop notebook imports (from its code cells; magics and shell lines left out).

    Example:
        >>> "memlab" in notebook_imports() and "trl" in notebook_imports()
        True
    """
    found: set[str] = set()
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            source = "".join(cell["source"])
            lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
            for node in ast.walk(ast.parse("\n".join(lines))):
                if isinstance(node, ast.Import):
                    found.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    found.add(node.module.split(".")[0])
    return sorted(found)


class BinderBuild:
    """The background build: :meth:`start` (once per session, whichever pytest-xdist worker comes first:
    :mod:`background`), :meth:`wait` for its exit status. The session's end removes it (``tests/conftest.py``)."""

    def __init__(self) -> None:
        self.folder: Path | None = None
        self.seconds: float | None = None

    @property
    def venv(self) -> Path:
        assert self.folder is not None
        return self.folder / "venv"

    @property
    def log(self) -> Path:
        assert self.folder is not None
        return self.folder / "build.log"

    def environment(self) -> dict[str, str]:
        """The build's environment: this one with the venv first on PATH, nothing of this Python's paths."""
        env = {key: value for key, value in os.environ.items()
               if key not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PIP_REQUIRE_VIRTUALENV")}
        env.update(VIRTUAL_ENV=str(self.venv), PATH=f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
                   PIP_RETRIES="0")
        return env

    def start(self) -> None:
        self.folder = background.shared_folder() / "binder"
        self.folder.mkdir(exist_ok=True)
        build = (
            f"{sys.executable} -m venv {self.venv} && "
            "pip install -r binder/requirements.txt && "
            "bash binder/postBuild"
        )
        # The exit status lands in a file, for whichever worker runs the test to read.
        script = f"date +%s.%N > {self.folder / 'started'}; ({build}); echo $? > {self.folder / 'status'}"
        background.start_once("binder", ["bash", "-c", script], cwd=ROOT, env=self.environment(), log=self.log)

    def wait(self) -> int:
        """The build's exit status (starting it if no one did), waiting at most :data:`BUILD_LIMIT_S` from its
        start."""
        self.start()
        assert self.folder is not None
        status, started = self.folder / "status", self.folder / "started"
        waited = time.monotonic()
        while not status.exists():
            if not background.running("binder") and not status.exists():
                return -1  # ended without writing its status: killed
            if time.monotonic() - waited > BUILD_LIMIT_S:
                raise TimeoutError(f"the Binder-like venv build took over {BUILD_LIMIT_S} s")
            time.sleep(0.5)
        time.sleep(0.1)  # written by echo: complete once the file is closed
        if started.exists():
            self.seconds = status.stat().st_mtime - float(started.read_text())
        return int(status.read_text().strip() or -1)

    def tail(self, characters: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-characters:] if self.folder is not None else ""


BUILD = BinderBuild()
