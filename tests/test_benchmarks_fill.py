"""The fill section of the GPU run at its smoke size on the CPU (issue 57 item 4): its limits part finds a boundary
(the answer and the next size one step apart) and runs both, so that the GPU run tests a boundary rather than
stopping at the model's positions."""

from __future__ import annotations

import pytest
import torch

from benchmarks.gpu_sections_fill import limits_boundary


def test_the_fill_sections_limits_part_tests_a_boundary() -> None:
    part = limits_boundary("smoke", torch.device("cpu"))
    failed = [check for check in part["checks"] if check["passed"] is False]
    assert not failed, failed
    assert part["estimated_value"] and part["estimated_next"] == part["estimated_value"] + part["multiple"]
    roles = {run["role"]: run for run in part["runs"]}
    assert roles["answer"]["memlab_fits"] and not roles["next"]["memlab_fits"]
    assert part["estimated_next"] < part["config"]["max_position_embeddings"]  # a boundary, not the positions


@pytest.mark.slow  # a fresh process that imports torch, transformers and memlab: about 8 s
def test_the_boundary_s_own_loop_runs_in_a_process_of_its_own() -> None:
    # Issue 86: on a GPU the answer and the next size are trained by a user's own loop in a fresh process each (what
    # a user who starts that training holds); on the CPU the process answers that there is no cap to run under.
    from benchmarks.gpu_common import in_fresh_process

    answer = in_fresh_process("benchmarks.gpu_sections_fill:own_loop_here",
                              {"size": "smoke", "device": "cpu", "length": 64, "budget": 2**30}, 120)
    assert answer == {"answered": "ok", "status": None, "why": "no allocator cap on the CPU"}, answer
