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
