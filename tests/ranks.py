"""Two gloo ranks on this CPU under ``torchrun``, for the tests that run DeepSpeed or FSDP2 for real."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

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
# on the rank (each parameter's partition, ds_tensor, and the persistent parameters whole: those under
# stage3_param_persistence_threshold, gathered once and never released; the fp32 and 16-bit flat partitions; the
# gradient partitions; the optimizer's state), each storage once. A script adds them before it calls the function.
DEEPSPEED_HELD = """
def deepspeed_held(module, optimizer):
    seen = {}

    def add(tensor):
        if isinstance(tensor, torch.Tensor) and tensor.numel():
            seen[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()

    for parameter in module.parameters():
        add(getattr(parameter, "ds_tensor", None))
        if getattr(parameter, "ds_persist", False):
            add(parameter.data)
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


# The lines of a rank's script that define ``ds``, a DeepSpeed ZeRO-3 config for a Trainer (its batch and
# accumulation from the arguments; DeepSpeed's CPU Adam not forced, so torch's AdamW runs), ``steps``, each step's own
# peak as memlab's tracker sees it, and ``Peaks``, the callback that records them: ``trainer.add_callback(Peaks())``.
ZERO3_STEPS = """
import json, torch
torch.set_num_threads(1)
from transformers import TrainerCallback
from memlab.measure.tracker import MemoryTracker

ds = {"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": "auto",
      "gradient_accumulation_steps": "auto", "zero_force_ds_cpu_optimizer": False, "steps_per_print": 10**9}
steps = []


class Peaks(TrainerCallback):
    def on_step_begin(self, *args, **kwargs):
        self.tracker = MemoryTracker(device="cpu")
        self.tracker.__enter__()

    def on_step_end(self, *args, **kwargs):
        self.tracker.__exit__(None, None, None)
        steps.append(self.tracker.peak_bytes)
"""


def run_zero3_ranks(folder: Path, body: str, *, hidden: int, intermediate: int, vocab: int,
                    timeout: float = 900) -> list[dict[str, Any]]:
    """Save a 4-layer Llama checkpoint (``hidden`` x ``intermediate``, ``vocab`` tokens) in ``folder``, run ``body``
    (its ``CHECKPOINT`` that checkpoint's path; :data:`DEEPSPEED_HELD` and :data:`ZERO3_STEPS` before it) in two
    ranks, and return what each rank wrote to ``rank<N>.json``."""
    import json

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=4,
                                 num_attention_heads=4, num_key_value_heads=4, vocab_size=vocab,
                                 max_position_embeddings=256)).save_pretrained(folder / "checkpoint")
    script = folder / "train.py"
    lines = body.replace("CHECKPOINT", str(folder / "checkpoint"))
    script.write_text(DEEPSPEED_HELD + ZERO3_STEPS + lines + CLEAN_RANK_EXIT)
    run_two_ranks(script, timeout=timeout)
    return [json.loads((folder / f"rank{rank}.json").read_text()) for rank in (0, 1)]
