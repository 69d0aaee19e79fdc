"""``memlab estimate --gpu``, ``--gpu-memory``, ``--gpu-capability``: the GPU an estimate is for, named or described.

``--gpu NAME`` names a kind memlab knows (:data:`memlab.estimation.cuda.gpus.GPUS`). ``--gpu-memory SIZE`` and
``--gpu-capability MAJOR.MINOR`` describe a GPU it does not list (both needed), or, with ``--gpu``, change that fact
of the named kind (an A100-40GB partitioned to 20 GiB): :func:`memlab.estimation.cuda.gpus.gpu_kind` makes the kind
either way, as ``memlab.gpu_kind(name, memory=..., capability=...)`` does in Python. :func:`cli_gpu` is what every
part of the command passes on as ``gpu=``: the kind resolved here, the one place the command line resolves it; a GPU
named beside ``--device cpu`` is refused before anything is built (:func:`check_gpu_flags`).

Example:
    >>> args = argparse.Namespace(gpu=None, gpu_memory="32GiB", gpu_capability="12.0", device=None)
    >>> cli_gpu(args).name, cli_gpu(args).capability
    ('sm120-32GiB', (12, 0))
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memlab.estimation.cuda.gpus import GpuKind

__all__ = ["add_gpu_arguments", "check_gpu_flags", "cli_gpu", "gpu_budget", "gpu_flags"]


def add_gpu_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare ``--gpu``, ``--gpu-memory`` and ``--gpu-capability`` on ``parser``; the kinds listed come from
    :data:`~memlab.estimation.cuda.gpus.GPUS`.

    Example:
        >>> parser = argparse.ArgumentParser()
        >>> add_gpu_arguments(parser)
        >>> parser.parse_args(["--gpu", "T4-16GB", "--gpu-memory", "15GiB"]).gpu_memory
        '15GiB'
    """
    from memlab.estimation.cuda.gpus import DEFAULT_GPU, GPUS

    parser.add_argument(
        "--gpu",
        choices=tuple(GPUS),
        metavar="NAME",
        default=None,
        help=f"the kind of GPU a CUDA estimate is for: its attention kernels and the CUDA context on the card "
        f"(default: {DEFAULT_GPU}); one of {', '.join(GPUS)}",
    )
    parser.add_argument("--gpu-memory", metavar="SIZE", default=None,
                        help="a GPU memlab does not list: its memory, e.g. 32GiB (torch.cuda.get_device_properties(0)"
                        ".total_memory); with --gpu, that GPU with this memory")
    parser.add_argument("--gpu-capability", metavar="MAJOR.MINOR", default=None,
                        help="a GPU memlab does not list: its compute capability, e.g. 12.0 "
                        "(torch.cuda.get_device_capability()); with --gpu, that GPU with this capability")


def cli_gpu(args: argparse.Namespace) -> GpuKind | None:
    """The ``gpu=`` the command's flags say: the kind ``--gpu`` names (None where none is named: the default
    kind's figures), or the kind ``--gpu-memory`` / ``--gpu-capability`` describe; a MemlabError in the command's
    words where they are wrong.

    Example:
        >>> cli_gpu(argparse.Namespace(gpu="L4-24GB")).name, cli_gpu(argparse.Namespace(gpu=None))
        ('L4-24GB', None)
        >>> cli_gpu(argparse.Namespace(gpu=None, gpu_memory="lots", gpu_capability="8.6"))
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: --gpu-memory 'lots' is not a size; write the GPU's memory with its unit, e.g. \
--gpu-memory 32GiB
    """
    from memlab.errors import MemlabError
    from memlab.estimation.cuda.gpus import gpu_kind, parse_capability
    from memlab.sizes import parse_budget

    name = getattr(args, "gpu", None)
    memory, capability = getattr(args, "gpu_memory", None), getattr(args, "gpu_capability", None)
    if memory is None and capability is None:
        return None if name is None else gpu_kind(name)
    try:
        parse_budget(memory)
    except MemlabError:
        raise MemlabError(f"--gpu-memory {memory!r} is not a size; write the GPU's memory with its unit, e.g. "
                          "--gpu-memory 32GiB") from None
    if capability is not None:
        try:
            parse_capability(capability)
        except MemlabError:
            raise MemlabError(f"--gpu-capability {capability!r} is not a compute capability; write MAJOR.MINOR, "
                              "e.g. --gpu-capability 8.6 (torch.cuda.get_device_capability(), or nvidia-smi "
                              "--query-gpu=compute_cap --format=csv)") from None
    if name is None and (memory is None or capability is None):
        missing = "--gpu-capability, e.g. --gpu-capability 12.0" if capability is None else \
            "--gpu-memory, e.g. --gpu-memory 32GiB"
        raise MemlabError(f"a GPU memlab does not list needs both its memory and its compute capability; add "
                          f"{missing} (or name a GPU memlab knows with --gpu)")
    try:
        return gpu_kind(name, memory=memory, capability=capability)
    except MemlabError as error:  # a memory too small for a context: said with the flag
        raise MemlabError(str(error).replace("memory=", "--gpu-memory ")) from None


def gpu_flags(args: argparse.Namespace) -> list[str]:
    """The GPU flags the user wrote, for a command that repeats theirs.

    Example:
        >>> gpu_flags(argparse.Namespace(gpu="A100-40GB", gpu_memory="20GiB", gpu_capability=None))
        ['--gpu', 'A100-40GB', '--gpu-memory', '20GiB']
    """
    words: list[str] = []
    for option, key in (("--gpu", "gpu"), ("--gpu-memory", "gpu_memory"), ("--gpu-capability", "gpu_capability")):
        value = getattr(args, key, None)
        if value is not None:
            words += [option, str(value)]
    return words


def check_gpu_flags(args: argparse.Namespace) -> None:
    """Refuse, before anything is built, a GPU named or described beside ``--device cpu`` (which would be ignored).
    A plan in bf16 for a GPU without native bf16 is not refused: it runs emulated, as the user's run would, and its
    estimate says so (:func:`memlab.techniques.precision.bf16_emulated`).

    Example:
        >>> check_gpu_flags(argparse.Namespace(gpu="T4-16GB", device=None))
        >>> check_gpu_flags(argparse.Namespace(gpu="T4-16GB", device="cpu"))
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: --gpu names the GPU an estimate is for, and --device cpu asks for the CPU; drop \
--device cpu to estimate for that GPU, or drop --gpu for the CPU
    """
    from memlab.errors import MemlabError

    if getattr(args, "device", None) == "cpu":
        given = [flag for flag, name in (("--gpu", "gpu"), ("--gpu-memory", "gpu_memory"),
                                         ("--gpu-capability", "gpu_capability")) if getattr(args, name, None)]
        if given:
            raise MemlabError(f"{given[0]} names the GPU an estimate is for, and --device cpu asks for the CPU; drop "
                              f"--device cpu to estimate for that GPU, or drop {given[0]} for the CPU")


def gpu_budget(args: argparse.Namespace) -> int | None:
    """The budget when ``--gpu`` names a GPU and no ``--budget`` is given: the GPU's memory
    (:attr:`~memlab.estimation.cuda.gpus.GpuKind.memory_bytes`), what the card figure must fit; None otherwise (no
    ``--gpu``, or ``--device cpu``).

    Example:
        >>> gpu_budget(argparse.Namespace(gpu="A100-40GB", device=None, budget=None)) // 2**20  # torch's, in MiB
        40442
        >>> gpu_budget(argparse.Namespace(gpu=None, device=None, budget=None)) is None
        True
    """
    kind = cli_gpu(args)
    if kind is None or getattr(args, "device", None) == "cpu":
        return None
    return kind.memory_bytes
