"""The kinds of GPU a CUDA estimate made without one can answer for (``gpu=``, ``--gpu``): what each estimate
needs to know of the card it cannot see, in one place.

- the compute capability, which decides the attention kernels CUDA has (:mod:`memlab.estimation.cuda.attention`:
  flash attention needs sm80 or newer);
- the CUDA context of a training process on it (:mod:`memlab.estimation.cuda.context`), with where that figure comes
  from.

Example:
    >>> kind = gpu_kind("L4-24GB")
    >>> kind.device_name, kind.capability
    ('NVIDIA L4', (8, 9))
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from memlab.errors import MemlabError

__all__ = ["DEFAULT_GPU", "GPUS", "GpuKind", "capped", "gpu_kind", "kind_or_default", "parse_capability"]


@dataclass(frozen=True)
class GpuKind:
    """A kind of GPU an estimate can answer for: its name (the ``gpu=`` keyword, ``--gpu``), the name torch gives
    the device, its compute capability, the CUDA context of a training process on it, and where that figure comes
    from; and its memory (``total_memory``), past which the caching allocator releases its cache.

    Example:
        >>> GPUS["A100-80GB"].capability, GPUS["A100-80GB"].device_name
        ((8, 0), 'NVIDIA A100-SXM4-80GB')
    """

    name: str
    device_name: str
    capability: tuple[int, int]
    context_bytes: int
    source: str
    memory_bytes: int

    @property
    def called(self) -> str:
        """The kind's name with its article, as the name is read aloud: ``an H100-80GB``, ``a T4-16GB``.

        Example:
            >>> GPUS["L4-24GB"].called, GPUS["T4-16GB"].called, GPUS["B200-180GB"].called
            ('an L4-24GB', 'a T4-16GB', 'a B200-180GB')
        """
        return f"{'an' if self.name[:1].upper() in 'AEFHILMNORSX' else 'a'} {self.name}"

    @property
    def bf16(self) -> bool:
        """Whether the kind runs bfloat16 natively (:func:`memlab.live.device.bf16_capable`): where it does not, a
        plan in bf16 runs emulated, as a trial on that GPU runs it, and says so
        (:func:`memlab.techniques.precision.bf16_emulated`)."""
        from memlab.live.device import bf16_capable

        return bf16_capable(self.capability)


# Measured: an H100 80GB HBM3 (torch 2.11+cu130, CUDA 13.0, driver 580.159.04, lazy module loading), after a compare
# and fits over fp32, bf16, fp16, 8-bit AdamW and offload plans had loaded their kernels: the device's total memory
# (85,017,493,504 bytes) less what the process could hold (free + reserved = 84,205,043,712 bytes), alone on the GPU.
# benchmarks/results/gpu_acceptance-cuda-nvidia-h100-80gb-hbm3.json: device.gpu_memory_bytes less
# parts.restore.outcomes["fit with the default CUDA budget"].capacity.
_H100_CONTEXT = 85_017_493_504 - 84_205_043_712
_MEASURED = "measured on an H100 80GB HBM3, torch 2.11, CUDA 13.0"
# Assumed: no run on these kinds yet; the H100's figure (same driver stack). PyTorch's own measurement of a bare
# context (pytorch/pytorch#86509, CUDA 11.7) was 274 MiB with lazy loading and 636 MiB without: training loads more.
_ASSUMED = "assumed: the H100's figure, not yet measured on this GPU"

# Capabilities from NVIDIA's CUDA GPU list (developer.nvidia.com/cuda-gpus): Hopper 9.0 (H100, H200, H20), Ampere
# data-centre 8.0 (A100), Ampere workstation and consumer 8.6 (A10G, RTX 3090, RTX A6000), Ada 8.9, Turing 7.5 (T4),
# Blackwell data-centre 10.0 (B200) and consumer 12.0 (RTX 5090). Memory is what the card figure must fit when --gpu is
# the budget, and where the modelled allocator releases its cache. The H100's is torch's total_memory, measured
# (device.gpu_memory_bytes of the run above), and so is the H200's. The others are torch's total_memory
# (cudaDeviceProp.totalGlobalMem) as public reports print it, each cited: torch prints it in MiB rounded down,
# deviceQuery in bytes, notebooks as total_memory / 2**30 to three decimals; it varies by a few MiB across drivers.
# nvidia-smi's memory.total, beside each, is up to 770 MiB more than torch can use on a data-centre card (the H100's
# 81,559 MiB against torch's 81,079); memlab used it for the H200, A100s, L40S, RTX 4090 and L4 before issue 71.
_MIB = 2**20
_T4 = 15_095 * _MIB  # torch: Colab's Tesla T4 as TRL's own notebooks print it (huggingface/trl examples/notebooks/
# grpo_trl_lora_qlora.ipynb, sft_trl_lora_qlora.ipynb: "Max memory = 14.741 GB", total_memory / 2**30), as Colab's
# out-of-memory errors say it ("total capacity of 14.74 GiB"); other drivers 15,102 to 15,109 MiB; nvidia-smi 15,360
# MiB (modal-labs/modal-client#2797)
_H200 = 150_109_880_320  # measured: device.gpu_memory_bytes of benchmarks/results/gpu_acceptance-cuda-nvidia-h200-
# *.json (torch 2.11+cu130); nvidia-smi 143,771 MiB
_A100_80 = 81_153 * _MIB  # torch: TRL's sft_nemotron_3.ipynb, "NVIDIA A100-SXM4-80GB. Max memory = 79.251 GB"
# (total_memory / 2**30, to the MiB); nvidia-smi 81,920 MiB
_A100_40 = 40_442 * _MIB  # torch: TRL's sft_tool_calling.ipynb, "NVIDIA A100-SXM4-40GB. Max memory = 39.494 GB"; a
# deviceQuery with CUDA 11.4 shows 42,298,834,944 bytes (40,339 MiB: bottlerocket-os/bottlerocket#3873); nvidia-smi
# 40,960 MiB
_A10G = 22_587 * _MIB  # torch: TorchCodec's basic_cuda_example (torch 2.15, CUDA 13.0), "total_memory=22587MB";
# nvidia-smi 23,028 MiB
_RTX3090 = 24_259 * _MIB  # torch: "total_memory=24259MB" (two reports of GeForce RTX 3090 boards; another shows 24,575:
# the smaller is kept); nvidia-smi 24,576
_RTX4090 = 24_563 * _MIB  # torch: "total_memory=24563MB" (a GeForce RTX 4090); nvidia-smi 24,564 MiB
_L40S = 45_589 * _MIB  # torch: "total_memory=45589MB, multi_processor_count=142" (an L40S); nvidia-smi 46,068 MiB
_L4 = 22_700 * _MIB  # torch: an Unsloth-style notebook on an L4, "GPU = NVIDIA L4. Max memory = 22.168 GB"
# (total_memory / 2**30, to the MiB); nvidia-smi 23,034 MiB (modal-labs/modal-client#2797)
_RTX5090 = 33_677_180_928  # torch: deviceQuery's totalGlobalMem on a GeForce RTX 5090, driver 570.133.04 (CUDA 12.8;
# aikitoria/open-gpu-kernel-modules#1); NVIDIA/nccl#1637 shows 33,680,457,728: the smaller is kept
_A6000 = 48_676 * _MIB  # torch: "total_memory=48676MB" (an RTX A6000); nvidia-smi 49,140 MiB
_H20 = 97_285 * _MIB  # torch: "total_memory=97285MB, multi_processor_count=78" (an H20); nvidia-smi 97,871 MiB
_B200 = 182_631 * _MIB  # torch: "total_memory=182631MB" and 182,642 MiB (two B200s; pytorch/ao#4002 reads 178.35 GiB);
# nvidia-smi 183,359 MiB
# The kinds not yet measured: name, torch's device name, capability and memory; their context is _ASSUMED's.
_ASSUMED_KINDS = (
    ("H200-141GB", "NVIDIA H200", (9, 0), _H200),
    ("H20-96GB", "NVIDIA H20", (9, 0), _H20),
    ("B200-180GB", "NVIDIA B200", (10, 0), _B200),
    ("A100-80GB", "NVIDIA A100-SXM4-80GB", (8, 0), _A100_80),
    ("A100-40GB", "NVIDIA A100-SXM4-40GB", (8, 0), _A100_40),
    ("L40S-48GB", "NVIDIA L40S", (8, 9), _L40S),
    ("RTXA6000-48GB", "NVIDIA RTX A6000", (8, 6), _A6000),
    ("RTX5090-32GB", "NVIDIA GeForce RTX 5090", (12, 0), _RTX5090),
    ("RTX4090-24GB", "NVIDIA GeForce RTX 4090", (8, 9), _RTX4090),
    ("RTX3090-24GB", "NVIDIA GeForce RTX 3090", (8, 6), _RTX3090),
    ("A10G-24GB", "NVIDIA A10G", (8, 6), _A10G),
    ("L4-24GB", "NVIDIA L4", (8, 9), _L4),
    ("T4-16GB", "Tesla T4", (7, 5), _T4),
)
GPUS: dict[str, GpuKind] = {
    kind.name: kind
    for kind in (
        GpuKind("H100-80GB", "NVIDIA H100 80GB HBM3", (9, 0), _H100_CONTEXT, _MEASURED, 85_017_493_504),
        *(GpuKind(name, device, capability, _H100_CONTEXT, _ASSUMED, memory)
          for name, device, capability, memory in _ASSUMED_KINDS),
    )
}
"""The GPU kinds an estimate knows, by name."""

DEFAULT_GPU = "H100-80GB"
"""The GPU an estimate for CUDA answers for unless told another (``gpu=``, ``--gpu``)."""


def gpu_kind(
    name: str | GpuKind | None = None, *, memory: int | str | None = None,
    capability: tuple[int, int] | str | float | None = None,
) -> GpuKind:
    """The GPU kind called ``name`` (default :data:`DEFAULT_GPU`; a kind is returned as it is), found by its name in
    :data:`GPUS` or by the name torch gives the device (``torch.cuda.get_device_name()``); a MemlabError listing the
    kinds otherwise.

    ``memory`` (bytes, or a size such as ``"32GiB"``: what ``torch.cuda.get_device_properties(0).total_memory``
    reports) and ``capability`` (``(12, 0)``, ``"12.0"``: ``torch.cuda.get_device_capability()``) describe a GPU
    memlab does not list: both are needed for a name memlab does not know (the name, if any, labels it), and either
    changes that fact of a kind it knows (an A100-40GB given ``memory="20GiB"``). A described GPU's CUDA context is the
    H100's figure, assumed, and its ``source`` says so.

    Example:
        >>> gpu_kind().name, gpu_kind("a100-80gb").device_name, gpu_kind("Tesla T4").name
        ('H100-80GB', 'NVIDIA A100-SXM4-80GB', 'T4-16GB')
        >>> custom = gpu_kind("RTX PRO 6000", memory="96GiB", capability="12.0")
        >>> custom.name, custom.capability, custom.memory_bytes == 96 * 2**30, custom.bf16
        ('RTX PRO 6000', (12, 0), True, True)
        >>> gpu_kind("A100-40GB", memory="20GiB").name
        'A100-40GB with 20 GiB'
    """
    if memory is not None or capability is not None:
        return _described(name, memory, capability)
    if isinstance(name, GpuKind):
        return name
    if name is None:
        return GPUS[DEFAULT_GPU]
    found = _known(name)
    if found is None:
        raise MemlabError(f"gpu={name!r} is not a GPU memlab knows; write one of {', '.join(GPUS)}, or describe it: "
                          f"gpu=memlab.gpu_kind({str(name)!r}, memory='32GiB', capability='12.0') (its "
                          "torch.cuda.get_device_properties(0).total_memory and torch.cuda.get_device_capability())")
    return found


def kind_or_default(kind: GpuKind | None) -> GpuKind:
    """``kind``, or the default kind (:data:`DEFAULT_GPU`) where None: what the code below the entry points reads of
    a GPU kind they resolved (:func:`gpu_kind` is called where a name comes in: ``memlab.estimate``, ``fit``,
    ``limits``, the front ends; below them a kind travels as a :class:`GpuKind`, or None where none was named).

    Example:
        >>> kind_or_default(None).name, kind_or_default(GPUS["T4-16GB"]).name
        ('H100-80GB', 'T4-16GB')
    """
    return GPUS[DEFAULT_GPU] if kind is None else kind


def _known(name: str | GpuKind) -> GpuKind | None:
    """The listed kind of this name or torch device name (any case); None where there is none."""
    if isinstance(name, GpuKind):
        return name
    wanted = str(name).lower()
    return next((kind for kind in GPUS.values() if wanted in (kind.name.lower(), kind.device_name.lower())), None)


_DESCRIBED = "assumed: the H100's figure; the GPU was described (memory, compute capability), not measured"


def _described(name: str | GpuKind | None, memory: int | str | None,
               capability: tuple[int, int] | str | float | None) -> GpuKind:
    """A kind from ``memory`` and ``capability``: a listed kind's (``name``) with them put in, or a new one."""
    from memlab.sizes import format_bytes, parse_budget

    try:
        memory_bytes = parse_budget(memory)
    except MemlabError:
        raise MemlabError(f"memory={memory!r} is not a size; write the GPU's memory with its unit, e.g. "
                          "memory='32GiB' (torch.cuda.get_device_properties(0).total_memory in bytes works too)"
                          ) from None
    if memory_bytes is not None and memory_bytes <= GPUS[DEFAULT_GPU].context_bytes:
        raise MemlabError(f"memory={memory!r} would not hold a CUDA context; write the GPU's whole memory, e.g. "
                          "memory='32GiB'")
    major_minor = None if capability is None else parse_capability(capability)
    base = None if name is None else _known(name)
    if base is None and (memory_bytes is None or major_minor is None):
        missing = "capability=, e.g. capability='12.0'" if major_minor is None else "memory=, e.g. memory='32GiB'"
        label = "a GPU memlab does not list" if name is None else f"{str(name)!r}, not a GPU memlab knows,"
        raise MemlabError(f"{label} needs both its memory and its compute capability; add {missing} (or name one "
                          f"of {', '.join(GPUS)})")
    if base is None:
        assert memory_bytes is not None and major_minor is not None  # both checked above
        shown = format_bytes(memory_bytes).replace(".00 ", " ").replace(" ", "")
        label = str(name) if name is not None else f"sm{major_minor[0]}{major_minor[1]}-{shown}"
        return GpuKind(label, label, major_minor, GPUS[DEFAULT_GPU].context_bytes, _DESCRIBED, memory_bytes)
    changes: dict[str, object] = {}
    said = []
    if memory_bytes is not None and memory_bytes != base.memory_bytes:
        changes["memory_bytes"] = memory_bytes
        said.append(format_bytes(memory_bytes).replace(".00 ", " "))
    if major_minor is not None and major_minor != base.capability:
        changes["capability"] = major_minor
        said.append(f"compute capability {major_minor[0]}.{major_minor[1]}")
    if not changes:
        return base
    return replace(base, name=f"{base.name} with {' and '.join(said)}", **changes)  # type: ignore[arg-type]


def parse_capability(capability: tuple[int, int] | str | float) -> tuple[int, int]:
    """A compute capability as ``(major, minor)`` from ``(8, 6)``, ``"8.6"``, ``"12"`` or ``8.6``; a MemlabError
    saying what to write otherwise.

    Example:
        >>> parse_capability("8.6"), parse_capability((12, 0)), parse_capability(7.5), parse_capability("10")
        ((8, 6), (12, 0), (7, 5), (10, 0))
    """
    parts: tuple[object, ...]
    if isinstance(capability, (tuple, list)):
        parts = tuple(capability)
    elif isinstance(capability, (str, float, int)) and not isinstance(capability, bool):
        parts = tuple(str(capability).strip().split("."))
        parts = parts if len(parts) == 2 else (*parts, "0")
    else:
        parts = ()
    try:
        major, minor = (int(str(part)) for part in parts)
    except ValueError:
        major, minor = -1, -1
    if not (1 <= major <= 99 and 0 <= minor <= 9):
        raise MemlabError(f"capability={capability!r} is not a compute capability; write major.minor, e.g. "
                          "capability='8.6' or (8, 6): what torch.cuda.get_device_capability() returns, or nvidia-smi "
                          "--query-gpu=compute_cap --format=csv prints")
    return major, minor


def capped(kind: GpuKind | None, budget: int) -> GpuKind:
    """The GPU kind ``kind`` (or the default) held to ``budget`` bytes of card: what a real cap on the
    caching allocator at that budget makes of it (:func:`memlab.measure.cuda.cap_cuda_memory`: the allocator may
    reserve the budget less the CUDA context). Replayed on it, the allocator's model gives its cached segments back
    and tries again before it runs out, as the capped allocator does. ``limits`` searches on it and then checks its
    answer on the whole card, since fragmentation can stop the release (:mod:`memlab.search.limits`). The kind itself
    where the budget is not below its memory.

    Example:
        >>> eight = capped(GPUS["H100-80GB"], 8 * 2**30)
        >>> eight.name, eight.memory_bytes == 8 * 2**30, eight.capability
        ('H100-80GB capped at 8 GiB', True, (9, 0))
        >>> capped(None, 10**12) is GPUS[DEFAULT_GPU]
        True
    """
    found = kind_or_default(kind)
    if budget >= found.memory_bytes:
        return found
    shown = f"{budget / 2**30:g} GiB" if budget % 2**20 == 0 else f"{budget:,} bytes"
    return replace(found, name=f"{found.name} capped at {shown}", memory_bytes=budget)
