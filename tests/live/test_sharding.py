"""The torch-free facts of sharded training (memlab.live.sharding): DeepSpeed's settings read from a config as
DeepSpeed and transformers read them, and the engine the installed accelerate has."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from memlab import MemlabError
from memlab.live.sharding import (
    DS_PERSISTENCE_THRESHOLD,
    DS_PREFETCH_BUCKET,
    ZeroSettings,
    check_accelerate,
    hidden_size_of,
)


def test_a_zero_section_is_read_as_deepspeed_and_transformers_read_it() -> None:
    read = ZeroSettings.from_config({"reduce_bucket_size": 2e8, "stage3_prefetch_bucket_size": "auto",
                                     "stage3_param_persistence_threshold": "auto"}, hidden_size=4096)
    assert (read.reduce_bucket_size, read.stage3_prefetch_bucket_size) == (200_000_000, int(0.9 * 4096 * 4096))
    assert read.stage3_param_persistence_threshold == 40_960
    assert read.describe(3) == ('reduce_bucket_size 2e8 (the config\'s), stage3_prefetch_bucket_size 15,099,494 (the '
                                'config\'s "auto": 0.9 x hidden_size², hidden_size 4096), '
                                'stage3_param_persistence_threshold 40,960 (the config\'s "auto": 10 x hidden_size, '
                                'hidden_size 4096)')
    # ZeRO-2 reads no stage-3 key (transformers fills none of them there); a key left out is DeepSpeed's default
    two = ZeroSettings.from_config({"stage3_prefetch_bucket_size": "auto"}, stage=2)
    assert two == ZeroSettings() and two.describe(2).endswith("(DeepSpeed's defaults)")
    assert ZeroSettings.from_config({}).stage3_param_persistence_threshold == DS_PERSISTENCE_THRESHOLD
    with pytest.raises(MemlabError, match=r"transformers fills from the model config's hidden_size, and this model's "
                                          r"config has none; write a number of elements, such as "
                                          r"stage3_prefetch_bucket_size: 5e7"):
        ZeroSettings.from_config({"stage3_prefetch_bucket_size": "auto"})
    for value in ("5e8", 1.5, True, None):
        with pytest.raises(MemlabError, match=r"is not a number of elements"):
            ZeroSettings.from_config({"reduce_bucket_size": value})
    assert ZeroSettings().gather_bucket(3, 10**9) == DS_PREFETCH_BUCKET


def test_the_hidden_size_is_found_where_transformers_looks() -> None:
    assert hidden_size_of(SimpleNamespace(hidden_size=64, hidden_sizes=[1, 2])) == 64
    assert hidden_size_of(SimpleNamespace(text_config=SimpleNamespace(hidden_size=32))) == 32
    assert hidden_size_of(None) is None


def test_fsdp2_is_refused_where_the_installed_accelerate_has_none(monkeypatch: pytest.MonkeyPatch) -> None:
    fsdp_utils = pytest.importorskip("accelerate.utils.fsdp_utils")
    check_accelerate("fsdp2", "this trainer's FSDP2 (fsdp=True)")
    monkeypatch.delattr(fsdp_utils, "fsdp2_prepare_model")
    check_accelerate("fsdp1", "this trainer's FSDP1 (fsdp=True)")
    check_accelerate("zero3", "this trainer's DeepSpeed ZeRO-3 (deepspeed=...)")
    with pytest.raises(MemlabError, match=r"^this trainer's FSDP2 \(fsdp=True\) runs on accelerate's FSDP2 "
                                          r"\(accelerate.utils.fsdp_utils.fsdp2_prepare_model\), and the installed "
                                          r"accelerate \S+ has none; write pip install -U accelerate"):
        check_accelerate("fsdp2", "this trainer's FSDP2 (fsdp=True)")
