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


# The lines of a rank's script that make accelerate shard a Trainer with FSDP on this CPU. accelerate 1.15 takes an
# FSDP plugin only on a GPU-like device (AcceleratorState sets DistributedType.FSDP for MULTI_GPU, MULTI_XPU...,
# not MULTI_CPU), so a CPU rank launched with fsdp= would train unsharded under DDP. These lines set FSDP where the
# trainer gives a plugin, as accelerate does on a GPU (state.py); the sharding itself is then torch's fully_shard on
# gloo, which the bare-model rank tests (tests/estimation/sharded/test_sharded.py) run without accelerate.
FSDP_ON_CPU = """
import accelerate.state
from accelerate.utils import DistributedType

_accelerator_state = accelerate.state.AcceleratorState.__init__


def _fsdp_on_cpu(self, *args, fsdp_plugin=None, **kwargs):
    _accelerator_state(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
    if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
        if self._mixed_precision != "no":
            fsdp_plugin.set_mixed_precision(self._mixed_precision)
        self.fsdp_plugin = fsdp_plugin
        self.distributed_type = DistributedType.FSDP
        accelerate.state.PartialState._shared_state["distributed_type"] = DistributedType.FSDP


accelerate.state.AcceleratorState.__init__ = _fsdp_on_cpu
"""

# The lines of a rank's script that define fsdp2_held(model, optimizer): the bytes a rank holds between FSDP2 steps
# (each parameter's shard, the optimizer state's shards), each storage once.
FSDP2_HELD = """
def fsdp2_held(model, optimizer):
    seen = {}
    tensors = [*model.parameters(), *(t for state in optimizer.state.values() for t in state.values())]
    for tensor in tensors:
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        if isinstance(local, torch.Tensor) and local.numel():
            seen[local.untyped_storage().data_ptr()] = local.untyped_storage().nbytes()
    return sum(seen.values())
"""

# FSDP2 from a Trainer's arguments: one unit per Llama block, as accelerate's TRANSFORMER_BASED_WRAP makes them.
FSDP2_ARGS = 'fsdp=True, fsdp_config={"version": 2, "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]}'


def run_fsdp2_ranks(folder: Path, body: str, *, hidden: int, intermediate: int, vocab: int, layers: int = 4,
                    positions: int = 256, timeout: float = 900) -> list[dict[str, Any]]:
    """As :func:`run_zero3_ranks`, for a ``body`` whose trainer is set up for FSDP2 (its arguments ``FSDP2_ARGS``):
    :data:`FSDP_ON_CPU`, :data:`FSDP2_HELD` and :data:`ZERO3_STEPS`'s ``steps`` and ``Peaks`` before it; a Llama of
    ``layers`` blocks and ``positions`` positions."""
    return _run_checkpoint_ranks(folder, FSDP_ON_CPU + FSDP2_HELD + ZERO3_STEPS + body.replace(
        "FSDP2_ARGS", FSDP2_ARGS), hidden=hidden, intermediate=intermediate, vocab=vocab, layers=layers,
        positions=positions, timeout=timeout)


def run_zero3_ranks(folder: Path, body: str, *, hidden: int, intermediate: int, vocab: int,
                    timeout: float = 900) -> list[dict[str, Any]]:
    """Save a 4-layer Llama checkpoint (``hidden`` x ``intermediate``, ``vocab`` tokens) in ``folder``, run ``body``
    (its ``CHECKPOINT`` that checkpoint's path; :data:`DEEPSPEED_HELD` and :data:`ZERO3_STEPS` before it) in two
    ranks, and return what each rank wrote to ``rank<N>.json``."""
    return _run_checkpoint_ranks(folder, DEEPSPEED_HELD + ZERO3_STEPS + body, hidden=hidden,
                                 intermediate=intermediate, vocab=vocab, timeout=timeout)


def _run_checkpoint_ranks(folder: Path, script_text: str, *, hidden: int, intermediate: int, vocab: int,
                          timeout: float, layers: int = 4, positions: int = 256) -> list[dict[str, Any]]:
    """Save the checkpoint :func:`run_zero3_ranks` names, run ``script_text`` in two ranks, read their records."""
    import json

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                                 num_attention_heads=4, num_key_value_heads=4, vocab_size=vocab,
                                 max_position_embeddings=positions)).save_pretrained(folder / "checkpoint")
    script = folder / "train.py"
    script.write_text(script_text.replace("CHECKPOINT", str(folder / "checkpoint")) + CLEAN_RANK_EXIT)
    run_two_ranks(script, timeout=timeout)
    return [json.loads((folder / f"rank{rank}.json").read_text()) for rank in (0, 1)]
