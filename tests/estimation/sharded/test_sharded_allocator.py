"""An FSDP2 estimate's reserve is replayed through the allocator model of the GPU kind it is for: cuBLAS's
workspaces as PyTorch sizes them for its compute capability, and its room, past which the allocator releases its
cached segments (as the one-GPU estimate's replay does)."""

from __future__ import annotations

import dataclasses

from transformers import LlamaConfig

import memlab
from memlab import Plan
from memlab.estimation.cuda.gpus import GPUS, GpuKind

# A vocabulary large enough that the warm-up's freed gradient and AdamW temporaries (tens of MiB each, in 20 MiB
# segments) cannot hold the step's logits: an allocator with unlimited room reserves new segments beside them.
CONFIG = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=4, vocab_size=32000, max_position_embeddings=512)
SHAPES = {"input_ids": (4, 256), "labels": (4, 256)}
MIB = 2**20


def _reserved(gpu: GpuKind) -> int:
    trial = memlab.estimate(LlamaConfig(**CONFIG), SHAPES, Plan(), gpus=2, strategy="fsdp2", gpu=gpu)
    assert trial.status == "ok" and trial.reserved_bytes is not None, trial
    return trial.reserved_bytes


def test_a_card_without_room_for_a_new_segment_releases_the_cached_ones_first() -> None:
    h100 = GPUS["H100-80GB"]
    roomy = _reserved(h100)
    # a card whose room (memory less the CUDA context) is 30 MiB under what the roomy card reserved
    room = roomy - 30 * MIB
    small = dataclasses.replace(h100, name="small", memory_bytes=h100.context_bytes + room)
    reserved = _reserved(small)
    assert reserved <= room < roomy, (reserved // MIB, room // MIB, roomy // MIB)


def test_cublas_workspaces_are_sized_for_the_gpus_compute_capability() -> None:
    ada = GPUS["RTX4090-24GB"]  # sm89: two 8.125 MiB workspaces, where sm90's are 32 MiB each
    hopper_twin = dataclasses.replace(ada, name="twin", capability=(9, 0))
    assert _reserved(ada) < _reserved(hopper_twin)
