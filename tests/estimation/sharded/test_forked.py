"""Issue 85: a sharded estimate asked in a process torch.distributed already runs in (a launched script's rank) runs
in a forked child; the process's own group, model and answers stay as they were."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from models import lm_batch, tiny_llama

import memlab
from memlab import MemlabError, Plan
from memlab.estimation.sharded.forked import in_forked_child, launched


def test_the_childs_error_is_raised_here_as_it_was() -> None:
    def refuses() -> None:
        raise MemlabError("write gpus=2 instead")

    with pytest.raises(MemlabError, match="write gpus=2 instead"):
        in_forked_child(refuses)


def test_an_error_that_does_not_pickle_comes_back_as_one_that_says_what_it_was() -> None:
    class Unpicklable(Exception):
        def __reduce__(self) -> tuple:
            raise TypeError("no")

    def fails() -> None:
        raise Unpicklable("held a lock")

    with pytest.raises(MemlabError, match="Unpicklable: held a lock"):
        in_forked_child(fails)


def test_a_child_that_dies_is_said() -> None:
    with pytest.raises(MemlabError, match="ended without an answer"):
        in_forked_child(lambda: os._exit(3))


@contextlib.contextmanager
def one_rank_group() -> Iterator[None]:
    """This process as a launched rank: a gloo group of one, destroyed after the block."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, 1, is_master=True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _launched_rank_check() -> None:
    model, batch = tiny_llama(layers=2, width=64), lm_batch(rows=2, length=16)
    weights = {name: parameter.detach().clone() for name, parameter in model.named_parameters()}
    with one_rank_group():
        assert launched()
        inside = memlab.estimate(model, batch, Plan(), gpus=4, strategy="fsdp2", device="cpu")
        assert dist.is_initialized() and dist.get_world_size() == 1
        summed = torch.ones(3)
        dist.all_reduce(summed)
        assert summed.tolist() == [1.0, 1.0, 1.0]
    assert not launched()
    # the same question asked outside the launch, after it (on torch 2.11 a backward run in this process before
    # would keep the fork from using autograd: the next test's error)
    before = memlab.estimate(model, batch, Plan(), gpus=4, strategy="fsdp2", device="cpu")
    assert inside.status == before.status == "ok", inside.error
    assert (inside.gpus, inside.strategy) == (4, "fsdp2")
    assert (inside.peak_bytes, inside.breakdown) == (before.peak_bytes, before.breakdown)
    assert all(torch.equal(weights[name], parameter) for name, parameter in model.named_parameters())


def test_a_sharded_estimate_in_a_launched_rank_is_the_one_made_before_and_the_group_still_works() -> None:
    # In a process of its own, as a launched rank is: one that ran a backward on fake CUDA tensors before (another
    # test in this worker) has autograd's device threads, which PyTorch refuses to use in a forked child (the next
    # test's error).
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).resolve().parents[2]
    code = ("import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]\n"
            "from test_forked import _launched_rank_check\n_launched_rank_check()")
    done = subprocess.run([sys.executable, "-c", code, str(tests), str(Path(__file__).parent)], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_dry_run_that_autograd_refuses_in_the_child_is_one_error_saying_when_to_ask() -> None:
    # Seen here: a process that ran a backward with autograd's device threads before it forked; PyTorch's check in
    # the child fails the dry run, which comes back as an error trial
    from types import SimpleNamespace

    from memlab.estimation.sharded.forked import refused_by_autograd

    failed = SimpleNamespace(status="error", error="RuntimeError: Unable to handle autograd's threading in combination "
                                                   "with fork-based multiprocessing. See https://github.com/pytorch/"
                                                   "pytorch/wiki/Autograd-and-Fork")
    with pytest.raises(MemlabError, match=r"ask before the first training step \(before trainer.train\(\)\)"):
        refused_by_autograd(failed)
    other = SimpleNamespace(status="error", error="RuntimeError: something else")
    assert refused_by_autograd(other) is other
