"""Issue 60, expandable segments in ``memlab estimate``: GPT-2 (2x256) on an H200 allocates 2.24 GiB at its peak;
PyTorch's default allocator reserves 2.79 GiB for it (card 3.54 GiB with the CUDA context), expandable segments
2.47 GiB (card 3.23 GiB). Against 3.3 GiB the plan does not fit by default and fits with expandable segments: the
answer says so, with the lines that set them, and ``--expandable-segments`` estimates it so."""

from __future__ import annotations

import contextlib
import io

import pytest

from memlab.estimation.dryrun.reserved import EXPANDABLE_NOTE
from memlab.frontends.cli import main
from memlab.live.device import ENVIRONMENT_LINE, PYTHON_LINE

QUESTION = ["estimate", "gpt2", "--batch", "2x256", "--gpu", "H200-141GB", "--budget", "3.3GiB"]


def _run(argv: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(argv)
    return status, out.getvalue()


@pytest.fixture(scope="module")
def default() -> tuple[int, str]:
    return _run(QUESTION)


def test_a_plan_that_fits_only_with_expandable_segments_is_suggested_with_the_line_to_set(
        default: tuple[int, str]) -> None:
    status, text = default
    assert status == 1  # as asked (the default allocator), nothing fits
    assert "Fits with the CUDA allocator's expandable segments" in text
    # the plan suggested has the lever on (what --try, apply and the exports take), its command estimates it so
    assert "  xseg: card 3.23 GiB (3.54 GiB with the default allocator)" in text
    assert ENVIRONMENT_LINE in text and PYTHON_LINE in text
    assert "--budget 3.3GiB --gpu H200-141GB --try expandable_segments=on\n" in text


def test_the_suggested_plan_fits_as_suggested() -> None:
    status, text = _run([*QUESTION, "--try", "expandable_segments=on"])
    assert status == 0 and "xseg" in text and "Fits with the CUDA allocator's expandable segments" not in text


def test_expandable_segments_on_the_command_line_fit_and_say_so() -> None:
    status, text = _run([*QUESTION, "--expandable-segments", "--json"])
    assert status == 0
    assert EXPANDABLE_NOTE.split(" (")[0] in text
    assert "Fits with the CUDA allocator's expandable segments" not in text


def test_no_suggestion_where_the_allocated_peak_itself_is_over_the_budget() -> None:
    status, text = _run([*QUESTION[:-1], "2.9GiB"])  # 2.24 GiB + 0.76 GiB context: over, whatever the reserve
    assert status == 1 and "expandable" not in text
