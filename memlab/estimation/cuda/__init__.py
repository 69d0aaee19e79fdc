"""CUDA without CUDA: what a GPU would keep, modelled on a machine that has none.

Models the card a CUDA estimate answers for (:mod:`.gpus`: compute capability, CUDA context, memory; :mod:`.context`),
the device an estimate answers for and the one whose kernels run it (:mod:`.devices`), the kernels' choices that keep
different memory on CUDA than on the CPU (:mod:`.autocast`, :mod:`.dropout`, :mod:`.attention`, put together as the
modes of one dry run by :mod:`.kernels`), and PyTorch's caching allocator (:mod:`.allocator`: reserved bytes from
allocations and frees).

Assumes PyTorch's own rules as the installed release writes them (autocast's op lists, the SDPA backends' refusals,
the allocator's rounding and block sizes), and a GPU kind memlab knows by name. Nothing here runs a step, makes a fake
tensor or imports the rest of :mod:`memlab.estimation`: the dry runs (``dryrun/``, ``depth/``, ``sharded/``) build on
it, never the reverse.
"""
