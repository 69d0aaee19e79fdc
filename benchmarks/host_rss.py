"""Host bytes by the offload levers' own accounting against the process's: its resident memory (RSS) growth.

Each case runs in a fresh Python process (one case's freed memory never hides the next one's growth), with glibc's
mmap threshold fixed at 64 KiB (``MALLOC_MMAP_THRESHOLD_``): every tensor of that size or more is mapped on its
own and unmapped when freed, so RSS follows the tensors alive, not what malloc's heap keeps after a free. On this CPU
machine nothing can be pinned (pinned memory needs CUDA), so the host copies are pageable: the accounting counts
their storages' bytes, as it does a pinned block's before rounding it up to a power of two.

- ``optimizer``: :class:`memlab.techniques.offload.OffloadedOptimizer` (AdamW) over an MLP's weights; RSS before
  it is built against RSS after its first step, and its ``host_bytes()``: the fp32 copies, their gradient buffers,
  the two moments.
- ``activations``: the MLP's forward under :func:`memlab.techniques.offload.counted_save_on_cpu` (``move=True``,
  as on a GPU: each saved tensor copied to the host); RSS before the forward against RSS after it, with the forward's
  own output (the loss) alone besides the copies, and the ledger's bytes held.

    python -m benchmarks.host_rss            # widths 2048 and 4096: 0.2 to 1.6 GB of host copies
    python -m benchmarks.host_rss --smoke    # width 1024 only

Writes ``results/host_rss-cpu.json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

MIB = 2**20
CASES = ("optimizer", "activations")
WIDTHS = (2048, 4096)
SMOKE_WIDTHS = (1024,)
LAYERS = 8
ROWS = 2048


def _rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def run_case(case: str, width: int, layers: int = LAYERS, rows: int = ROWS) -> dict[str, Any]:
    """One case measured in this process: the accounting's bytes and the RSS growth (call it in a fresh one)."""
    import gc

    import torch
    from torch import nn

    from memlab.techniques.core.technique import HostLedger
    from memlab.techniques.offload import OffloadedOptimizer, counted_save_on_cpu

    torch.manual_seed(0)
    torch.set_num_threads(2)
    model = nn.Sequential(*(layer for _ in range(layers) for layer in (nn.Linear(width, width), nn.ReLU())))
    batch = torch.randn(rows, width)
    if case == "optimizer":
        model(batch).sum().backward()  # the device's gradients exist before, as in a step
        # The first optimizer step of a process imports (torch._dynamo among them): done once on a tiny layer first.
        tiny = nn.Linear(2, 2)
        tiny(torch.ones(1, 2)).sum().backward()
        OffloadedOptimizer(list(tiny.parameters()), lambda ps: torch.optim.AdamW(ps, lr=1e-5)).step()
        gc.collect()
        before = _rss()
        optimizer = OffloadedOptimizer(list(model.parameters()), lambda ps: torch.optim.AdamW(ps, lr=1e-5))
        optimizer.step()
        gc.collect()
        grown, counted = _rss() - before, optimizer.host_bytes()
    else:
        ledger = HostLedger()
        with counted_save_on_cpu(HostLedger(), move=True, pinned=False):  # the hooks' first use, on a tiny batch
            model(batch[:1]).sum().backward()
        gc.collect()
        before = _rss()
        with counted_save_on_cpu(ledger, move=True, pinned=False):
            loss = model(batch).sum()
        gc.collect()
        grown, counted = _rss() - before, ledger.held
        loss.backward()
    return {"case": case, "width": width, "layers": layers, "rows": rows, "counted_bytes": counted,
            "rss_growth_bytes": grown, "error": (counted - grown) / grown}


def measure(case: str, width: int) -> dict[str, Any]:
    """``run_case`` in a fresh process with the mmap threshold fixed (see the module's description)."""
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "PYTHONPATH": str(root)}
    code = f"import json; from benchmarks.host_rss import run_case; print(json.dumps(run_case({case!r}, {width})))"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                          cwd=root)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def markdown(rows: list[dict[str, Any]]) -> str:
    """The rows as a markdown table (MiB).

    Example:
        >>> print(markdown([{"case": "optimizer", "width": 8, "layers": 8, "rows": 8, "counted_bytes": 2**20,
        ...                  "rss_growth_bytes": 2**20, "error": 0.0}]))
        | case | width | layers | rows | counted MiB | RSS growth MiB | counted vs RSS |
        |:--|--:|--:|--:|--:|--:|:--|
        | optimizer | 8 | 8 | 8 | 1.0 | 1.0 | +0.0% |
    """
    from benchmarks.common import markdown_table, mib

    return markdown_table(["case", "width", "layers", "rows", "counted MiB", "RSS growth MiB", "counted vs RSS"],
                          [[r["case"], r["width"], r["layers"], r["rows"], mib(r["counted_bytes"]),
                            mib(r["rss_growth_bytes"]), f"{r['error']:+.1%}"] for r in rows])


def main(argv: list[str] | None = None) -> int:
    smoke = "--smoke" in (argv if argv is not None else sys.argv[1:])
    rows = []
    for width in SMOKE_WIDTHS if smoke else WIDTHS:
        for case in CASES:
            row = measure(case, width)
            rows.append(row)
            print(f"{case:11} width {width}: counted {row['counted_bytes'] / MIB:8.1f} MiB, RSS grew "
                  f"{row['rss_growth_bytes'] / MIB:8.1f} MiB, counted off by {row['error']:+.1%}", flush=True)
    out = Path(__file__).resolve().parent / "results" / "host_rss-cpu.json"
    if not smoke:
        from benchmarks.common import versions

        payload = {"device": "cpu", "versions": versions(), "rows": rows, "markdown": markdown(rows)}
        out.write_text(json.dumps(payload, indent=2) + "\n")
    return 0 if all(abs(row["error"]) <= 0.10 for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
