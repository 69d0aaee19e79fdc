"""A sharded estimate asked inside a process that torch.distributed already runs in (a script launched with
``accelerate launch`` or ``torchrun``, whose trainer set up its process group): the estimate runs in a forked child.

The FSDP2 dry run shards the fake model over a fake process group of its own
(:func:`memlab.estimation.sharded.fsdp2.run.fake_process_group`), and torch.distributed holds one default group per
process, in module-level state that its ``destroy_process_group`` clears whole. A forked child holds a copy of the
live trainer (nothing is pickled or copied by hand), forgets the launch's group in its own memory only, runs the
estimate, and sends the trial back; the parent's group, trainer and model are never touched. torch offers no way
to run a second default group beside the first, which is why this is written here.

Example:
    >>> in_forked_child(lambda: 6 * 7)
    42
"""

from __future__ import annotations

import os
import pickle
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

from memlab.errors import MemlabError

__all__ = ["AUTOGRAD_FORK_REFUSAL", "in_forked_child", "launched", "refused_by_autograd"]

Result = TypeVar("Result")


def launched() -> bool:
    """Whether this process is in a torch.distributed group already (a launched script's rank).

    Example:
        >>> launched()
        False
    """
    import torch.distributed as dist

    return bool(dist.is_available() and dist.is_initialized())


def in_forked_child(work: Callable[[], Result]) -> Result:
    """``work()`` run in a forked child with torch.distributed's state forgotten there, its result (or its
    exception) sent back through a pipe. Where the platform cannot fork, a MemlabError says what to do instead.

    Example:
        >>> in_forked_child(lambda: [1, 2, 3])
        [1, 2, 3]
    """
    if not hasattr(os, "fork"):
        raise MemlabError("a sharded estimate inside a launched process needs os.fork, which this platform lacks; "
                          "ask before the launch, in a notebook or with memlab estimate on the command line")
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child: never returns
        os.close(read)
        try:
            _forget_process_groups()
            answer: tuple[str, Any] = ("ok", work())
        except BaseException as error:  # noqa: BLE001 - every failure goes back to the parent, which raises it
            answer = ("error", _picklable(error))
        try:
            data = pickle.dumps(answer)
        except Exception as error:  # noqa: BLE001 - an unpicklable result is said, not lost
            data = pickle.dumps(("error", MemlabError(f"the estimate's answer could not be sent back: {error}")))
        with os.fdopen(write, "wb") as out:
            out.write(data)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as into:
        data = into.read()
    os.waitpid(child, 0)
    if not data:
        raise MemlabError("the sharded estimate's forked process ended without an answer (killed, or out of host "
                          "memory); ask before the launch, in a notebook or with memlab estimate on the command line")
    status, value = pickle.loads(data)  # noqa: S301 - our own child's bytes
    if status == "error":
        raise value
    return value  # type: ignore[no-any-return]


AUTOGRAD_FORK_REFUSAL = (
    "this process has run a backward pass with autograd's device threads (a training step on a GPU), which PyTorch "
    "refuses to use again in a forked process, and memlab.estimate runs a launched rank's sharded dry run in one; "
    "ask before the first training step (before trainer.train()), or before the launch: memlab.estimate(trainer, "
    "gpus=N) in a notebook, or memlab estimate MODEL --trainer sft --gpus N --strategy zero3"
)


def refused_by_autograd(trial: Any) -> Any:
    """``trial`` as it is, or the one error that says what to do where the forked child's dry run failed on
    PyTorch's autograd-and-fork check (``Unable to handle autograd's threading in combination with fork-based
    multiprocessing``).

    Example:
        >>> from types import SimpleNamespace
        >>> refused_by_autograd(SimpleNamespace(status="ok", error=None)).status
        'ok'
    """
    if getattr(trial, "status", None) == "error" and "autograd's threading" in str(getattr(trial, "error", "")):
        raise MemlabError(AUTOGRAD_FORK_REFUSAL)
    return trial


def _picklable(error: BaseException) -> BaseException:
    """``error`` itself where it pickles, else a MemlabError with its type, message and traceback."""
    try:
        pickle.dumps(error)
        return error
    except Exception:  # noqa: BLE001
        said = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        return MemlabError(f"{type(error).__name__}: {error}\n{said}")


# The launch's groups and stores, held in the child until it exits (os._exit: no destructor runs). Freed there, their
# destructors would join threads that only the parent has, and abort the child.
_KEPT_IN_CHILD: list[Any] = []


def _forget_process_groups() -> None:
    """In the forked child only: torch.distributed's groups dropped from its Python and C++ registries without
    shutting them down (their threads and sockets are the parent's), so that a fake group can start."""
    import torch
    import torch.distributed.distributed_c10d as c10d

    world = c10d._world
    _KEPT_IN_CHILD.append(world.default_pg)
    world.default_pg = None
    for name in ("pg_map", "pg_names", "pg_group_ranks", "pg_backend_config", "pg_to_tag", "tags_to_pg",
                 "pg_coalesce_state"):
        held = getattr(world, name, None)
        if isinstance(held, dict):
            _KEPT_IN_CHILD.append(dict(held))
            held.clear()
    world.group_count = 0
    torch._C._distributed_c10d._set_global_rank(-1)
    unregister = getattr(c10d, "_unregister_all_process_groups", None)
    if unregister is not None:
        unregister()
