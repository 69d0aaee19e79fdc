"""``memlab estimate`` asked again: the whole answer (what it printed on stdout and its exit status) kept under the
question's words, read before torch, transformers or memlab's estimation are imported.

A question is keyed (:func:`question_key`) by its words as typed after ``memlab estimate`` (a default or a meaning
can change only with memlab's files, which are in every key), the environment every dry run's key reads
(:data:`memlab.live.cache.ENVIRONMENT`) and the stack's stamp (:func:`memlab.live.cache.stack_stamp`: Python's and
the stack's versions from their metadata, a hash of memlab's files). The config the words name is checked as the
first ask read it (:func:`config_identity`): a built-in shape is memlab's own table (in memlab's files) read by the
installed transformers (in the stamp), so it is that shape while no file of its name is there; a local config is
its bytes (``config.json`` in a folder). A Hub name's config is not kept this way (the Hub or its cache may change
it), nor any answer that is not 0 or 1 (a wrong input, a plan that could not be estimated): those ask as before,
and their dry runs' answers are kept (:mod:`memlab.estimation.answers`). ``--no-cache`` reads and keeps nothing.

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> folder = Path(tempfile.mkdtemp())
    >>> answered(["llama-7b"], folder) is None  # never asked
    True
    >>> keep(["llama-7b"], folder, {"kind": "shape", "source": "llama-7b"}, "a table\\n", 1)
    >>> answered(["llama-7b"], folder)
    ('a table\\n', 1)
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, TextIO, cast

from memlab.live import cache

__all__ = [
    "Tee", "answered", "asked_again", "asked_words", "asking", "config_identity", "keep", "question_key", "run_kept",
]

_ROUTE = "question"
_LARGEST_CONFIG = 16 * 2**20
"""A local config file larger than this is no config: its answer is not kept this way."""

_WORDS: ContextVar[tuple[str, ...] | None] = ContextVar("memlab_estimate_words", default=None)


def question_key(words: Sequence[str]) -> str:
    """The key of ``memlab estimate WORDS``' whole answer.

    Example:
        >>> question_key(["llama-7b", "--budget", "24GiB"]) == question_key(["llama-7b", "--budget", "24GB"])
        False
    """
    return cache.answer_key(_ROUTE, {"words": list(words),
                                     "environment": {name: os.environ.get(name) for name in cache.ENVIRONMENT}})


def config_identity(source: str, *, shape: bool) -> dict[str, Any] | None:
    """What decides the config ``source`` names, as :func:`memlab.estimation.configs.load_config` reads it: a path
    (a file, or a folder's ``config.json``) by its bytes' hash, a built-in shape (``shape``: the caller knows it is
    one) by its name; None for anything else (a Hub name), whose answer is not kept whole.

    Example:
        >>> config_identity("llama-7b", shape=True), config_identity("org/model", shape=False)
        ({'kind': 'shape', 'source': 'llama-7b'}, None)
    """
    path = Path(source)
    if os.path.exists(source):  # load_config reads a path first, whatever its name
        file = path / "config.json" if path.is_dir() else path
        try:
            if not file.is_file() or file.stat().st_size > _LARGEST_CONFIG:
                return None
            return {"kind": "path", "source": source, "sha256": hashlib.sha256(file.read_bytes()).hexdigest()}
        except OSError:
            return None
    return {"kind": "shape", "source": source} if shape else None


def _still(identity: Any) -> bool:
    """Whether the config a kept answer read is the one the same words name now."""
    if not isinstance(identity, dict) or not isinstance(identity.get("source"), str):
        return False
    kind, source = identity.get("kind"), identity["source"]
    if kind == "shape":
        return not os.path.exists(source)
    return kind == "path" and config_identity(source, shape=False) == identity


def answered(words: Sequence[str], folder: Path) -> tuple[str, int] | None:
    """The stdout and exit status kept for ``memlab estimate WORDS`` in ``folder``; None where none is kept, it
    cannot be read, or the config it read has changed."""
    if "--no-cache" in words:
        return None
    rows = cache.read_rows(folder, question_key(words))
    if not rows or not isinstance(rows[0], dict):
        return None
    row = rows[0]
    text, status = row.get("stdout"), row.get("status")
    if not isinstance(text, str) or status not in (0, 1) or isinstance(status, bool) or not _still(row.get("config")):
        return None
    return text, status


def asked_again(words: Sequence[str], out: TextIO, err: TextIO) -> int | None:
    """``memlab estimate WORDS`` answered from the answer kept for it: its stdout printed on ``out``, one line on
    ``err`` saying so, its exit status returned; None where none is kept (the question is then asked).

    Example:
        >>> import io
        >>> asked_again(["no-such-question", "--no-cache"], io.StringIO(), io.StringIO()) is None
        True
    """
    found = answered(words, cache.cache_folder())
    if found is None:
        return None
    text, status = found
    print("memlab estimate: the answer kept from an earlier ask of this question (--no-cache asks again)", file=err,
          flush=True)
    out.write(text)
    out.flush()
    return status


def keep(words: Sequence[str], folder: Path, identity: dict[str, Any], text: str, status: int) -> None:
    """Keep ``memlab estimate WORDS``' answer: what it printed (``text``) and its exit status, with the config it
    read (``identity``, :func:`config_identity`)."""
    if status in (0, 1):
        cache.write_rows(folder, question_key(words), [{"stdout": text, "status": status, "config": identity}])


def run_kept(args: Any, out: TextIO, run: Callable[[TextIO], int]) -> int:
    """``run(out)`` (the estimate ``args`` ask), its whole answer kept under the question's words where the command
    line asked it (:func:`asking`) without ``--no-cache`` and its config is a shape or a local file; its status."""
    words = asked_words()
    if words is None or getattr(args, "no_cache", False):
        return run(out)
    from memlab.estimation.configs import KNOWN_SHAPES

    source = str(args.config or args.model)
    identity = config_identity(source, shape=source.lower() in KNOWN_SHAPES)  # before the config is read
    if identity is None:
        return run(out)
    printed = Tee(out)
    status = run(cast(TextIO, printed))  # a TextIO in all but name: write, flush, the rest from out
    keep(words, cache.cache_folder(), identity, printed.text, status)
    return status


@contextmanager
def asking(words: Sequence[str]) -> Iterator[None]:
    """The words of the question being asked, for :func:`asked_words` (the command line sets them; an estimate run
    any other way keeps no whole answer)."""
    token = _WORDS.set(tuple(words))
    try:
        yield
    finally:
        _WORDS.reset(token)


def asked_words() -> tuple[str, ...] | None:
    """The words :func:`asking` set, or None."""
    return _WORDS.get()


class Tee:
    """A text stream that writes through to ``out`` and keeps what was written (:attr:`text`).

    Example:
        >>> import io
        >>> out = io.StringIO()
        >>> tee = Tee(out)
        >>> print("a table", file=tee)
        >>> out.getvalue() == tee.text == "a table\\n"
        True
    """

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.parts: list[str] = []

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def write(self, text: str) -> int:
        self.parts.append(text)
        return self.out.write(text)

    def flush(self) -> None:
        self.out.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.out, name)
