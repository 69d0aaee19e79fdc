"""What the benchmark runners share: arguments, the device and versions, JSON and figure output, models.

Every runner has three sizes: ``--small`` (the default; CPU, a few minutes on 2 cores), ``--full`` (a CUDA GPU
and the real model sizes) and a hidden ``--smoke`` (seconds; for the tests). Results go to
``benchmarks/results/<name>-<device>.json`` (and ``.html`` for a figure), where ``<device>`` is ``cpu`` or
``cuda-<gpu name>``; a size that is not the usual one for its device (``--small`` on a GPU, ``--smoke``
anywhere, ``--full`` on a CPU) adds ``-<size>`` so that it never overwrites the usual result.

Models are built from configs with random weights and batches from ``torch.randint``: nothing is downloaded.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import logging
import os
import platform
import re
import statistics
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    import plotly.graph_objects

RESULTS_DIR = Path(__file__).resolve().parent / "results"
SIZES = ("smoke", "small", "full")
_USUAL_SIZE = {"cpu": "small", "cuda": "full"}


def quiet() -> None:
    """Silence the warnings and log lines of transformers, accelerate and bitsandbytes that say nothing here."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    for name in ("transformers", "accelerate", "bitsandbytes"):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # transformers is a dependency of memlab; this only guards odd installs
        return
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def build_parser(description: str) -> argparse.ArgumentParser:
    """An argument parser with the options every runner has: the size, ``--device`` and ``--out``.

    Example:
        >>> args = build_parser("demo").parse_args(["--smoke", "--out", "/tmp/x"])
        >>> args.size, args.out
        ('smoke', PosixPath('/tmp/x'))
    """
    parser = argparse.ArgumentParser(description=description)
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument(
        "--small", dest="size", action="store_const", const="small",
        help="scaled-down sizes that run on a CPU in a few minutes (the default)",
    )
    sizes.add_argument(
        "--full", dest="size", action="store_const", const="full",
        help="the real sizes, on a CUDA GPU (one command per result)",
    )
    sizes.add_argument("--smoke", dest="size", action="store_const", const="smoke", help=argparse.SUPPRESS)
    parser.set_defaults(size="small")
    parser.add_argument(
        "--device", default="auto", choices=("auto", "cpu", "cuda"),
        help="where to run; auto: CUDA for --full, the CPU otherwise",
    )
    parser.add_argument(
        "--out", type=Path, default=RESULTS_DIR, help=f"folder for the JSON and HTML (default: {RESULTS_DIR})"
    )
    parser.add_argument(
        "--threads", type=int, default=None,
        help="CPU threads for torch (torch.set_num_threads); default: torch's own choice. On a shared, loaded "
        "machine 1 thread gives far steadier timings than threads that wait for each other",
    )
    return parser


def resolve_device(args: argparse.Namespace, parser: argparse.ArgumentParser) -> torch.device:
    """The device to run on: ``--device``, or for ``auto`` CUDA with ``--full`` and the CPU otherwise.

    ``--full`` without a GPU is refused (with ``--device cpu`` it runs, slowly, on the CPU). ``--threads``, where
    given, is applied here too (``torch.set_num_threads``), before anything is measured or described.
    """
    threads = getattr(args, "threads", None)
    if threads is not None:
        if threads < 1:
            parser.error(f"--threads {threads}: write a number of threads >= 1")
        torch.set_num_threads(threads)
    if args.device == "cuda" or (args.device == "auto" and args.size == "full"):
        if not torch.cuda.is_available():
            parser.error("--full runs on a CUDA GPU and none is available; add --device cpu to run it on the CPU")
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def cpu_model() -> str:
    """The CPU's model name, from /proc/cpuinfo where there is one, else from ``platform``."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def describe_device(device: torch.device) -> dict[str, Any]:
    """The machine a result comes from: CPU model and cores, torch threads, load, and the GPU where CUDA is used.

    ``load_average`` is the 1-, 5- and 15-minute load when the benchmark started: a load above the core count
    means other processes shared the CPU, and absolute speeds are lower than on a quiet machine.
    """
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count() or 0
    info: dict[str, Any] = {
        "type": device.type,
        "cpu": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "cpu_cores_usable": usable,
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "load_average": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
    }
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        info["gpu"] = torch.cuda.get_device_name(device)
        info["gpu_memory_bytes"] = int(properties.total_memory)
        info["gpu_capability"] = f"{properties.major}.{properties.minor}"
        info["cuda"] = torch.version.cuda
        info["driver"] = _nvidia_driver()
    return info


def _nvidia_driver() -> str | None:
    """The NVIDIA driver's version from ``nvidia-smi``, or None where it cannot be asked."""
    import subprocess

    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip().splitlines()[0] if done.stdout.strip() else None


def device_slug(device: torch.device) -> str:
    """``cpu``, or ``cuda-`` and the GPU's name in lower case with dashes, for file names.

    Example:
        >>> device_slug(torch.device("cpu"))
        'cpu'
    """
    if device.type != "cuda":
        return device.type
    name = re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name(device).lower()).strip("-")
    return f"cuda-{name}"


def versions() -> dict[str, str | None]:
    """Versions of Python, memlab and the libraries that decide the numbers (None where not installed)."""
    found: dict[str, str | None] = {"python": platform.python_version()}
    for package in ("memlab", "torch", "transformers", "accelerate", "bitsandbytes", "peft"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = None
    found["torch"] = torch.__version__
    if found["memlab"] is None:  # run from a checkout that is not installed (a GPU machine, say)
        import memlab

        found["memlab"] = memlab.__version__
    return found


def result_stem(name: str, device: torch.device, size: str) -> str:
    """``<name>-<device>``, plus ``-<size>`` where the size is not the usual one for that kind of device.

    Example:
        >>> result_stem("overhead", torch.device("cpu"), "small"), result_stem("overhead", torch.device("cpu"), "smoke")
        ('overhead-cpu', 'overhead-cpu-smoke')
    """
    stem = f"{name}-{device_slug(device)}"
    if _USUAL_SIZE.get(device.type) != size:
        stem += f"-{size}"
    return stem


def metadata_for(name: str, device: torch.device, size: str) -> dict[str, Any]:
    """The header of every result: benchmark name, size, date (UTC), the command, the device and versions."""
    return {
        "benchmark": name,
        "size": size,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python -m", f"benchmarks.{name.replace('-', '_')}", *sys.argv[1:]]),
        "device": describe_device(device),
        "versions": versions(),
    }


def write_json(payload: dict[str, Any], path: Path) -> Path:
    """Write ``payload`` as indented JSON (NaN is refused: every number must be real), creating the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, allow_nan=False, default=_jsonable) + "\n")
    return path


def write_figure(figure: plotly.graph_objects.Figure, path: Path) -> Path:
    """Write a plotly figure as a standalone HTML page (plotly.js from its CDN, so the file stays small)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.write_html(str(path), include_plotlyjs="cdn", full_html=True)
    return path


def _jsonable(value: Any) -> Any:
    if isinstance(value, (Path, torch.device, torch.dtype)):
        return str(value)
    if isinstance(value, (set, tuple)):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def synchronize(device: torch.device) -> None:
    """Wait for the GPU's queued work (no-op on the CPU), so that clocks read real durations."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def release(device: torch.device) -> None:
    """Collect garbage and give cached GPU memory back, between measurements."""
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def median(values: Sequence[float]) -> float | None:
    """The median, or None for no values.

    Example:
        >>> median([3.0, 1.0, 2.0]), median([])
        (2.0, None)
    """
    return statistics.median(values) if values else None


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured markdown table; numbers are right-aligned, None is shown as ``-``.

    Example:
        >>> print(markdown_table(["plan", "MiB"], [["plain", 12.5], ["ckpt", None]]))
        | plan | MiB |
        |:--|--:|
        | plain | 12.5 |
        | ckpt | - |
    """
    numeric = [
        all(isinstance(row[i], (int, float)) or row[i] is None for row in rows) and bool(rows)
        for i in range(len(headers))
    ]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("--:" if n else ":--" for n in numeric) + "|"]
    for row in rows:
        lines.append("| " + " | ".join("-" if cell is None else str(cell) for cell in row) + " |")
    return "\n".join(lines)


def mib(num_bytes: float | None) -> float | None:
    """Bytes as MiB rounded to 0.1, or None."""
    return None if num_bytes is None else round(num_bytes / 2**20, 1)


def rounded(value: float | None, digits: int = 3) -> float | None:
    """``value`` rounded to ``digits`` significant-looking decimals, or None."""
    return None if value is None else round(value, digits)


# --- models ----------------------------------------------------------------------------------------------


def llama_model(*, hidden: int, layers: int, heads: int, vocab: int, positions: int, seed: int = 0) -> nn.Module:
    """A Llama causal LM from a config with random weights (intermediate size 8/3 of ``hidden``, rounded to 64)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    intermediate = max(64, int(hidden * 8 / 3) // 64 * 64)
    config = LlamaConfig(
        hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=heads, vocab_size=vocab, max_position_embeddings=positions,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def bert_classifier(
    *, hidden: int, layers: int, heads: int, intermediate: int, vocab: int = 30522, positions: int = 512,
    seed: int = 0,
) -> nn.Module:
    """``BertForSequenceClassification`` (2 labels) from a config with random weights; bert-large is
    ``hidden=1024, layers=24, heads=16, intermediate=4096``."""
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=intermediate,
        vocab_size=vocab, max_position_embeddings=positions,
    )
    config.num_labels = 2
    torch.manual_seed(seed)
    return BertForSequenceClassification(config)


def lm_batch(*, vocab: int, rows: int, length: int, seed: int = 1) -> dict[str, torch.Tensor]:
    """Random token ids for a causal LM: ``input_ids``, ``attention_mask`` and ``labels`` (the ids)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (rows, length), generator=generator)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def classification_batch(*, vocab: int, rows: int, length: int, labels: int = 2, seed: int = 1) -> dict[str, Any]:
    """Random token ids with one class label per row, for a sequence classifier."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (rows, length), generator=generator)
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "labels": torch.randint(0, labels, (rows,), generator=generator),
    }


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """The batch's tensors on ``device``."""
    return {key: value.to(device) for key, value in batch.items()}


def run_in_rounds(
    name: str,
    doc: str | None,
    sizes: Mapping[str, Any],
    run: Callable[[Any, torch.device], dict[str, Any]],
    figure: Callable[[dict[str, Any]], Any],
    argv: Sequence[str] | None,
) -> tuple[dict[str, Any], Path]:
    """The main of a benchmark timed in rounds: parse the shared options (and ``--rounds``, which overrides the
    size's ``rounds``), run it, write ``<name>-<device>.json`` and ``.html``; the result and the JSON's path."""
    parser = build_parser((doc or name).splitlines()[0])
    parser.add_argument("--rounds", type=int, help="override the number of rounds (blocks of each side)")
    args = parser.parse_args(argv)
    quiet()
    device = resolve_device(args, parser)
    size = sizes[args.size]
    if args.rounds:
        size = dataclasses.replace(size, rounds=args.rounds)
    result = metadata_for(name, device, args.size)
    result.update(run(size, device))
    stem = result_stem(name, device, args.size)
    path = write_json(result, args.out / f"{stem}.json")
    write_figure(figure(result), args.out / f"{stem}.html")
    return result, path

