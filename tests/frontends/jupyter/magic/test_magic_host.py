"""Issue 60's host budget in the Jupyter faces: ``%%memfit --host-budget`` (as the CLI's) and the panel's host budget
field, each passed to the trials, a plan over it "does not fit (host)" in the magic's table and static record and in
the panel's status; a bad value one line that says what to write. A real IPython shell and real widgets; the dry
runs are of a tiny Llama on the meta device (a CUDA estimate: its offloaded optimizer state is host memory)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

pytest.importorskip("ipywidgets")
from IPython.core.error import UsageError  # noqa: E402
from IPython.core.interactiveshell import InteractiveShell  # noqa: E402
from models import tiny_llama  # noqa: E402
from test_magic import FrontEnd, magic_shell  # noqa: E402

import memlab  # noqa: E402
from memlab.frontends.jupyter.magic import render as magic_render  # noqa: E402

FAST = "--steps 1 --warmup 0 --noise 0 --quiet"
HOST = "does not fit (host)"


@pytest.fixture(scope="module")
def shell() -> Iterator[InteractiveShell]:
    ip = next(magic_shell())
    with torch.device("meta"):
        meta = tiny_llama()
    ids = torch.randint(0, 100, (2, 16), device="meta")
    ip.user_ns.update(meta=meta, shapes={"input_ids": ids, "labels": ids})
    yield ip


def test_memfit_judges_the_host_budget_and_shows_does_not_fit_host(shell: InteractiveShell,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    front = FrontEnd()
    monkeypatch.setattr(shell, "display_pub", front)
    monkeypatch.setattr(magic_render, "shows_widgets", lambda shell: True)
    line = "meta shapes --dry-run --try offload=none,optimizer --budget 80GiB"
    report = shell.run_cell_magic("memfit", f"{line} --host-budget 64KiB", "\n")
    plain, offloaded = report.trials
    assert offloaded.host_bytes > 64 * 1024 and plain.host_bytes == 0
    assert plain.fits and not offloaded.fits and offloaded.verdict_figure == "host"
    assert report.best is plain
    assert HOST in report._repr_html_()
    record = front.outputs[0]["data"]  # the static record the saved notebook keeps
    assert record["text/plain"].startswith("memlab: 2 plans") and HOST in record["image/svg+xml"]
    # Without --host-budget an estimate judges no host memory: both fit the card budget.
    assert all(trial.fits for trial in shell.run_cell_magic("memfit", f"{line} --quiet", "\n"))

    measured = shell.run_cell_magic("memfit", f"model batch --host-budget 3GiB {FAST}", "\n")
    assert measured.trials[0].host_budget == 3 * 2**30 and measured.trials[0].fits
    with pytest.raises(UsageError, match=r"--host-budget 'lots' is not understood; write"):
        shell.run_cell_magic("memfit", f"model batch --host-budget lots {FAST}", "\n")


def test_the_panel_has_a_host_budget_field_its_runs_are_judged_by(shell: InteractiveShell) -> None:
    model = tiny_llama()
    ids = torch.randint(0, 100, (2, 8))
    p = memlab.panel(model, {"input_ids": ids, "labels": ids}, steps=1, warmup=0, noise=0, host_budget="8GiB")
    try:
        field = p.controls["host_budget"]
        assert field.description == "host budget" and "host (CPU) memory" in field.tooltip
        assert field.value == "8.00 GiB" and any(field in getattr(row, "children", ()) for row in p.children)
        field.value = "3GiB"
        p.run_button.click()
        assert p.report.trials[-1].status == "ok" and p.report.trials[-1].host_budget == 3 * 2**30
        field.value = ""  # empty: what the machine has available as the trial starts
        p.run_button.click()
        assert p.report.trials[-1].host_budget not in (None, 3 * 2**30)
        field.value = "lots"
        p.run_button.click()
        assert len(p.report) == 2 and "Cannot run: host_budget &#x27;lots&#x27; is not understood" in p.status.value

        # A CPU run moves nothing to the host (offload has nothing to move), so the verdict is shown on the CUDA
        # estimate of the same plan, judged by the host budget: the panel's status line says which budget failed.
        over = memlab.estimate(shell.user_ns["meta"], shell.user_ns["shapes"], memlab.Plan(offload="optimizer"),
                               host_budget="64KiB")
        said, kind = p._message(over, memlab.Report([over]))
        assert kind == "warn" and said.startswith("offload-optimizer: does not fit (host): it keeps ")
        assert "over the host budget of 64.0 KiB" in said
    finally:
        p.close()
