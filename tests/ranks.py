"""Two gloo ranks on this CPU under ``torchrun``, for the tests that run DeepSpeed or FSDP2 for real."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The last lines of a script that ran DeepSpeed in its ranks. Left to the interpreter's own exit, a rank can abort
# after its work is done ("terminate called without an active exception", SIGABRT: a thread DeepSpeed or gloo
# started is still joinable when C++ destroys it), which fails the launch though every record was written. The
# ranks meet, close their group, and leave without running those destructors.
CLEAN_RANK_EXIT = """
import os as _os, sys as _sys
torch.distributed.barrier()
torch.distributed.destroy_process_group()
_sys.stdout.flush()
_sys.stderr.flush()
_os._exit(0)
"""


# The lines of a rank's script that define deepspeed_held(module, optimizer): the bytes DeepSpeed holds between steps
# on the rank (each parameter's partition, ds_tensor; the fp32 and 16-bit flat partitions; the gradient partitions;
# the optimizer's state), each storage once. A script adds them before it calls the function.
DEEPSPEED_HELD = """
def deepspeed_held(module, optimizer):
    seen = {}

    def add(tensor):
        if isinstance(tensor, torch.Tensor) and tensor.numel():
            seen[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()

    for parameter in module.parameters():
        add(getattr(parameter, "ds_tensor", None))
    for name in ("fp32_partitioned_groups_flat", "fp16_partitioned_groups_flat", "averaged_gradients"):
        found = getattr(optimizer, name, None)
        for item in (found.values() if isinstance(found, dict) else found or []):
            for tensor in (item if isinstance(item, list) else [item]):
                add(tensor)
    add(getattr(optimizer, "grad_partitions_flat_buffer", None))
    for state in getattr(getattr(optimizer, "optimizer", None), "state", {}).values():
        for tensor in state.values():
            add(tensor)
    return sum(seen.values())
"""

def run_two_ranks(script: Path, *args: str, timeout: float = 300) -> None:
    """Run ``script`` (with ``args``) in two ranks in its own folder; a rank that fails fails the caller with the
    launch's last output. Example: ``run_two_ranks(tmp_path / "train.py", "lora")``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone", str(script), *args],
        capture_output=True, text=True, timeout=timeout, env=env, cwd=script.parent,
    )
    assert done.returncode == 0, done.stderr[-3000:]
