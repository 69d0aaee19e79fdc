"""Where ``memlab estimate`` keeps its answers and what keys them, torch-free: the folder (:func:`cache_folder`),
the installed stack's stamp (versions read from the distributions' metadata, nothing imported, and a hash of
memlab's own files: :func:`stack_stamp`), an answer's key (:func:`answer_key`) and an entry read and written whole
(:func:`read_rows`, :func:`write_rows`).

The dry runs' answers (:mod:`memlab.estimation.answers`) and a whole question's answer
(:mod:`memlab.frontends.cli.estimate.kept`, read before torch is imported) both keep theirs here, in one layout.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["CACHE_ENV", "ENVIRONMENT", "STACK", "answer_key", "cache_folder", "files_hash", "read_rows",
           "stack_stamp", "write_rows"]

CACHE_ENV = "MEMLAB_CACHE_DIR"
"""The environment variable that moves the folder of kept answers."""

STACK = ("torch", "transformers", "peft", "trl", "bitsandbytes", "accelerate", "memlab", "torchao", "flash_attn",
         "liger_kernel", "deepspeed", "triton")
"""The distributions whose versions are part of every key (absent: ``None``): what a dry run runs, and what decides
what a lever may do or what a note says (torchao for fp8, flash-attn for the attention)."""

ENVIRONMENT = ("CUBLAS_WORKSPACE_CONFIG", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
"""The environment variables part of every key: cuBLAS's workspaces are in the card figure."""

FORMAT = 1
"""The layout of an entry; a new one never reads an old one."""


def cache_folder(environ: Mapping[str, str] = os.environ) -> Path:
    """Where kept answers go: ``$MEMLAB_CACHE_DIR``, else ``$XDG_CACHE_HOME/memlab``, else ``~/.cache/memlab``.

    Example:
        >>> str(cache_folder({"MEMLAB_CACHE_DIR": "/tmp/answers"})), str(cache_folder({"XDG_CACHE_HOME": "/cache"}))
        ('/tmp/answers', '/cache/memlab')
    """
    moved = environ.get(CACHE_ENV)
    if moved:
        return Path(moved).expanduser()
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "memlab"


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def stack_stamp() -> dict[str, Any]:
    """What every key holds of the installed stack: Python's version, each of :data:`STACK`'s and ``memlab_files``,
    a hash of every file of the memlab package that runs (its version string stays the same between commits).

    Example:
        >>> stamp = stack_stamp()
        >>> all(name in stamp for name in STACK), len(stamp["memlab_files"])
        (True, 64)
    """
    return {"python": sys.version, **{name: _version(name) for name in STACK},
            "memlab_files": files_hash(Path(__file__).resolve().parents[1])}


def files_hash(folder: Path) -> str:
    """A hash of every file under ``folder`` (names and contents; Python's ``__pycache__`` left out).

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> _ = (folder / "a.py").write_text("x = 1")
        >>> before = files_hash(folder)
        >>> _ = (folder / "a.py").write_text("x = 2")
        >>> files_hash(folder) == before
        False
    """
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file() and "__pycache__" not in path.relative_to(folder).parts:
            digest.update(path.relative_to(folder).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def answer_key(route: str, inputs: Mapping[str, Any]) -> str:
    """The key of the answer ``route`` gives ``inputs``, with the stack's stamp (:func:`stack_stamp`).

    Example:
        >>> answer_key("example", {"rows": 1}) == answer_key("example", {"rows": 2})
        False
    """
    text = json.dumps({"format": FORMAT, "route": route, "inputs": inputs, "stack": stack_stamp()},
                      sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def _path(folder: Path, key: str) -> Path:
    return folder / "estimates" / f"{key}.json"


def read_rows(folder: Path, key: str) -> list[Any] | None:
    """The rows kept under ``key`` in ``folder``, or None (none kept, or an entry that cannot be read).

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> read_rows(folder, "k") is None
        True
        >>> write_rows(folder, "k", [{"peak_bytes": 5}]); read_rows(folder, "k")
        [{'peak_bytes': 5}]
    """
    try:
        entry = json.loads(_path(folder, key).read_text())
        rows = entry["rows"] if entry.get("key") == key else None
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    return rows if isinstance(rows, list) else None


def write_rows(folder: Path, key: str, rows: list[Any]) -> None:
    """Keep ``rows`` under ``key`` in ``folder``, whole (a reader never sees half an entry); a folder that cannot be
    written keeps nothing, and is no error."""
    path = _path(folder, key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        partial.write_text(json.dumps({"key": key, "rows": rows}, default=repr))
        os.replace(partial, path)
    except OSError:
        pass
