"""The HTML table fits a notebook's output in a 1,000-px window (issue 84 item 9: a search's 13 columns were 830 px
where about 540 are shown, time, samples/s and noise scrolled out of sight): each number column's header is turned to
read upwards (its numbers are far narrower than ``activations KiB``), the plan's name, the status, the noise and the
notes wrap between words, the numbers never, and the cells' padding is 3 px (2 px at the sides). JupyterLab in
Chromium measures the table itself: tests/frontends/jupyter/browser/test_browser_notebook_widths.py."""

from __future__ import annotations

import re

from memlab.plan import Plan
from memlab.report import Report, Trial
from memlab.report.views.tables import headers, html_table, shown_columns, table_rows

MIB = 1024**2


def a_search() -> Report:
    """Four plans a search measured: the best, one as fast, one over the budget, one out of memory."""
    def breakdown(peak: int) -> dict[str, int]:
        return {"params": MIB, "grads": MIB, "optimizer": 2 * MIB, "activations": peak - 4 * MIB - MIB // 2,
                "other": MIB // 2}

    trials = [
        Trial(Plan(), "ok", 9 * MIB, breakdown(9 * MIB), 0.05, 160.0, None, "cpu", rows_per_step=8, budget=8 * MIB,
              step_times=(0.05, 0.051, 0.049)),
        Trial(Plan(checkpointing=True), "ok", 6 * MIB, breakdown(6 * MIB), 0.06, 133.0, None, "cpu", rows_per_step=8,
              budget=8 * MIB, step_times=(0.06,)),
        Trial(Plan(micro_batch=2, accumulation=4, checkpointing=True, precision="bf16"), "ok", 5 * MIB,
              breakdown(5 * MIB), 0.061, 131.0, None, "cpu", rows_per_step=8, budget=8 * MIB,
              step_times=(0.061, 0.06, 0.062)),
        Trial(Plan(precision="bf16"), "oom", 8 * MIB, {}, None, None, None, "cpu", budget=8 * MIB),
    ]
    return Report(trials, budget=8 * MIB)


def test_the_number_columns_headers_are_turned_and_the_words_wrap() -> None:
    report = a_search()
    page = html_table(report)
    rows = table_rows(report)
    keys = shown_columns(rows, with_mark=False, categories=report.categories)
    names = headers(report)
    words = ("plan", "status", "notes")
    numbers = [key for key in keys if key not in words and key != "number"]
    assert {"peak", "activations", "step", "samples", "spread"} <= set(numbers)
    for key in keys:
        header = re.search(rf"<th [^>]*>(<span [^>]*>)?{re.escape(names[key])}(</span>)?</th>", page)
        assert header, names[key]
        assert ("writing-mode:vertical-rl" in (header.group(1) or "")) == (key in numbers), names[key]
    cells = re.findall(r"<td style='([^']*)'>([^<]*)</td>", page)
    assert len(cells) == len(keys) * len(report.trials) and all("padding:3px" in style for style, _ in cells)
    for row in range(len(report.trials)):
        for key, (style, text) in zip(keys, cells[row * len(keys):(row + 1) * len(keys)], strict=True):
            assert ("white-space:normal" in style) == (key in (*words, "spread")), (key, text)
    assert "does not fit (OOM)" in page and ">&gt;=&nbsp;8.0</td>" in page  # a bound's sign kept by its number
