"""Host memory as a verdict figure (DESIGN.md 2.4): Trial.host_bytes and host_budget, the verdict that names the
host, the table's host column and words, JSON both ways."""

from __future__ import annotations

import dataclasses
import json

from memlab import Plan
from memlab.report import Report, Trial
from memlab.report.views.tables import status_text, text_table, verdict_text

GIB = 2**30


def _offloaded(host_bytes: int, host_budget: int | None, device: str = "cuda:0") -> Trial:
    return Trial(Plan(offload="optimizer"), "ok", 10 * GIB, {"params": 4 * GIB}, 1.0, 8.0, None, device,
                 budget=20 * GIB, reserved_bytes=11 * GIB, context_bytes=GIB, host_bytes=host_bytes,
                 host_budget=host_budget)


def test_a_plan_within_the_card_budget_and_over_the_host_budget_does_not_fit_by_the_host() -> None:
    over = _offloaded(24 * GIB, 16 * GIB)
    assert over.verdict_bytes <= 20 * GIB  # the card budget holds
    assert not over.fits and over.verdict_figure == "host" and not over.host_fits
    within = _offloaded(12 * GIB, 16 * GIB)
    assert within.fits and within.verdict_figure == "card"
    unjudged = _offloaded(24 * GIB, None)
    assert unjudged.fits and unjudged.verdict_figure == "card"
    # over both: the device figure decided (it is checked first, as the card is what stops the run)
    both = dataclasses.replace(over, budget=5 * GIB)
    assert not both.fits and both.verdict_figure == "card"


def test_the_host_verdict_is_said_in_every_face() -> None:
    over = _offloaded(24 * GIB, 16 * GIB)
    report = Report([over, _offloaded(12 * GIB, 16 * GIB)], budget=20 * GIB)
    assert status_text(over, report.fits(over)) == "does not fit (host)"
    assert verdict_text(over, over.fits) == "does not fit (host)"
    text = text_table(report)
    header, first, second = text.splitlines()[:3]
    assert "host GiB" in header
    assert "does not fit (host)" in first and "24.0" in first
    assert "does not fit" not in second and "12.0" in second
    assert "Host budget: 16.00 GiB" in text
    assert report.best is report.trials[1]
    assert "does not fit (host)" in report._repr_html_()
    on_cpu = _offloaded(24 * GIB, 16 * GIB, device="cpu")
    assert status_text(on_cpu, on_cpu.fits) == "does not fit (host)"


def test_no_host_column_where_no_plan_keeps_bytes_on_the_host() -> None:
    plain = Trial(Plan(), "ok", 2 * GIB, {}, 1.0, 8.0, None, "cpu", host_budget=16 * GIB)
    text = text_table(Report([plain]))
    assert "host" not in text.splitlines()[0] and "Host budget" not in text


def test_json_carries_host_bytes_and_budget_and_old_json_loads() -> None:
    report = Report([_offloaded(24 * GIB, 16 * GIB)], budget=20 * GIB)
    data = json.loads(report.to_json())["trials"][0]
    assert data["host_bytes"] == 24 * GIB and data["host_budget"] == 16 * GIB
    assert data["fits"] is False and data["verdict_figure"] == "host"
    assert Report.from_json(report.to_json()) == report
    old = dict(data)
    del old["host_bytes"], old["host_budget"]
    loaded = Trial.from_dict(old)
    assert loaded.host_bytes == 0 and loaded.host_budget is None and loaded.fits
    frame = report.to_dataframe()
    assert frame["host_bytes"][0] == 24 * GIB and frame["host_budget"][0] == 16 * GIB


def test_the_search_never_takes_a_plan_over_the_host_budget_for_the_best() -> None:
    from memlab.search.space import best_of

    fast = Trial(Plan(offload="all"), "ok", GIB, {}, 0.5, 16.0, None, "cuda:0", host_bytes=8 * GIB,
                 host_budget=4 * GIB)
    slow = Trial(Plan(checkpointing=True), "ok", GIB, {}, 1.0, 8.0, None, "cuda:0", host_budget=4 * GIB)
    assert best_of([fast, slow], 2 * GIB) is slow
    assert Report([fast, slow], budget=2 * GIB).best is slow


def test_the_figures_say_does_not_fit_host_where_the_host_decided() -> None:
    from memlab.report.views.figure import figure_data
    from memlab.report.views.static import record_bundle

    report = Report([_offloaded(24 * GIB, 16 * GIB), _offloaded(12 * GIB, 16 * GIB)], budget=20 * GIB)
    data = figure_data(report)
    assert data["verdict"] == ["over budget", "fits"]  # drawn as a plan that does not fit
    assert "does not fit (host)" in data["hover"][0] and "does not fit" not in data["hover"][1]
    assert "does not fit (host)" in record_bundle(report, interactive=False)["image/svg+xml"]
