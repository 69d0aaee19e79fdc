"""memlab's quiet block (memlab.live.quiet): the user's warnings filters, and what libraries log as they load.

memlab's quiet block and the user's warnings filters: where some warnings are errors (IPython always makes one
kind an error), a library's remark still never ends a trial, and the user's own ``ignore`` filters still decide.

What bitsandbytes logs as it loads (``Failed to load CPU gemm_4bit_forward from kernels-community: No module named
'kernels'`` on a CPU with AVX-512 BF16 and no ``kernels`` package) changes no result: where memlab imports it (a plan
applied with 8-bit AdamW or LoRA, a LoraConfig exported, an inference check), the line is kept out of the cell as in a
trial; where the user imports it, it is the user's to see."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from memlab.live.quiet import collecting, quiet

LIBRARY = {"__name__": "transformers.modeling_utils", "warnings": warnings}


def test_an_ignored_library_warning_stays_ignored_beside_an_error_filter() -> None:
    with warnings.catch_warnings(), collecting() as remarks:
        warnings.simplefilter("error", category=SyntaxWarning)  # as IPython's filter for one warning of its own
        warnings.filterwarnings("ignore", category=FutureWarning)  # the user's, as notebooks write it
        with quiet():
            exec("warnings.warn('is_gradient_checkpointing is deprecated', FutureWarning)", dict(LIBRARY))
    assert remarks.lines(everything=True) == []


def test_a_library_warning_is_a_remark_where_every_warning_is_an_error() -> None:
    with warnings.catch_warnings(), collecting() as remarks:
        warnings.simplefilter("error")
        with quiet():
            exec("warnings.warn('a library remark')", dict(LIBRARY))
        with pytest.raises(UserWarning):  # the user's own code still sees its filter
            warnings.warn("the user's own", stacklevel=1)
    assert remarks.lines(everything=True) == ["transformers: a library remark"]


def test_the_filters_are_the_users_again_after_the_block() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", category=FutureWarning)
        before = list(warnings.filters)
        with quiet():
            pass
        assert warnings.filters == before


ROOT = Path(__file__).resolve().parents[2]
SETUP = "import torch, memlab\nmodel = torch.nn.Sequential(torch.nn.Linear(8, 8))\n"


def _stderr(code: str) -> str:
    environment = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                   "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment, timeout=300,
                          check=True)
    return done.stderr


@pytest.fixture(scope="module")
def loading_line() -> str:
    """What the user's own ``import bitsandbytes`` prints on this machine (skipped where it prints nothing)."""
    said = [line for line in _stderr("import bitsandbytes").splitlines() if line.strip()]
    if not said:
        pytest.skip("this machine's bitsandbytes says nothing as it loads")
    return said[0][:40]


@pytest.mark.parametrize("code", [
    "memlab.apply(model, memlab.Plan(optimizer='adamw8bit'), loss_fn=lambda m, b: m(b).sum()).undo()",
    "memlab.apply(model, memlab.Plan(adapter='lora', lora_targets=['0']), loss_fn=lambda m, b: m(b).sum()).undo()",
    "memlab.Plan(adapter='lora').to_peft_config()",
], ids=["apply-8bit-adamw", "apply-lora", "to-peft-config"])
@pytest.mark.slow
def test_memlabs_import_of_bitsandbytes_says_nothing(loading_line: str, code: str) -> None:
    stderr = _stderr(f"{SETUP}{code}\nimport sys\nassert 'bitsandbytes' in sys.modules")
    assert loading_line not in stderr, stderr


@pytest.mark.slow
def test_the_users_own_import_still_says_it(loading_line: str) -> None:
    stderr = _stderr(f"{SETUP}import bitsandbytes\nmemlab.apply(model, memlab.Plan(optimizer='adamw8bit'), "
                     "loss_fn=lambda m, b: m(b).sum()).undo()")
    assert loading_line in stderr, stderr
