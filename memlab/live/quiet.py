"""Quiet by default: while plans run, the libraries memlab drives keep their warnings to themselves, and nothing
of the machine (its paths, its user's name) reaches what memlab shows.

Each plan builds optimizers, wraps modules and casts weights, and transformers, bitsandbytes, peft and torch say so
(``use_cache=True is incompatible with gradient checkpointing``, ``Failed to load CPU gemm_4bit_forward from
kernels-community``), once per plan, between the live figure and the table, each Python warning under a
``/home/.../site-packages/...py:123:`` header. Inside :func:`quiet` such warnings and log lines (of
:data:`QUIET_LOGGERS`, of memlab's modules, and warnings raised from any file of an installed package) are caught
as :class:`Remarks`: each distinct one once, as one short line without paths. Those that may change what a run
means are shown (:func:`matters`: a library's ``FutureWarning``, ``DeprecationWarning`` or ``RuntimeWarning``, a
log record at ERROR, any warning of memlab's own modules or of a library outside :data:`QUIET_LOGGERS`); the
usual chatter of the libraries memlab drives (their ``UserWarning`` and log lines below ERROR) is kept out, as it
always was, and ``verbose=True`` lets everything through as the libraries wrote it.

A front end that shows a run opens :func:`collecting` around it and shows the lines once at the end (``%%memfit``
prints them under its output); without one, each quiet block says each line once per process on the ``memlab``
logger (stderr unless the user configured logging). Warnings of the user's own code (a loss function's) are shown
as they come, as are memlab's own remarks (:class:`~memlab.errors.MemlabWarning`) outside a front end. Filters,
handlers and logger settings are restored afterwards: the user's kernel is left as it was.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import re
import sys
import sysconfig
import warnings
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, TextIO, cast

from memlab.errors import MemlabWarning
from memlab.live.patching import patched

__all__ = ["QUIET_LOGGERS", "Remarks", "collecting", "matters", "quiet", "without_paths"]

QUIET_LOGGERS = ("transformers", "bitsandbytes", "peft", "accelerate", "torch", "trl", "datasets", "liger_kernel")
"""The libraries kept quiet: their log records (child loggers' too) and the warnings raised in their modules (or
in memlab's, where a library's warning points at its caller) are kept as :class:`Remarks`."""
_OWN = "memlab"
_DRIVEN_MODULES = rf"({'|'.join(QUIET_LOGGERS)}|{_OWN})(\.|$)"
_LONGEST = 200  # characters of one remark's text; the rest is cut
_ACTIVE: contextvars.ContextVar[Remarks | None] = contextvars.ContextVar("memlab_remarks", default=None)
_TOLD: set[str] = set()  # the lines said on the memlab logger in this process (each once)
# An absolute path (POSIX, ~/..., or a Windows drive) of at least two parts; a URL's "//host/..." is not one.
_PART = r"[^\s'\"`,;:()<>\[\]{}|*?/\\]"
_PATH = re.compile(rf"(?<![\w:/.~-])(?:~|[A-Za-z]:)?[/\\](?:{_PART}+[/\\])+({_PART}*)")


def without_paths(text: str) -> str:
    """``text`` with every absolute path of the machine cut to its last part (a file's name, say), and the home
    directory's name left out: what a cell's output may show of a message that names a file.

    Example:
        >>> without_paths("in /home/ada/.venv/lib/python3.11/site-packages/bitsandbytes/ops.py:253, see https://hf.co/d/x")
        'in ops.py:253, see https://hf.co/d/x'
        >>> without_paths("cache ~/.cache/huggingface/hub/ and C:\\\\Users\\\\ada\\\\x.json")
        'cache hub and x.json'
    """
    home = os.path.expanduser("~")
    if len(home) > 1:
        text = text.replace(home, "~")
    return _PATH.sub(lambda match: match.group(1) or _last_part(match.group(0)), text)


def _last_part(path: str) -> str:
    parts = [part for part in re.split(r"[/\\]", path) if part and part != "~"]
    return parts[-1] if parts else "..."


def matters(source: str, kind: type[Warning] | int) -> bool:
    """Whether a remark of library ``source`` is shown: ``kind`` is a warning's category or a log record's level.

    The libraries memlab drives (:data:`QUIET_LOGGERS`) say the same things for every plan; what of theirs is
    shown is what may change what a run means: a ``FutureWarning`` (behaviour that changes for the user), a
    ``RuntimeWarning`` (numbers gone wrong), a log record at ERROR or above. A ``DeprecationWarning`` between them
    (torch telling transformers that an API goes away) is for their developers, and Python itself hides those
    outside ``__main__``: so does memlab. Any warning of memlab's own modules or of another library is shown.

    Example:
        >>> import logging
        >>> matters("transformers", UserWarning), matters("transformers", FutureWarning)
        (False, True)
        >>> matters("torch", DeprecationWarning)
        False
        >>> matters("bitsandbytes", logging.WARNING), matters("numpy", UserWarning)
        (False, True)
    """
    if isinstance(kind, int):
        return kind >= logging.ERROR
    if source not in QUIET_LOGGERS:
        return True
    return issubclass(kind, (FutureWarning, RuntimeWarning))


class Remarks:
    """What libraries said while memlab ran: each distinct remark once, as ``source: text`` without paths, and
    whether it :func:`matters` (how often it was said is left out: a library's own "once" rules make that count say
    little).

    Example:
        >>> remarks = Remarks()
        >>> for _ in range(3):
        ...     remarks.add("bitsandbytes", "Failed to load a kernel from /home/ada/.cache/kernels/cpu.so")
        >>> remarks.add("transformers", "FutureWarning: `evaluation_strategy` is deprecated", shown=True)
        >>> remarks.lines(), len(remarks.lines(everything=True))
        (['transformers: FutureWarning: `evaluation_strategy` is deprecated'], 2)
    """

    def __init__(self, rule: Callable[[str, type[Warning] | int], bool] | None = None) -> None:
        self._lines: dict[str, bool] = {}
        self.matters = rule or matters
        """Whether a remark of a library (its name) of a kind (a warning's category, a log record's level) is shown:
        :func:`matters`, unless the front end that collects says otherwise."""

    def add(self, source: str, text: str, *, shown: bool = False) -> None:
        """Keep one remark of ``source`` (a library's name): its paths cut, its lines joined, its length bounded;
        ``shown``: it is one that :meth:`lines` shows."""
        short = " ".join(without_paths(text).split())
        if len(short) > _LONGEST:
            short = short[: _LONGEST - 3].rstrip() + "..."
        key = f"{source}: {short}"
        self._lines[key] = self._lines.get(key, False) or shown

    def lines(self, *, everything: bool = False) -> list[str]:
        """One line per distinct remark that is shown (``everything``: kept out too), in the order first said."""
        return [line for line, shown in self._lines.items() if shown or everything]

    def __len__(self) -> int:
        return len(self._lines)

    def show(self, out: TextIO | None = None) -> None:
        """Print the shown remarks under one heading (nothing when there are none): how ``%%memfit`` ends its output.

        Example:
            >>> remarks = Remarks(); remarks.add("peft", "a remark", shown=True)
            >>> remarks.show(sys.stdout)
            Libraries' warnings while memlab ran (each once; --verbose shows them as they come):
              peft: a remark
        """
        lines = self.lines()
        if not lines:
            return
        stream = sys.stdout if out is None else out
        print("Libraries' warnings while memlab ran (each once; --verbose shows them as they come):", file=stream)
        for line in lines:
            print(f"  {line}", file=stream)


@contextlib.contextmanager
def collecting(verbose: bool = False,
               rule: Callable[[str, type[Warning] | int], bool] | None = None) -> Iterator[Remarks]:
    """Gather, for the whole block, what libraries say (:func:`quiet` blocks inside add to it, and so does what runs
    outside them, such as an import that logs); the caller shows the :class:`Remarks` once, at the end. memlab's own
    :class:`~memlab.errors.MemlabWarning` is gathered too, so that no warning header with a path is printed. With
    ``verbose`` nothing is gathered and everything comes through as the libraries wrote it. ``rule``: which remarks
    are shown, where not :func:`matters` (a front end whose libraries run code memlab wrote, not the user's: the
    command line's stand-in trainer).

    Example:
        >>> import logging
        >>> with collecting() as remarks:
        ...     logging.getLogger("bitsandbytes.cextension").error("no GPU library in /opt/bnb/lib")
        ...     warnings.warn("memlab: a remark of memlab's", MemlabWarning)
        >>> remarks.lines()
        ['bitsandbytes: no GPU library in lib', "memlab: memlab: a remark of memlab's"]
    """
    remarks = Remarks(rule)
    if verbose:
        yield remarks
        return
    token = _ACTIVE.set(remarks)
    try:
        with _intercepted(remarks, own_warnings=True):
            yield remarks
    finally:
        _ACTIVE.reset(token)


@contextlib.contextmanager
def quiet(verbose: bool = False) -> Iterator[None]:
    """Keep third-party warnings and log lines out of sight inside the block, unless ``verbose``: each is kept as a
    remark, of the front end's :func:`collecting` when one is open, else those that :func:`matters` are said once
    per process on the ``memlab`` logger when the block ends, each as one line without paths.

    Example:
        >>> library = {"__name__": "transformers.modeling_utils", "warnings": warnings}
        >>> user = {"__name__": "__main__", "warnings": warnings}
        >>> with warnings.catch_warnings(record=True) as caught, collecting() as remarks:
        ...     warnings.simplefilter("always")
        ...     with quiet():
        ...         exec("warnings.warn('a library remark')", library)
        ...         exec("warnings.warn('a change to come', FutureWarning)", library)
        ...         exec("warnings.warn('a remark of the user code')", user)
        >>> [str(w.message) for w in caught], remarks.lines(), len(remarks.lines(everything=True))
        (['a remark of the user code'], ['transformers: FutureWarning: a change to come'], 2)
    """
    if verbose:
        yield
        return
    outer = _ACTIVE.get()
    remarks = outer if outer is not None else Remarks()
    try:
        with _intercepted(remarks, own_warnings=False):
            yield
    finally:
        if outer is None:
            _tell_once(remarks)


def _tell_once(remarks: Remarks) -> None:
    for line in remarks.lines():
        if line not in _TOLD:
            _TOLD.add(line)
            logging.getLogger(_OWN).warning("memlab: a library warned while plans ran: %s", line)


@contextlib.contextmanager
def _intercepted(remarks: Remarks, *, own_warnings: bool) -> Iterator[None]:
    """Warnings and log records of libraries go to ``remarks`` inside the block; the user's code's warnings (and
    memlab's own remarks, unless ``own_warnings``) go on to whatever showed warnings before."""
    with warnings.catch_warnings(), _captured_logs(remarks):
        _keep_library_warnings_from_errors()
        previous = warnings.showwarning

        def show(message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None,
                 line: str | None = None) -> None:
            source = _library_of(filename, lineno, sys._getframe(1))
            own = issubclass(category, MemlabWarning)
            if source is None or (own and not own_warnings):
                previous(message, category, filename, lineno, file, line)
                return
            kind = "" if category in (UserWarning, MemlabWarning) else f"{category.__name__}: "
            source = _OWN if own else source
            remarks.add(source, f"{kind}{message}", shown=remarks.matters(source, category))

        warnings.showwarning = show
        yield


def _keep_library_warnings_from_errors() -> None:
    """Where warnings are made errors (``error`` filters that match every module), a driven library's remark must not
    end a trial: each such filter gets a ``default`` one for the libraries just before it, for the same category and
    message. Filters before it (a user's ``ignore FutureWarning``, say) still come first, so they keep deciding.

    Example:
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("error"); warnings.filterwarnings("ignore", category=FutureWarning)
        ...     _keep_library_warnings_from_errors()
        ...     [action for action, *_ in warnings.filters[:3]]
        ['ignore', 'default', 'error']
    """
    rebuilt: list[Any] = []
    for entry in warnings.filters:
        action, message, category, module, lineno = entry
        if action == "error" and module is None:
            rebuilt.append(("default", message, category, re.compile(_DRIVEN_MODULES), lineno))
        rebuilt.append(entry)
    if len(rebuilt) != len(warnings.filters):
        # The warnings module offers no insert at a position; its list is replaced inside the caller's
        # catch_warnings, which puts the user's filters back afterwards.
        cast(list[Any], warnings.filters)[:] = rebuilt
        getattr(warnings, "_filters_mutated", lambda: None)()  # drops the per-module caches of earlier decisions


def _library_of(filename: str, lineno: int, frame: FrameType | None) -> str | None:
    """The library a warning came from (the top name of the module it is attributed to), or None for the user's own
    code: a module of :data:`QUIET_LOGGERS` or memlab, or any module whose file is an installed package's."""
    module = ""
    while frame is not None:  # the frame the warning is attributed to is on the stack while it is shown
        if frame.f_code.co_filename == filename and frame.f_lineno == lineno:
            module = str(frame.f_globals.get("__name__", ""))
            break
        frame = frame.f_back
    top = module.split(".")[0]
    if top in QUIET_LOGGERS or top == _OWN:
        return top
    if _installed(filename):
        return top or os.path.splitext(os.path.basename(filename))[0]
    return None


def _installed(filename: str) -> bool:
    """Whether ``filename`` is a file of Python itself or of an installed package (site-packages and the like)."""
    folder = os.path.dirname(os.path.abspath(filename)) if os.path.isabs(filename) else ""
    if not folder:
        return False
    roots = {sysconfig.get_path(name) for name in ("stdlib", "purelib", "platlib")}
    return any(root and folder.startswith(root) for root in roots) or "site-packages" in folder


class _Capture(logging.Filter):
    """Takes the records of the quiet libraries' loggers into ``remarks``: a filter of their loggers (so that a
    child logger's own handlers never see them) that lets none through."""

    def __init__(self, remarks: Remarks) -> None:
        super().__init__()
        self.remarks = remarks

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            try:
                text = record.getMessage()
            except Exception:  # noqa: BLE001 - a record that cannot format itself is still a remark
                text = str(record.msg)
            source = record.name.split(".")[0]
            self.remarks.add(source, text, shown=self.remarks.matters(source, record.levelno))
        return False


class _CaptureHandler(logging.Handler):
    """The handler of the quiet libraries' top loggers, for the child loggers made inside the block."""

    def __init__(self, capture: _Capture) -> None:
        super().__init__()
        self.capture = capture

    def emit(self, record: logging.LogRecord) -> None:
        self.capture.filter(record)


@contextlib.contextmanager
def _captured_logs(remarks: Remarks) -> Iterator[None]:
    capture = _Capture(remarks)
    tops = [logging.getLogger(name) for name in QUIET_LOGGERS]
    children = [
        logger for name, logger in list(logging.root.manager.loggerDict.items())
        if isinstance(logger, logging.Logger) and "." in name and name.split(".")[0] in QUIET_LOGGERS
    ]
    handler = _CaptureHandler(capture)
    with contextlib.ExitStack() as kept:
        for logger in tops:
            kept.enter_context(patched(logger, handlers=[handler], propagate=False))
        for logger in [*tops, *children]:
            logger.addFilter(capture)
        try:
            yield
        finally:
            for logger in [*tops, *children]:
                logger.removeFilter(capture)
