"""Background jobs that a test session starts once, however many processes run it.

The suite runs in pytest-xdist workers (``-n auto`` in ``pyproject.toml``), each of which collects every test. A job
that takes minutes (the notebook runner, the Binder-like venv build) must still start only once: the process that
configures the session first (xdist's controller, or the only process) makes one shared folder and puts its path in
``MEMLAB_TEST_SHARED``, which the workers inherit; a job's first claimant starts it there, in a process group of its
own, and every process reads its results from there. The same process that made the folder stops every job and
removes the folder when the session ends (``tests/conftest.py``), after the last worker is done with it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

SHARED_ENV = "MEMLAB_TEST_SHARED"


def shared_folder() -> Path:
    """The session's shared folder (made here when no session made one: a test module run by hand)."""
    path = os.environ.get(SHARED_ENV)
    if not path:
        path = os.environ[SHARED_ENV] = tempfile.mkdtemp(prefix="memlab-tests-")
    return Path(path)


def claim(folder: Path, name: str) -> bool:
    """Whether this process is the first to claim ``name`` in ``folder`` (the claim is a file created exclusively)."""
    try:
        os.close(os.open(folder / f"{name}.claim", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def start_once(name: str, command: Sequence[str], *, cwd: Path, env: dict[str, str], log: Path) -> bool:
    """Start ``command`` in the background unless a process of this session already did (True where this one did).
    Its process id is kept in the shared folder, for :func:`running` and :func:`stop_all`."""
    folder = shared_folder()
    if not claim(folder, f"job-{name}"):
        return False
    with open(log, "ab") as output:
        process = subprocess.Popen(list(command), cwd=cwd, env=env, stdout=output, stderr=subprocess.STDOUT,
                                   start_new_session=True)  # its own group: stop_all() ends its children too
    (folder / f"job-{name}.pid").write_text(str(process.pid))
    return True


def _pid(name: str) -> int | None:
    path = shared_folder() / f"job-{name}.pid"
    for _ in range(50):  # claimed a moment ago, its process id not written yet
        if path.exists() and path.read_text().strip():
            return int(path.read_text())
        if not (shared_folder() / f"job-{name}.claim").exists():
            return None
        time.sleep(0.1)
    return None


def running(name: str) -> bool:
    """Whether the job ``name`` is still running (False where it ended, or was never started). A job that ended is a
    zombie until its parent reaps it, and the parent may be another worker: /proc says which it is."""
    pid = _pid(name)
    if pid is None:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def stop_all(folder: Path) -> None:
    """End every job started in ``folder`` (its whole process group) and remove the folder."""
    for pid_file in folder.glob("job-*.pid"):
        try:
            pid = int(pid_file.read_text())
            os.killpg(pid, signal.SIGTERM)
        except (ValueError, ProcessLookupError, PermissionError):
            continue
        for _ in range(300):
            try:
                os.waitpid(pid, os.WNOHANG)  # reaped where this process started it (a zombie still has a group)
            except ChildProcessError:
                pass
            try:
                os.killpg(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    shutil.rmtree(folder, ignore_errors=True)
