"""``memlab.fit`` on a trainer starts from the trainer as built: its first row is what ``memlab.measure(trainer)``
measures (issue 84 item 8: notebook 14's fit drew "plain", all 8 completions in one micro-batch, at 19.2 MiB, one cell
under the trainer as built, 4 x 2, measured at 11.4 MiB)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("datasets")
from test_trainer import dataset, trainer  # noqa: E402

import memlab  # noqa: E402


def test_fit_on_a_trainer_measures_the_trainer_as_built_first(tmp_path: Path) -> None:
    t = trainer(tmp_path, data=dataset([16] * 20), per_device_train_batch_size=2, gradient_accumulation_steps=2)
    as_built = memlab.Plan.from_trainer(t)
    assert as_built != memlab.Plan() and as_built.rows_per_step(4) == 4  # 2 x 2, not all 4 rows at once
    measured = memlab.measure(t, steps=1, noise=0, progress=False)
    report = memlab.fit(t, budget=10 * measured.peak_bytes, space={"micro_batch": [4, 2, 1], "precision": ["fp32"],
                                                                   "optimizer": ["adamw"], "checkpointing": [False]},
                        steps=1, noise=0, progress=False)
    first = report.trials[0]
    assert first.plan == as_built == measured.plan
    assert first.peak_bytes == pytest.approx(measured.peak_bytes, rel=0.01)
    assert [trial.plan for trial in report.trials].count(as_built) == 1
