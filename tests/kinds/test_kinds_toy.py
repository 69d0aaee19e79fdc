"""Adding a trainer kind as a contributor would (issue 87): a toy kind, declared in this file as its own folder of
``memlab/kinds/`` would declare it, and listed in ``memlab.kinds.KINDS`` (patched here: the one line a new kind adds),
is estimated (``memlab.estimate``), fitted (``memlab.fit``) and asked from the command line (``memlab estimate MODEL
--trainer toy`` with its own option), on a tiny Llama on the CPU, with nothing of the front end, the search or the
estimation written for it."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("trl")
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments  # noqa: E402
from transformers.data.data_collator import default_data_collator  # noqa: E402

import memlab  # noqa: E402
import memlab.kinds  # noqa: E402
from memlab.frontends.cli.main import main  # noqa: E402
from memlab.live.trainer_kinds import CliOption, CliWords, TrainerCli, TrainerKind, kind_of, kinds  # noqa: E402
from memlab.seams import provide  # noqa: E402

VOCAB, TOKENS = 128, 16
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": VOCAB,
          "max_position_embeddings": 64, "pad_token_id": 0, "tie_word_embeddings": False}


# --- the toy kind: what its folder, memlab/kinds/toy/, would hold --------------------------------------------------


@dataclasses.dataclass
class ToyConfig(TrainingArguments):
    """The toy trainer's config: a TrainingArguments with one field of its own."""

    toy_length: int = TOKENS


class ToyTrainer(Trainer):
    """A toy kind of trainer: the Trainer's step, on rows of ``toy_length`` tokens."""


def _settings(args: Any, positions: int | None) -> dict[str, Any]:
    length = args.toy_length or TOKENS
    if positions is not None and length > positions:
        raise memlab.MemlabError(f"--toy-length {length} is more than the model's {positions} positions")
    return {"toy_length": length, "prompt_length": None}


def _examples(args: Any, settings: dict[str, Any], tokenizer: Any, text: Callable[[int, int], str],
              count: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    rows = [tokenizer(text(settings["toy_length"], i), add_special_tokens=False)["input_ids"] for i in range(count)]
    return [{"input_ids": ids, "labels": ids} for ids in rows], {"data_collator": default_data_collator}


TOY = TrainerKind(
    "ToyTrainer", __name__, "ToyConfig", __name__,
    cli=TrainerCli("toy", settings=_settings, examples=_examples,
                   question=lambda settings: CliWords(f"rows of {settings['toy_length']} tokens"),
                   options=(CliOption("toy_length", "TOY: tokens in each row", metavar="TOKENS", example="16",
                                      before="prompt_length"),)),
)


# --- the one line a new kind adds: KINDS ----------------------------------------------------------------------------


@pytest.fixture
def toy_listed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """:data:`memlab.kinds.KINDS` with the toy kind listed last, as ``kinds/__init__.py`` would list it; the seam
    ``"trainer kinds"`` reads the list again on either side."""
    monkeypatch.setattr(memlab.kinds, "KINDS", (*memlab.kinds.KINDS, TOY))
    provide("trainer kinds", lambda: memlab.kinds.KINDS)
    yield
    monkeypatch.undo()
    provide("trainer kinds", lambda: memlab.kinds.KINDS)


def toy_trainer(tmp_path: Path) -> ToyTrainer:
    torch.manual_seed(0)
    config = {key: value for key, value in CONFIG.items() if key not in ("architectures", "model_type")}
    model = LlamaForCausalLM(LlamaConfig(**config))
    ids = torch.randint(1, VOCAB, (8, TOKENS), generator=torch.Generator().manual_seed(0)).tolist()
    args = ToyConfig(output_dir=str(tmp_path), report_to=[], use_cpu=True, save_strategy="no", max_steps=1,
                     per_device_train_batch_size=2, disable_tqdm=True)
    return ToyTrainer(model=model, args=args, train_dataset=[{"input_ids": row, "labels": row} for row in ids],
                      data_collator=default_data_collator)


def test_a_toy_kind_is_estimated_and_fitted_through_its_declaration(toy_listed: None, tmp_path: Path) -> None:
    trainer = toy_trainer(tmp_path)
    assert kind_of(trainer) is TOY and kinds()[-1] is TOY
    estimate = memlab.estimate(trainer, device="cpu")
    assert estimate.status == "ok" and estimate.estimated, estimate.error
    assert memlab.Plan.from_trainer(trainer).to_training_arguments(trl=trainer)  # its own config's keywords
    searched = memlab.fit(trainer, budget="1GiB", steps=1, noise=0, progress=False, max_trials=2)
    assert searched.best is not None and searched.best.status == "ok", searched.trials


def test_a_toy_kind_is_asked_from_the_command_line(toy_listed: None, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("MEMLAB_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIG))
    status = main(["estimate", str(path), "--trainer", "toy", "--toy-length", "24", "--per-device-train-batch-size",
                   "2", "--device", "cpu", "--budget", "1GiB", "--no-cache"])
    out, err = capsys.readouterr()
    assert status == 0, (out, err)
    assert "TOY, rows of 24 tokens, batch 2 x 1 accumulation steps" in " ".join(out.split()), out
    status = main(["estimate", str(path), "--trainer", "toy", "--device", "cpu", "--no-cache", "--json"])
    data = json.loads(capsys.readouterr()[0])
    assert status == 0 and data["trainer"]["kind"] == "toy" and data["trainer"]["toy_length"] == TOKENS
    assert data["trials"][0]["status"] == "ok", data["trials"][0]
    # Its option is its own: another kind refuses it, and the toy refuses another kind's.
    assert main(["estimate", str(path), "--trainer", "sft", "--toy-length", "8", "--no-cache"]) == 2
    assert "--toy-length is a setting of --trainer toy, not --trainer sft" in capsys.readouterr()[1]
    assert main(["estimate", str(path), "--trainer", "toy", "--num-generations", "4", "--no-cache"]) == 2
    assert "--num-generations is a setting of --trainer grpo, not --trainer toy" in capsys.readouterr()[1]


def test_without_its_line_in_kinds_the_toy_is_no_kind(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert [kind.name for kind in kinds()] == ["Trainer", "SFTTrainer", "DPOTrainer", "GRPOTrainer"]
    assert kind_of(toy_trainer(tmp_path)).name == "Trainer"  # a Trainer, and nothing of the toy's
    assert main(["estimate", "llama-7b", "--trainer", "toy"]) == 2
    assert "--trainer must be one of sft, dpo, grpo; got 'toy'" in capsys.readouterr()[1]
