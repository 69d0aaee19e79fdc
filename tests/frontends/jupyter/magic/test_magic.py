"""``%%memfit`` in a real IPython shell: grids, cell bodies, help, --apply, the search, and bad input.

Every bad invocation must raise IPython's UsageError with a one-line message, before the model is touched. In a kernel
the live figure is shown while plans run and, however the run ends, replaced by a static record (an SVG) that a saved
notebook keeps.
Models are tiny and every run uses ``--steps 1 --warmup 1 --noise 0`` so the whole file stays well under a minute
and a half.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from IPython.core.displaypub import DisplayPublisher
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.testing import globalipapp
from models import assert_same, fingerprint, lm_batch, mlp_batch, tiny_gpt2, tiny_mlp

import memlab
from memlab.events import Event, TrialFinished, TrialStarted
from memlab.frontends.jupyter.live import LiveOutput
from memlab.frontends.jupyter.magic import MemfitMagics
from memlab.frontends.jupyter.magic import render as magic_render
from memlab.frontends.jupyter.magic import run as magic_run
from memlab.frontends.jupyter.magic.parse import empty_body_transformer
from memlab.frontends.jupyter.magic.run import APPLIED_NAME
from memlab.plan import parse_grid
from memlab.report.views.static import record_bundle

FAST = "--steps 1 --warmup 1 --noise 0 --quiet"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
MIB = 1024**2
MLP_LOSS = "x, y = pairs\nloss = (mlp(x).squeeze(-1) - y).pow(2).mean()"


class Trainer:
    """Something with a model attribute, as a Hugging Face Trainer has."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model


@pytest.fixture(scope="module")
def shell() -> Iterator[InteractiveShell]:
    yield from magic_shell()


def magic_shell() -> Iterator[InteractiveShell]:
    """The session's IPython shell with memlab's extension loaded and the names the magic tests use (shared with
    test_magic_options.py)."""
    # Doctests run earlier in the session leave builtins._ behind, and IPython then never sets _ (see its
    # DisplayHook.update_user_ns); a real kernel has no builtins._.
    builtins.__dict__.pop("_", None)
    # The session's one test shell: start_ipython() answers None once it has run (the docstring examples of
    # memlab.frontends.jupyter.magic may have started it first), get_ipython() always answers the shell.
    ip = globalipapp.get_ipython()
    assert ip is not None
    ip.run_line_magic("load_ext", "memlab")
    ip.user_ns.update(
        model=tiny_gpt2(layers=1, width=16),
        batch=lm_batch(rows=4, length=8),
        mlp=tiny_mlp(blocks=2, width=8),
        pairs=mlp_batch(rows=4, width=8),
        trainer=None,
        number=3,
        frozen=tiny_mlp(blocks=1, width=8).requires_grad_(False),
        words="not a batch",
    )
    ip.user_ns["trainer"] = Trainer(ip.user_ns["model"])
    yield ip
    ip.user_ns.pop(APPLIED_NAME, None)


def memfit(shell: InteractiveShell, line: str, body: str = "\n") -> Any:
    return shell.run_cell_magic("memfit", line, body)


# --- what works -------------------------------------------------------------------------------------------------


def test_grid_gives_one_trial_per_point_and_leaves_the_model_alone(shell: InteractiveShell) -> None:
    before = fingerprint(shell.user_ns["model"])
    report = memfit(shell, f"model batch --try precision=fp32,bf16 checkpointing=off,on {FAST}")
    assert isinstance(report, memlab.Report)
    assert [t.plan for t in report.trials] == parse_grid(["precision=fp32,bf16", "checkpointing=off,on"])
    assert len(report) == 4
    assert {t.status for t in report.trials} == {"ok"}
    assert_same(before, fingerprint(shell.user_ns["model"]))


@pytest.mark.parametrize(
    "body",
    [
        "loss = model(**batch).loss",
        "out = model(**batch)\nout.loss * scale  # the last expression, with a notebook variable",
        "# a comment only: the default loss\n",
    ],
    ids=["assign", "last-expression", "comment-only"],
)
def test_body_forms(shell: InteractiveShell, body: str) -> None:
    shell.user_ns["scale"] = 0.5
    report = memfit(shell, f"model batch {FAST}", body)
    assert [t.status for t in report.trials] == ["ok"], report.trials[0].error


def test_body_runs_on_each_micro_batch(shell: InteractiveShell) -> None:
    shell.user_ns["seen"] = []
    report = memfit(
        shell,
        f"model batch --try micro_batch=2 accumulation=2 {FAST}",
        "seen.append(len(batch['input_ids']))\nloss = model(**batch).loss",
    )
    assert report.trials[0].status == "ok"
    assert shell.user_ns["seen"] and set(shell.user_ns["seen"]) == {2}
    assert "loss" not in shell.user_ns  # the body ran in a copy of the namespace


def test_tuple_batch_with_a_loss_body_and_attribute_names(shell: InteractiveShell) -> None:
    before = fingerprint(shell.user_ns["mlp"])
    body = "x, y = pairs\nloss = torch.nn.functional.mse_loss(mlp(x).squeeze(-1), y)"
    shell.user_ns["torch"] = torch
    report = memfit(shell, f"mlp pairs --try checkpointing=off,on {FAST}", body)
    assert [t.status for t in report.trials] == ["ok", "ok"]
    assert_same(before, fingerprint(shell.user_ns["mlp"]))
    report = memfit(shell, f"trainer.model batch {FAST}", "model(**batch).loss")
    assert report.trials[0].status == "ok"


def test_an_error_in_the_loss_is_a_trial_error_not_a_usage_error(shell: InteractiveShell) -> None:
    before = fingerprint(shell.user_ns["model"])
    report = memfit(shell, f"model batch {FAST}", "loss = model(**batch).loss + undefined_name")
    assert report.trials[0].status == "error"
    assert "undefined_name" in (report.trials[0].error or "")
    assert_same(before, fingerprint(shell.user_ns["model"]))


def test_line_form_and_a_cell_with_no_body(shell: InteractiveShell) -> None:
    report = shell.run_line_magic("memfit", f"model batch {FAST}")
    assert isinstance(report, memlab.Report) and report.trials[0].status == "ok"
    # IPython refuses an empty cell-magic body; %load_ext memlab installs a transformer that allows it.
    result = shell.run_cell(f"%%memfit model batch {FAST}")
    assert result.error_in_exec is None and result.error_before_exec is None
    assert isinstance(result.result, memlab.Report)
    assert shell.user_ns["_"] is result.result  # r = _ keeps the Report


def test_reload_and_unload(shell: InteractiveShell) -> None:
    shell.run_line_magic("reload_ext", "memlab")
    assert shell.find_cell_magic("memfit") is not None and shell.find_line_magic("memfit") is not None
    assert shell.input_transformers_cleanup.count(empty_body_transformer) == 1
    report = memfit(shell, f"model batch {FAST}")
    assert report.trials[0].status == "ok"
    shell.run_line_magic("unload_ext", "memlab")
    try:
        assert shell.find_cell_magic("memfit") is None and shell.find_line_magic("memfit") is None
        assert empty_body_transformer not in shell.input_transformers_cleanup
        assert MemfitMagics.__name__ not in getattr(shell.magics_manager, "registry", {})
    finally:
        shell.run_line_magic("load_ext", "memlab")
    assert shell.find_cell_magic("memfit") is not None


def test_help_comes_from_the_argument_declarations(shell: InteractiveShell, capsys: pytest.CaptureFixture[str]) -> None:
    shell.run_line_magic("pinfo", "%%memfit")
    text = capsys.readouterr().out
    for option in (
        "--try",
        "KEY=V1,V2",
        "--budget",
        "--batch-size",
        "--steps",
        "--warmup",
        "--lr",
        "--apply",
        "--dry-run",
        "--gpus",
        "N|auto",
        "--strategy",
        "fsdp2|zero2|zero3",
        "smallest N that fits",
        "never shards a live run",
        "--dry-run --gpus 8 --strategy fsdp2 --budget 80GiB",
        "--quiet",
        "--verbose",
        "--noise",
        "--time-limit",
        "static copy",
        "MODEL",
        "BATCH",
        "Examples",
        "%%memfit model batch --budget 8GiB",
    ):
        assert option in text, option


def test_usage_error_prints_one_line_in_a_cell(shell: InteractiveShell, capsys: pytest.CaptureFixture[str]) -> None:
    result = shell.run_cell("%%memfit model batch --budget lots\nloss = model(**batch).loss")
    assert isinstance(result.error_in_exec, UsageError)
    captured = capsys.readouterr()
    lines = [line for line in (captured.out + captured.err).splitlines() if line.strip()]
    assert lines == [f"UsageError: {result.error_in_exec}"]
    assert "Traceback" not in captured.err


class FrontEnd(DisplayPublisher):
    """What a notebook front end keeps of a cell's displays: outputs in order, an update replacing the output that
    has its display id (as JupyterLab, nbclient and nbconvert do)."""

    def __init__(self) -> None:
        super().__init__()
        self.outputs: list[dict[str, Any]] = []
        self.published: list[dict[str, Any]] = []

    def publish(  # type: ignore[override]
        self, data: dict[str, Any], metadata: Any = None, source: Any = None, *, transient: Any = None,
        update: bool = False, **kwargs: Any,
    ) -> None:
        display_id = (transient or {}).get("display_id")
        self.published.append({"data": data, "display_id": display_id, "update": update})
        if update:
            for output in self.outputs:
                if output["display_id"] == display_id:
                    output["data"] = data
        else:
            self.outputs.append({"data": data, "display_id": display_id})

    def clear_output(self, wait: bool = False) -> None:
        self.outputs.clear()


@pytest.fixture
def front_end(shell: InteractiveShell, monkeypatch: pytest.MonkeyPatch) -> FrontEnd:
    """The shell as a Jupyter kernel: widgets can be drawn, and what the cell displays is kept."""
    front = FrontEnd()
    monkeypatch.setattr(shell, "display_pub", front)
    monkeypatch.setattr(magic_render, "shows_widgets", lambda shell: True)
    return front


def recording_outputs(monkeypatch: pytest.MonkeyPatch, fail_at: BaseException | None = None) -> list[LiveOutput]:
    """Every LiveOutput the magic makes, kept; with ``fail_at``, the second trial's start raises it (as a Ctrl-C or
    a failure inside the run would), after the first trial was drawn."""
    made: list[LiveOutput] = []

    class Recorded(LiveOutput):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

        def __call__(self, event: Event) -> None:
            super().__call__(event)
            if fail_at is not None and isinstance(event, TrialStarted) and event.index == 1:
                raise fail_at

    monkeypatch.setattr(magic_render, "LiveOutput", Recorded)
    return made


def assert_static_record(front: FrontEnd, outputs: list[LiveOutput], plans: int, timeline: bool = False
                         ) -> dict[str, Any]:
    """The cell shows the static record of ``plans`` plans where the live figure was (the widget closed) and, after a
    run that ended normally (``timeline``), the list of plans and the picked plan's timeline, a static record too.
    Returns the figure's record."""
    assert WIDGET_VIEW in front.published[0]["data"]  # the live figure was shown while the plans ran
    assert len(front.outputs) == (3 if timeline else 1)
    if timeline:
        picker, drawn = front.outputs[1]["data"], front.outputs[2]["data"]
        assert WIDGET_VIEW in picker and picker["text/plain"].startswith("timeline of ")
        assert set(drawn) == {"image/svg+xml", "text/plain"} and drawn["text/plain"].startswith("memlab timeline: ")
    record: dict[str, Any] = front.outputs[0]["data"]
    assert WIDGET_VIEW not in record
    assert record["image/svg+xml"].startswith("<svg") and record["image/svg+xml"].rstrip().endswith("</svg>")
    assert record["text/plain"].startswith(f"memlab: {plans} plan")
    assert len(record["text/plain"]) < 200 and "FigureWidget" not in record["text/plain"]
    updates = [message for message in front.published if message["update"]]
    assert updates and updates[-1]["display_id"] == front.outputs[0]["display_id"]
    assert len(outputs) == 1 and outputs[0].figure is not None
    assert outputs[0].figure.widget.comm is None  # closed: no comm, no widget state left behind
    return record


def test_terminal_and_quiet_show_no_figure(shell: InteractiveShell, monkeypatch: pytest.MonkeyPatch) -> None:
    import IPython.display

    shown: list[Any] = []
    monkeypatch.setattr(IPython.display, "display", lambda obj, *args, **kwargs: shown.append(obj))
    memfit(shell, f"mlp pairs {FAST.replace('--quiet', '')}", MLP_LOSS)
    assert shown == []  # a terminal IPython cannot draw widgets: no figure, no huge repr
    monkeypatch.setattr(magic_render, "shows_widgets", lambda shell: True)  # as in a Jupyter kernel
    memfit(shell, f"mlp pairs {FAST}", MLP_LOSS)
    assert shown == []  # --quiet: no figure


def test_the_live_figure_is_fed_then_replaced_by_a_static_record(
    shell: InteractiveShell, front_end: FrontEnd, monkeypatch: pytest.MonkeyPatch
) -> None:
    outputs = recording_outputs(monkeypatch)
    report = memfit(shell, "mlp pairs --try checkpointing=off,on --steps 1 --warmup 1 --noise 0", MLP_LOSS)
    assert len(report) == 2
    figure = outputs[0].figure
    assert figure is not None and list(figure.widget.data[1].x) == [t.label for t in report.trials]
    record = assert_static_record(front_end, outputs, plans=2, timeline=True)
    assert record == record_bundle(report, interactive=False)
    for label in ("plain", "ckpt", "checkpointing"):  # the key spells the labels out
        assert label in record["image/svg+xml"]
    assert len(json.dumps(record)) < 40_000


def test_ctrl_c_after_the_first_plan_leaves_a_static_record(
    shell: InteractiveShell, front_end: FrontEnd, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    outputs = recording_outputs(monkeypatch, fail_at=KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt) as caught:  # the notebook stops here: "Run All" runs no further cell
        memfit(shell, "mlp pairs --try checkpointing=off,on --steps 1 --warmup 1 --noise 0", MLP_LOSS)
    report = caught.value.report  # type: ignore[attr-defined]
    assert [t.label for t in report] == ["plain"]
    assert caught.value.__traceback__ is not None and caught.value.__context__ is None
    assert "Interrupted: 1 plan(s)" in capsys.readouterr().out
    table = front_end.outputs.pop()  # the finished trials' table follows the figure's record
    assert table["data"] == front_end.published.pop()["data"] and "plain" in table["data"]["text/plain"]
    assert_static_record(front_end, outputs, plans=1)


@pytest.mark.parametrize(
    ("failure", "raised"),
    [(RuntimeError("the run broke"), RuntimeError), (memlab.MemlabError("a clear message"), UsageError)],
    ids=["exception", "memlab-error"],
)
def test_an_error_after_the_figure_was_shown_leaves_a_static_record(
    shell: InteractiveShell, front_end: FrontEnd, monkeypatch: pytest.MonkeyPatch, failure: BaseException,
    raised: type[BaseException],
) -> None:
    outputs = recording_outputs(monkeypatch, fail_at=failure)
    with pytest.raises(raised):
        memfit(shell, "mlp pairs --try checkpointing=off,on --steps 1 --warmup 1 --noise 0", MLP_LOSS)
    record = assert_static_record(front_end, outputs, plans=1)  # what the figure had drawn: the first plan
    assert "plain" in record["image/svg+xml"]


def test_a_dry_run_shows_the_static_record_and_no_widget(shell: InteractiveShell, front_end: FrontEnd) -> None:
    report = memfit(shell, "model batch --dry-run --try checkpointing=off,on --steps 1")
    assert len(report) == 2
    # No figure widget: the record, then the one widget, the list of plans, and the picked estimate's timeline.
    assert [WIDGET_VIEW in message["data"] for message in front_end.published] == [False, True, False]
    assert len(front_end.outputs) == 3 and "<svg" in front_end.outputs[0]["data"]["image/svg+xml"]
    assert front_end.outputs[2]["data"]["text/plain"].startswith("memlab timeline: ")


def test_the_record_of_sixty_plans_is_small_and_readable(
    shell: InteractiveShell, front_end: FrontEnd, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A budget search's dozens of plans: the live figure draws each, and what stays in the notebook is small."""
    sixty = sixty_trials()
    outputs = recording_outputs(monkeypatch)

    def fake_compare(model: Any, batch: Any, plans: Any, **options: Any) -> memlab.Report:
        for index, trial in enumerate(sixty.trials):
            options["callback"](TrialStarted(plan=trial.plan, index=index, total=len(sixty)))
            options["callback"](TrialFinished(trial=trial, index=index, total=len(sixty)))
        return sixty

    monkeypatch.setattr(magic_run, "compare", fake_compare)
    memfit(shell, "mlp pairs --try checkpointing=off,on --budget 2GiB", MLP_LOSS)
    record = assert_static_record(front_end, outputs, plans=60)  # these made-up trials have no timeline
    assert len(json.dumps(record)) < 150_000
    figure = outputs[0].figure
    assert figure is not None
    axis = figure.widget.layout.xaxis  # numbered ticks, level, not one per bar
    assert list(axis.ticktext[:3]) == ["1", "5", "10"] and axis.tickangle == 0
    assert "#37" in figure.widget.data[0].hovertext[36]


def sixty_trials() -> memlab.Report:
    levers = ["checkpointing=off,on", "precision=fp32,bf16"]
    plans = parse_grid(["micro_batch=all,1,2,4,8", *levers, "optimizer=adamw,adamw8bit"])
    plans += parse_grid(["micro_batch=1,2,4,8,16", "offload=optimizer", *levers])
    trials = []
    for index, plan in enumerate(plans[:60]):
        peak = (300 + 37 * index) * MIB
        if index % 9 == 4:
            trials.append(memlab.Trial(plan, "oom", peak, {}, None, None, None, "cpu", error="out of memory"))
            continue
        speed = 10.0 + index % 7
        times = tuple(8 / speed * (1 + 0.02 * step) for step in range(6))
        breakdown = {"params": peak // 4, "grads": peak // 4, "optimizer": peak // 4, "activations": peak // 8}
        trials.append(
            memlab.Trial(plan, "ok", peak, breakdown, 8 / speed, speed, None, "cpu", rows_per_step=8, step_times=times)
        )
    return memlab.Report(trials, budget=2 * 1024 * MIB)
