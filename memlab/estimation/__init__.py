"""Dry runs on fake tensors: single-GPU estimates (training and inference), adapters' exact accounting, sharded
(FSDP2 / ZeRO) per-GPU estimates and model configs by name. ``memlab.estimate`` is :func:`estimate`; the flow is
told in :mod:`memlab.estimation.estimate`."""

from memlab.estimation.configs import load_config
from memlab.estimation.estimate import estimate

__all__ = ["estimate", "load_config"]
