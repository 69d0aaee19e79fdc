"""Dry runs on fake tensors: single-GPU estimates (training and inference), adapters' exact accounting, sharded
(FSDP2 / ZeRO) per-GPU estimates and model configs by name. ``memlab.estimate`` is :func:`estimate`."""

from memlab.estimation.estimate import estimate, load_config

__all__ = ["estimate", "load_config"]
