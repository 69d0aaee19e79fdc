"""CUDA's kernels emulated on the CPU for a CUDA dry run (memlab.estimation.cuda.kernels): dropout keeps CUDA's
one-byte mask, the GPU kind asked for is the one whose kernels are emulated, the sharded dry run emulates them too,
and checkpointing's recomputation is left as it was found."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import GPT2Config, LlamaConfig

import memlab
from memlab import Plan
from memlab.estimation.cuda.dropout import CudaDropout
from memlab.estimation.cuda.kernels import EMULATED_NOTE, cuda_kernels
from memlab.estimation.dryrun.fake import FakeMode
from memlab.techniques.checkpointing import RECOMPUTE_CONTEXTS

GPT2 = GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=128)
BATCH = {"input_ids": (4, 64), "labels": (4, 64)}


def _saved(call, *, emulate: bool = True) -> list[torch.dtype]:
    """The dtypes autograd keeps for backward of ``call(x)`` on a fake (4, 8) tensor."""
    kept: list[torch.Tensor] = []
    with FakeMode(), torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        x = torch.empty(4, 8, requires_grad=True) * 1.0
        kept.clear()
        if emulate:
            with CudaDropout():
                call(x)
        else:
            call(x)
    return [t.dtype for t in kept]


def test_dropout_keeps_a_bool_mask_as_cuda_does_where_the_cpu_keeps_float_noise() -> None:
    assert _saved(lambda x: F.dropout(x, 0.1, training=True), emulate=False) == [torch.float32]  # the CPU's path
    assert _saved(lambda x: F.dropout(x, 0.1, training=True)) == [torch.bool]
    assert _saved(lambda x: torch.dropout(x, 0.1, True)) == [torch.bool]
    assert _saved(lambda x: torch.nn.Dropout(0.3)(x)) == [torch.bool]


def test_dropout_that_cuda_does_not_fuse_is_left_to_torch() -> None:
    assert _saved(lambda x: F.dropout(x, 0.1, training=False)) == []
    assert _saved(lambda x: F.dropout(x, 0.0, training=True)) == []
    assert _saved(lambda x: F.dropout(x, 0.1, training=True, inplace=True)) == [torch.float32]  # dropout_ never fuses
    with pytest.raises(ValueError, match="dropout probability has to be between 0 and 1"):
        _saved(lambda x: F.dropout(x, 1.5, training=True))



def test_dropout_arguments_are_read_as_torch_reads_them() -> None:
    import numpy as np

    assert _saved(lambda x: F.dropout(x, np.float32(0.1), True)) == [torch.bool]  # torch takes a numpy p: fused
    assert _saved(lambda x: F.dropout(x, 0.1, True, True)) == [torch.float32]  # inplace given by position
    assert _saved(lambda x: F.dropout(x, 1, True)) == _saved(lambda x: F.dropout(x, 1, True), emulate=False)
    for training in (np.bool_(True), torch.tensor(True)):  # torch refuses a training flag that is not a bool
        with pytest.raises(TypeError, match="must be bool"):
            _saved(lambda x, training=training: F.dropout(x, 0.1, training))

def test_a_cuda_estimate_of_a_model_with_dropout_keeps_a_quarter_of_the_cpus_mask_bytes() -> None:
    plan = Plan()
    cuda = memlab.estimate(GPT2, BATCH, plan, device="cuda")
    cpu = memlab.estimate(GPT2, BATCH, plan, device="cpu")
    no_dropout = GPT2Config(**{**GPT2.to_dict(), "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0})
    cuda_plain = memlab.estimate(no_dropout, BATCH, plan, device="cuda")
    assert cuda.status == cpu.status == cuda_plain.status == "ok"
    # Per layer two hidden-size dropouts, plus the embeddings' one: 4 bytes per element on the CPU, 1 on CUDA.
    masks = (2 * GPT2.n_layer + 1) * 4 * 64 * GPT2.n_embd
    assert cuda.breakdown["activations"] - cuda_plain.breakdown["activations"] == masks
    assert EMULATED_NOTE in cuda.notes and EMULATED_NOTE not in cpu.notes


def test_the_gpu_kind_asked_for_is_the_one_whose_kernels_are_emulated() -> None:
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=4, vocab_size=256)
    for gpu, named in ((None, "NVIDIA H100 80GB HBM3 (sm90)"), ("L4-24GB", "NVIDIA L4 (sm89)"),
                       ("A100-80GB", "NVIDIA A100-SXM4-80GB (sm80)")):
        trial = memlab.estimate(config, BATCH, Plan(precision="bf16"), device="cuda", gpu=gpu)
        assert trial.status == "ok", trial.error
        assert f"CUDA attention emulated for {named}: scaled_dot_product_attention's flash backend" in trial.notes


def test_a_sharded_cuda_estimate_emulates_cudas_kernels_too() -> None:
    sharded = memlab.estimate(GPT2, BATCH, Plan(), device="cuda", gpus=2, strategy="fsdp2", gpu="A100-40GB")
    on_cpu = memlab.estimate(GPT2, BATCH, Plan(), device="cpu", gpus=2, strategy="fsdp2")
    assert sharded.status == on_cpu.status == "ok", (sharded.error, on_cpu.error)
    assert EMULATED_NOTE in sharded.notes
    assert any(note.startswith("CUDA attention emulated for NVIDIA A100-SXM4-40GB (sm80)") for note in sharded.notes)
    # GPT-2's attention dropout on the CPU keeps the whole (L, L) matrix and its mask; CUDA's fused kernel does not.
    assert sharded.breakdown["activations"] < on_cpu.breakdown["activations"]


def test_the_emulation_leaves_checkpointings_recompute_hooks_as_it_found_them() -> None:
    before = list(RECOMPUTE_CONTEXTS)
    with cuda_kernels() as attention:
        assert len(RECOMPUTE_CONTEXTS) == len(before) + 3
        assert attention.gpu.name == "H100-80GB"
    assert RECOMPUTE_CONTEXTS == before
    with pytest.raises(RuntimeError, match="boom"), cuda_kernels():
        raise RuntimeError("boom")
    assert RECOMPUTE_CONTEXTS == before
    trial = memlab.estimate(GPT2, BATCH, Plan(checkpointing=True), device="cuda")
    assert trial.status == "ok" and RECOMPUTE_CONTEXTS == before


def test_a_dry_run_takes_the_mask_branch_a_real_step_takes() -> None:
    # transformers skips the attention mask where it can read that nothing is masked and no row is packed; on fake
    # tensors it cannot read, so a dry run decides as the real step does: the CPU estimate is the measured peak.
    torch.manual_seed(0)
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=4, vocab_size=256))
    tokens = torch.randint(0, 256, (2, 256))
    for batch in ({"input_ids": tokens, "labels": tokens},
                  {"input_ids": tokens, "attention_mask": torch.ones_like(tokens), "labels": tokens}):
        for plan in (Plan(checkpointing=True), Plan()):
            measured = memlab.measure(model, batch, plan, steps=1, warmup=1, noise=0, progress=False)
            estimated = memlab.estimate(model, batch, plan, device="cpu")
            mask_bytes = tokens.numel() * 8 if "attention_mask" in batch else 0  # left out of the dry run's batch
            # Within 4 KiB (a real step's few small host-side tensors); a (256, 256) mask per layer is 128 KiB. What
            # the test process held before the step is not the step's.
            step = measured.peak_bytes - measured.preexisting_bytes
            assert abs(estimated.peak_bytes - (step - mask_bytes)) <= 4096, (plan.label(), sorted(batch), step)
    import transformers.masking_utils as masking_utils

    assert masking_utils.find_packed_sequence_indices.__name__ == "find_packed_sequence_indices"  # put back


def test_the_cli_emulates_the_kernels_of_the_gpu_it_names(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from memlab.frontends.cli.main import main

    LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=4, vocab_size=256, architectures=["LlamaForCausalLM"]).save_pretrained(tmp_path)
    assert main(["estimate", "tiny", "--config", str(tmp_path), "--batch", "2x32", "--try", "precision=bf16",
                 "--gpu", "L4-24GB", "--json"]) == 0
    (trial,) = json.loads(capsys.readouterr().out)["trials"]
    emulated = [note for note in trial["notes"] if note.startswith("CUDA attention emulated for")]
    assert emulated and all("NVIDIA L4 (sm89)" in note for note in emulated), trial["notes"]


WIDE = 1024
"""The width of a block's activations."""


class _Block(torch.nn.Module):
    """A block whose activations are wider than its input (what its recompute holds is most of the step's peak)."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.dropout, self.down = torch.nn.Linear(64, WIDE), torch.nn.Dropout(0.1), torch.nn.Linear(WIDE, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.dropout(F.gelu(self.up(x))))


class _Blocks(torch.nn.Module):
    """Three blocks with dropout after a stem (their inputs require grad, as a reentrant checkpoint needs);
    ``reentrant`` None: it checkpoints none of them itself (memlab may), else every block through
    ``torch.utils.checkpoint`` of that kind, not through memlab."""

    def __init__(self, reentrant: bool | None = None) -> None:
        super().__init__()
        self.reentrant, self.stem = reentrant, torch.nn.Linear(64, 64)
        self.blocks, self.head = torch.nn.ModuleList(_Block() for _ in range(3)), torch.nn.Linear(64, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            own = self.training and self.reentrant is not None
            x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=self.reentrant) if own else block(x)
        return self.head(x).mean()


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_model_that_checkpoints_itself_recomputes_on_cudas_kernels(reentrant: bool) -> None:
    # Its recompute runs in backward, where the emulation's modes are not active: non-reentrant, it did not match
    # its forward and the step was made again on the CPU's kernels (a note said so); reentrant, nothing checks, and
    # the recompute kept the CPU's float32 dropout noise where CUDA keeps a one-byte mask.
    from memlab.estimation.cuda.kernels import OWN_CHECKPOINT_NOTE

    rows, loss = 512, (lambda m, b: m(b))
    batch = torch.randn(rows, 64)
    own = memlab.estimate(_Blocks(reentrant), batch, Plan(), device="cuda", loss_fn=loss)
    assert own.status == "ok", own.error
    assert EMULATED_NOTE in own.notes and OWN_CHECKPOINT_NOTE not in own.notes, own.notes
    # The peak is in a block's recompute: there CUDA's dropout keeps one byte an element, the CPU's four.
    on_cpu = memlab.estimate(_Blocks(reentrant), batch, Plan(), device="cpu", loss_fn=loss)
    assert on_cpu.breakdown["activations"] - own.breakdown["activations"] == (4 - 1) * rows * WIDE
    if not reentrant:  # the same blocks checkpointed by memlab: the same step
        memlabs = memlab.estimate(_Blocks(), batch, Plan(checkpointing=True), device="cuda", loss_fn=loss)
        assert own.peak_bytes == memlabs.peak_bytes, (own.breakdown, memlabs.breakdown)
        sharded = memlab.estimate(_Blocks(reentrant), batch, Plan(), device="cuda", gpus=2, strategy="fsdp2",
                                  loss_fn=loss)
        assert sharded.status == "ok", sharded.error
        assert EMULATED_NOTE in sharded.notes and OWN_CHECKPOINT_NOTE not in sharded.notes
    assert not RECOMPUTE_CONTEXTS


def test_a_recompute_that_does_not_match_under_the_emulation_is_made_again_on_the_cpus_kernels(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # What is left of the fallback: a recompute the modes change unlike its forward (here: the emulation's
    # recompute hook made a no-op, as on a torch whose checkpoint memlab cannot reach).
    import memlab.techniques.checkpointing as checkpointing
    from memlab.estimation.cuda.kernels import OWN_CHECKPOINT_NOTE
    from memlab.estimation.dryrun.reserved import cublas_workspace_bytes

    monkeypatch.setattr(checkpointing, "_under_recompute_contexts", lambda function: function)
    model, batch, loss = _Blocks(reentrant=False), torch.randn(32, 64), (lambda m, b: m(b))
    one = memlab.estimate(model, batch, Plan(), device="cuda", loss_fn=loss)
    assert one.status == "ok", one.error
    assert OWN_CHECKPOINT_NOTE in one.notes and EMULATED_NOTE not in one.notes
    on_cpu = memlab.estimate(model, batch, Plan(), device="cpu", loss_fn=loss)
    assert one.peak_bytes == on_cpu.peak_bytes + 2 * cublas_workspace_bytes((9, 0))  # the step's cuBLAS workspaces
    assert not RECOMPUTE_CONTEXTS


def test_an_inference_estimate_for_cuda_emulates_the_attention_of_the_gpu_it_names() -> None:
    from memlab.estimation.dryrun.masks import FULL_MASK_DROPPED
    from memlab.plan import InferencePlan

    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=256)
    plan = InferencePlan(weights="bf16", new_tokens=4)
    bare = memlab.estimate(config, {"input_ids": (4, 128)}, plan, device="cuda", gpu="L4-24GB")
    masked = memlab.estimate(config, {"input_ids": (4, 128), "attention_mask": (4, 128)}, plan, device="cuda",
                             gpu="L4-24GB")
    assert bare.status == masked.status == "ok", (bare.error, masked.error)
    assert "CUDA attention emulated for NVIDIA L4 (sm89): scaled_dot_product_attention's flash backend" in bare.notes
    assert FULL_MASK_DROPPED in masked.notes and masked.peak_bytes == bare.peak_bytes
