"""Sharded training: the memory of each GPU of several, before the machines are booked.

Models FSDP2 as it runs (``fully_shard`` over a fake process group, PyTorch's ``FSDPMemTracker``: :mod:`.fsdp2`,
its units as accelerate makes them: :mod:`.fsdp2.units`, its depth carried: :mod:`.fsdp2.depth`, its costs kept
linear: :mod:`.fsdp2.speed`), FSDP1 from that run, DeepSpeed ZeRO-2/3 from their formulas and the FSDP2 run's
activations (:mod:`.zero`), adapters, quantized loads and the chunked loss sharded from the one-GPU dry run
(:mod:`.composed`), and the route each plan takes and the fewest GPUs that fit (:mod:`.per_gpu`).

Assumes data parallelism over identical GPUs, the engines' defaults where the plan says nothing (accelerate's FSDP2
wrapping, DeepSpeed's bucket sizes: :mod:`memlab.live.sharding`), and ``batch`` as what one GPU sees per micro-step.
memlab never shards anything itself. Builds on ``dryrun/``, ``depth/`` and ``cuda/``; only the entry's routes
(:mod:`memlab.estimation.routes`) call it.
"""
