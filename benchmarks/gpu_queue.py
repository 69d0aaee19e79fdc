"""What the GPU acceptance run (:mod:`benchmarks.gpu_acceptance`) decides before it runs a part: which parts are stale,
the order the run takes them in, and the wheels a lent GPU machine lacks.

**Stale first.** Every part declares the paths it checks (its own benchmark module and the memlab packages it
exercises: ``Part.checks`` in :mod:`benchmarks.gpu_acceptance`). Its newest run is read from every result of the run
(:func:`history`: ``benchmarks/results/gpu_acceptance-cuda-*.json``, and where this machine has them the older runs
under :data:`SHARED_RUNS`) and compared with the code here (:class:`CodeState`):

- a run written since issue 86 records, for each part, the digest of the files under its paths (:func:`code_digest`)
  and the commit it ran at: the part is stale where today's digest differs, with or without git;
- an older run records neither: its commit is taken to be the newest commit on HEAD's first-parent line made before
  the run's date (what was not committed yet at the run is not counted), and the part is stale where ``git log
  <commit>..HEAD -- <paths>`` lists a commit;
- where neither can say (the GPU machine gets the working tree without ``.git``), the verdict that ``--prepare`` wrote
  here into ``.gpu/checkout.json`` (carried with the wheels) for the same digest and the same newest run; else
  unknown, which counts as changed.

Then :func:`queue` puts the parts in :data:`TIERS`, each tier in the run's own order of parts: a failed part whose
code changed since (a fix waits to be seen) first, then the parts never judged on a GPU (new, or skipped for a missing
library), then those that passed but whose code changed since, then the failed ones whose code did not change (a
rerun says only whether the failure was chance), and last those that passed on the code there is now.

**Wheels.** The GPU image has torch, transformers, accelerate and peft (of an unknown release), but not bitsandbytes,
TRL, ``datasets``, torchao or liger-kernel (/work/.library/device/KINDS.md). :data:`WHEELS` pins each, ``--prepare``
downloads them here with ``pip download --no-deps --only-binary=:all:`` for Python 3.12 on manylinux x86-64 into
``.gpu/wheels/`` (ignored by git, carried by the device tool), and :func:`install` puts a part's into one target
folder with ``pip install --no-index --no-deps --target`` before the first part that needs them. bitsandbytes' wheel
(43 MB, a library for every CUDA and ROCm release) is slimmed to its CUDA 13 libraries (:func:`slim_bitsandbytes`:
the GPU image's torch is 2.11.0+cu130, and bitsandbytes loads the library of torch's CUDA major release only), so
that the working tree and the wheels stay well under the 64 MiB a call carries.

Run from the repository root, before a call to the GPU machine (the command line is
:mod:`benchmarks.gpu_acceptance`'s, which declares the parts)::

    python -m benchmarks.gpu_acceptance --prepare   # the wheels, .gpu/checkout.json, the queue and what a call carries
    python -m benchmarks.gpu_acceptance --queue     # the queue only
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import importlib
import json
import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
SHARED_RUNS = Path("/work/shared/gpu-runs")
"""Older runs kept beside the checkout on this workplace's machines (read where the folder exists)."""
CARRIED = ROOT / ".gpu"
"""The one ignored folder a call to the GPU machine carries (``carry=[".gpu"]``): the wheels and the checkout."""
WHEEL_FOLDER = CARRIED / "wheels"
CHECKOUT = CARRIED / "checkout.json"
SITE = Path("/tmp/memlab-gpu-site")
"""Where :func:`install` puts the wheels on the GPU machine (on ``PYTHONPATH`` for every part after)."""
CARRY_LIMIT = 64 * 2**20
"""What one call may carry: the working tree and the carried folders together (the device README's limit)."""

WHEELS = {"peft": "0.21.2", "bitsandbytes": "0.50.2", "trl": "1.16.0", "datasets": "5.2.0", "dill": "0.4.1",
          "multiprocess": "0.70.19", "torchao": "0.18.0", "liger-kernel": "0.8.5"}
"""The releases carried to the GPU machine: those CI's stacks run (peft, bitsandbytes, TRL and what ``datasets``
needs beyond the image) and the kernels' libraries issues 69 and 83 measure (torchao's float8, Liger)."""
BASE = ("peft", "bitsandbytes")
"""Installed before the first part: every part imports memlab, which refuses a peft older than 0.21.2, and most run
8-bit AdamW or a 4-bit load."""
TRL = ("trl", "datasets", "dill", "multiprocess")
"""What a TRL trainer needs beyond the image (``datasets`` needs dill and multiprocess; the rest is there)."""
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")
CUDA_MAJOR = "13"
"""The CUDA release of the GPU image's torch (2.11.0+cu130): the bitsandbytes libraries kept."""

TIERS = ("failed, changed since", "never judged", "passed, changed since", "failed, unchanged since",
         "passed, unchanged since")
"""The queue's tiers, first to last (:func:`queue`)."""


# --- the runs ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PartRun:
    """One part's result in one committed run."""

    part: str
    date: str
    """When the part ran (ISO, UTC): its own date where recorded, else its run's (or the run it was kept from)."""
    verdict: str
    """``"passed"`` (no check failed, some passed), ``"failed"`` (a check failed, or the part was cut or raised) or
    ``"not judged"`` (every check None: a library missing, a CPU figure; or cut by the run's deadline before a check
    failed)."""
    passed: int
    failed: int
    device: str
    source: str
    """The result file's name."""
    commit: str | None = None
    """The commit the run recorded (runs since issue 86), else None."""
    digest: str | None = None
    """The digest of the part's paths when it ran (:func:`code_digest`; runs since issue 86), else None."""


def verdict(checks: Sequence[Mapping[str, Any]]) -> str:
    """A part's verdict from its checks.

    Example:
        >>> verdict([{"passed": True}, {"passed": None}]), verdict([{"passed": True}, {"passed": False}])
        ('passed', 'failed')
        >>> verdict([{"passed": None}]), verdict([])
        ('not judged', 'not judged')
    """
    marks = [check.get("passed") for check in checks]
    if False in marks:
        return "failed"
    return "passed" if True in marks else "not judged"


def runs_in(result: Mapping[str, Any], source: str) -> list[PartRun]:
    """The parts a result ran (not those its deadline left out, nor those it could not run), each with its own
    date; a part the run's deadline cut is judged by the checks it printed (none failed: not judged, so that the
    next run takes it among the parts never judged)."""
    kept = result.get("kept_from") or {}
    device = result.get("device", {})
    found = []
    for name, part in result.get("parts", {}).items():
        if part.get("not_started") or part.get("unavailable"):
            continue
        date = part.get("date") or (kept.get("date") if name in kept.get("parts", ()) else None) or result["date"]
        checks = part.get("checks", [])
        judged = verdict(checks)
        if part.get("cut_by_deadline"):  # an unfinished run: failed where a check it printed failed, else unjudged
            printed = [check for check in checks if not check.get("check", "").endswith("ran to the end")]
            judged = "failed" if verdict(printed) == "failed" else "not judged"
        found.append(PartRun(
            part=name, date=date, verdict=judged, passed=sum(c.get("passed") is True for c in checks),
            failed=sum(c.get("passed") is False for c in checks), device=device.get("gpu") or device.get("type", "?"),
            source=source, commit=part.get("commit") or result.get("commit"), digest=part.get("code_digest")))
    return found


def history(folders: Iterable[Path]) -> dict[str, list[PartRun]]:
    """Every part's runs on a GPU at the full size, oldest first, from the acceptance results in ``folders`` (a
    folder that does not exist is passed over; a run found twice counts once)."""
    seen: dict[tuple[str, str, str], PartRun] = {}
    for folder in folders:
        if not folder.is_dir():
            continue
        for path in sorted(folder.rglob("*.json")):
            try:
                result = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if not isinstance(result, dict) or result.get("benchmark") != "gpu_acceptance":
                continue
            if result.get("device", {}).get("type") != "cuda" or result.get("size") != "full":
                continue
            for run in runs_in(result, path.name):
                seen.setdefault((run.part, run.date, run.device), run)
    runs: dict[str, list[PartRun]] = {}
    for run in sorted(seen.values(), key=lambda r: _when(r.date)):
        runs.setdefault(run.part, []).append(run)
    return runs


def newest(runs: Mapping[str, Sequence[PartRun]]) -> dict[str, PartRun]:
    """Each part's newest run."""
    return {name: max(found, key=lambda r: _when(r.date)) for name, found in runs.items() if found}


def _when(date: str) -> datetime.datetime:
    moment = datetime.datetime.fromisoformat(date)
    return moment if moment.tzinfo else moment.replace(tzinfo=datetime.timezone.utc)


# --- the code ---------------------------------------------------------------------------------------------------


def code_files(paths: Iterable[str], root: Path = ROOT) -> list[str]:
    """The files under ``paths`` (files or folders, from ``root``), as sorted relative paths; bytecode left out."""
    found: set[str] = set()
    for path in paths:
        where = root / path
        if where.is_file():
            found.add(path)
        elif where.is_dir():
            found |= {file.relative_to(root).as_posix() for file in where.rglob("*")
                      if file.is_file() and "__pycache__" not in file.parts and file.suffix not in (".pyc", ".pyo")}
    return sorted(found)


def code_digest(paths: Iterable[str], root: Path = ROOT) -> str:
    """A digest of the files under ``paths`` (their names and bytes): equal where the code a part checks is.

    Example:
        >>> code_digest(["benchmarks/gpu_queue.py"]) == code_digest(["benchmarks/gpu_queue.py", "no/such/file"])
        True
    """
    digest = hashlib.sha256()
    for relative in code_files(paths, root):
        digest.update(relative.encode() + b"\0" + (root / relative).read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def git(root: Path, *arguments: str) -> str | None:
    """``git arguments`` in ``root``: its output, or None where git or the repository is missing or it failed."""
    try:
        done = subprocess.run(["git", "-C", str(root), *arguments], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def head(root: Path = ROOT) -> dict[str, Any]:
    """The commit the checkout is at and the files it changes beyond it (git's), or what ``--prepare`` wrote into
    ``.gpu/checkout.json`` where there is no git (the GPU machine), or nothing known."""
    commit = git(root, "rev-parse", "HEAD")
    if commit is not None:
        changed = git(root, "diff", "--name-only", "HEAD") or ""
        return {"commit": commit, "commit_from": "git", "changed_files": changed.splitlines()}
    prepared = read_checkout(root / CHECKOUT.relative_to(ROOT))
    if prepared.get("commit"):
        return {"commit": prepared["commit"], "commit_from": f"{CHECKOUT.relative_to(ROOT)} ({prepared['written']})",
                "changed_files": prepared.get("changed_files", [])}
    return {"commit": None, "commit_from": None, "changed_files": None}


def read_checkout(path: Path = CHECKOUT) -> dict[str, Any]:
    """What ``--prepare`` wrote (:func:`write_checkout`), or nothing where it did not."""
    try:
        found: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return found


class CodeState:
    """Whether the code a part checks changed since one of its runs (:meth:`changed`), asked of the digest the run
    recorded, else of git, else of what ``--prepare`` found here; digests and git's answers kept."""

    def __init__(self, root: Path = ROOT, prepared: Mapping[str, Any] | None = None) -> None:
        self.root = root
        self.git = git(root, "rev-parse", "--is-inside-work-tree") == "true"
        self.prepared = dict(prepared if prepared is not None else read_checkout(root / CHECKOUT.relative_to(ROOT)))
        self._digests: dict[tuple[str, ...], str] = {}
        self._before: dict[str, str | None] = {}

    def digest(self, paths: Sequence[str]) -> str:
        key = tuple(paths)
        if key not in self._digests:
            self._digests[key] = code_digest(paths, self.root)
        return self._digests[key]

    def commit_before(self, date: str) -> str | None:
        """The newest commit on HEAD's first-parent line made before ``date`` (None without git, or none then)."""
        if date not in self._before:
            found = git(self.root, "rev-list", "-1", "--first-parent", f"--before={date}", "HEAD") if self.git else None
            self._before[date] = found or None
        return self._before[date]

    def changed(self, name: str, paths: Sequence[str], run: PartRun) -> tuple[bool | None, str]:
        """Whether the files under ``paths`` changed since ``run`` (None: cannot be told), and how that was told."""
        if run.digest is not None:
            same = run.digest == self.digest(paths)
            return not same, "its code is as it ran" if same else "its code changed since (digest)"
        if self.git:
            commit = run.commit or self.commit_before(run.date)
            if commit is None:
                return None, "no commit before its run"
            since = git(self.root, "log", "--format=%h", f"{commit}..HEAD", "--", *paths)
            if since is None:
                return None, f"git log {commit[:7]}..HEAD failed"
            commits = since.split()
            at = f"{commit[:7]}{'' if run.commit else ' (the last commit before it)'}"
            if not commits:
                return False, f"no commit since {at} touches its paths"
            return True, f"{len(commits)} commit(s) since {at} touch its paths (newest {commits[0]})"
        told = self.prepared.get("parts", {}).get(name)
        if told and told.get("digest") == self.digest(paths) and told.get("run") == run.date:
            return told.get("changed"), f"{told.get('why')} (as --prepare found it, {self.prepared.get('written')})"
        return None, "unknown: no digest in its run, no git here and no --prepare for this code"


# --- the queue --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Queued:
    """A part's place in the run: its tier (:data:`TIERS`) and why."""

    part: str
    tier: int
    why: str

    def as_json(self) -> dict[str, Any]:
        return {"part": self.part, "tier": self.tier, "tier_name": TIERS[self.tier], "why": self.why}


Changed = Callable[[str, PartRun], tuple[bool | None, str]]


def queue(order: Sequence[str], latest: Mapping[str, PartRun], changed: Changed) -> list[Queued]:
    """The parts of ``order`` by tier (:data:`TIERS`), ``order`` kept within a tier. ``latest``: each part's newest
    run; ``changed(part, run)``: whether its code changed since that run (None: unknown, counted as changed).

    Example:
        >>> runs = {name: PartRun(name, "2026-11-27T00:00:00+00:00", result, 1, int(result == "failed"), "H200", "x")
        ...         for name, result in (("a", "passed"), ("b", "failed"), ("c", "failed"), ("d", "passed"))}
        >>> moved = {"a": False, "b": False, "c": True, "d": None}
        >>> [(q.part, q.tier) for q in queue("abcde", runs, lambda name, run: (moved[name], "-"))]
        [('c', 0), ('e', 1), ('d', 2), ('b', 3), ('a', 4)]
    """
    queued = []
    for name in order:
        run = latest.get(name)
        if run is None or run.verdict == "not judged":
            why = "never run on a GPU" if run is None else f"not judged in its newest run ({run.source})"
            queued.append(Queued(name, 1, why))
            continue
        moved, because = changed(name, run)
        stale = moved is not False
        tier = (0 if stale else 3) if run.verdict == "failed" else (2 if stale else 4)
        queued.append(Queued(name, tier, f"{run.verdict} on {run.device}, {run.date[:16]} ({run.source}); {because}"))
    return sorted(queued, key=lambda q: q.tier)


# --- the wheels -------------------------------------------------------------------------------------------------


def wheel_for(dist: str, folder: Path = WHEEL_FOLDER) -> Path | None:
    """The carried wheel of ``dist`` at its pinned release (:data:`WHEELS`), or None where it is not in
    ``folder``."""
    stem = re.sub(r"[-_.]+", "_", dist)
    found = sorted(folder.glob(f"{stem}-{WHEELS[dist]}-*.whl")) if folder.is_dir() else []
    return found[0] if found else None


def installed(dist: str) -> str | None:
    """The installed release of ``dist`` on this ``sys.path`` (None where it is not installed)."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def install(dists: Sequence[str], folder: Path = WHEEL_FOLDER, target: Path = SITE) -> list[str]:
    """Put the carried wheels of ``dists`` into ``target`` (``pip install --no-index --no-deps --target``), put
    ``target`` first on this process's path and on ``PYTHONPATH`` for every process started after: what was done,
    as lines to print. A release already installed is left; a wheel not carried is said."""
    said, wheels = [], []
    for dist in dists:
        have = installed(dist)
        if have == WHEELS[dist]:
            continue
        wheel = wheel_for(dist, folder)
        if wheel is None:
            used = f"the installed {have} is used" if have else "none is installed"
            said.append(f"{dist} {WHEELS[dist]}: not carried (in {folder}: python -m benchmarks.gpu_acceptance "
                        f"--prepare); {used}")
        else:
            wheels.append(wheel)
    if not wheels:
        return said
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
               "--no-cache-dir", "--upgrade", "--target", str(target), *map(str, wheels)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    names = ", ".join(wheel.name for wheel in wheels)
    if done.returncode != 0:
        return [*said, f"pip install --no-deps --target {target} {names} failed: {(done.stderr or done.stdout)[-800:]}"]
    if str(target) not in sys.path:
        sys.path.insert(0, str(target))
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if str(target) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(target), *filter(None, paths)])
    importlib.invalidate_caches()
    return [*said, f"installed with --no-deps into {target} (on PYTHONPATH from here on): {names}"]


def fetch(dists: Sequence[str] = tuple(WHEELS), folder: Path = WHEEL_FOLDER) -> list[Path]:
    """Download the wheels of ``dists`` for the GPU machine (CPython 3.12, manylinux x86-64, no dependencies) into
    ``folder``, bitsandbytes' slimmed (:func:`slim_bitsandbytes`); the wheels there, one a dist."""
    folder.mkdir(parents=True, exist_ok=True)
    wanted = [dist for dist in dists if wheel_for(dist, folder) is None]
    if wanted:
        platforms = [argument for platform in PLATFORMS for argument in ("--platform", platform)]
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(folder),
                        *(f"{dist}=={WHEELS[dist]}" for dist in wanted)], check=True, timeout=600)
    bitsandbytes = wheel_for("bitsandbytes", folder)
    if bitsandbytes is not None:
        slim_bitsandbytes(bitsandbytes)
    return [wheel for wheel in (wheel_for(dist, folder) for dist in dists) if wheel is not None]


def slim_bitsandbytes(wheel: Path, keep: str = CUDA_MAJOR) -> list[str]:
    """Rewrite bitsandbytes' wheel in place without the native libraries of other CUDA majors, ROCm and XPU (its
    RECORD rewritten to match): the names taken out (none where it is slim already). bitsandbytes loads the library
    of torch's own CUDA major release only (``cextension.get_cuda_bnb_library_path``), so what stays is what the
    GPU image's torch loads.

    Example (a made-up wheel)::

        slim_bitsandbytes(Path(".gpu/wheels/bitsandbytes-0.50.2-py3-none-manylinux_2_24_x86_64.whl"))
    """
    def dropped(name: str) -> bool:
        found = re.search(r"libbitsandbytes_(cuda|rocm|xpu)(\d+)", name)
        return found is not None and not (found[1] == "cuda" and found[2].startswith(keep))

    with zipfile.ZipFile(wheel) as source:
        names = source.namelist()
        removed = [name for name in names if dropped(name)]
        if not removed:
            return []
        slim = wheel.with_suffix(".slim")
        with zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as target:
            for info in source.infolist():
                if info.filename in removed:
                    continue
                data = source.read(info)
                if info.filename.endswith(".dist-info/RECORD"):
                    lines = data.decode().splitlines()
                    data = ("\n".join(line for line in lines if line.split(",")[0] not in removed) + "\n").encode()
                target.writestr(info, data)
    slim.replace(wheel)
    return removed


def tree_bytes(root: Path = ROOT) -> int | None:
    """What the device tool sends of the checkout: its tracked files and those untracked that git does not ignore
    (None without git)."""
    listed = git(root, "ls-files", "-co", "--exclude-standard")
    if listed is None:
        return None
    return sum((root / name).stat().st_size for name in listed.splitlines() if (root / name).is_file())


def write_checkout(order: Sequence[str], paths: Mapping[str, Sequence[str]], root: Path = ROOT,
                   folder: Path | None = None) -> dict[str, Any]:
    """``.gpu/checkout.json``: the commit here, the files changed beyond it, and each part's digest, newest run and
    whether its code changed since, as git tells here; the GPU machine, which has no git, reads it (:func:`head`,
    :class:`CodeState`)."""
    where = folder or root / CHECKOUT.relative_to(ROOT).parent
    state = CodeState(root, prepared={})
    latest = newest(history(history_folders(root)))
    here = head(root)
    parts: dict[str, Any] = {}
    for name in order:
        entry: dict[str, Any] = {"digest": state.digest(paths[name])}
        if name in latest:
            moved, why = state.changed(name, paths[name], latest[name])
            entry.update(run=latest[name].date, changed=moved, why=why)
        parts[name] = entry
    written = {"written": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "commit": here["commit"], "changed_files": here["changed_files"], "parts": parts}
    where.mkdir(parents=True, exist_ok=True)
    (where / CHECKOUT.name).write_text(json.dumps(written, indent=1) + "\n")
    return written


def history_folders(root: Path = ROOT) -> list[Path]:
    """Where the runs are read from: the committed results, and :data:`SHARED_RUNS` where this machine has it."""
    return [root / RESULTS.relative_to(ROOT), SHARED_RUNS]
