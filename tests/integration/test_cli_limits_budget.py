"""``memlab estimate --max-tokens`` says each budget once, in its header (as the one-GPU answer does), and its answer
names the host budget where ``--host-budget`` judged the sizes too."""

from __future__ import annotations

from pathlib import Path

import pytest
from models import llama_config_dir
from test_cli_commands_run import _run  # main() with its stdout, stderr and exit status


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(llama_config_dir(tmp_path_factory.mktemp("llama_128"), 128, heads=4, vocab=1024))


def test_max_tokens_says_the_budgets_once_and_the_answer_names_the_host(config_dir: Path) -> None:
    status, out, _ = _run(["estimate", str(config_dir), "--batch", "1x64", "--budget", "2GiB", "--host-budget",
                           "3GiB", "--max-tokens"])
    assert status in (0, 1), out
    header, *rest = out.splitlines()
    assert "budget 2GiB = 2.00 GiB" in header and "host budget 3.00 GiB" in header, out
    assert out.count("2.00 GiB") == 1 and out.count("3.00 GiB") == 1, out
    answer = next(line for line in rest if line.startswith(("at most", "nothing fits")))
    assert "the budget and the host budget" in answer, out
