"""What a CUDA dry run's attention keeps (memlab.estimation.cuda.attention): the backend PyTorch picks, eager
attention's kept tensors, and the encoder-decoders' attention.

The CUDA attention backend memlab's dry run assumes is the one PyTorch's own selection picks (issue 57 item 2).

PyTorch's selection (``select_sdp_backend`` in ``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``; the shared
filters in ``sdp_utils_cpp.h``) cannot run on a CPU build: ``torch.backends.cuda.can_use_flash_attention`` and
``can_use_efficient_attention`` answer False there without checking anything (the kernels are not compiled in), as the
first test shows. So each case of :data:`CASES` says which backend that source picks and which of its filters refuse
the others, by the filters' names in the source read (pytorch/pytorch at 001f694a for sdp_utils.cpp, 0119c205 for
sdp_utils_cpp.h), and memlab's :func:`sdpa_backend`, :func:`flash_refusals` and :func:`efficient_refusals` must
agree. Where a CUDA GPU is at hand, the last test puts the same cases to PyTorch's own functions.

Eager attention's kept tensors are all counted (issue 57 item 6): a dry run for ``device="cuda"`` keeps, byte for
byte, the activations the CPU's measured step keeps with the same eager code, in float32 without dropout (the one
difference between the two devices there would be CUDA's one-byte dropout mask): GPT-2 (fp32 softmax of its own
dtype, the causal ``where``), OPT (softmax in float32 cast back, the weights kept by the matmul with the values) and
Llama (the same, with grouped heads repeated).

The published OPT runs (benchmarks/attention_vs_published.py) keep 8 bytes per attention element where this code keeps
6: their transformers (4.46) also kept the masked scores for ``torch.max``'s backward, which today's code no longer
calls; estimated with that code, memlab's eager-minus-SDPA difference is the published one.

Encoder-decoders estimated for CUDA count what their attention code keeps (issue 57 item 2): T5, BART, Whisper and
mT5, eager and SDPA.

The CPU runs the same operators as CUDA where both take the same attention path: the eager attention of each family
(plain operators), and SDPA's math backend (``_scaled_dot_product_attention_math``, composite code), here forced with
``sdpa_kernel`` around both runs, as a CUDA run under it would take math too. In float32 without dropout (CUDA keeps a
one-byte dropout mask where the CPU keeps float32 noise) a dry run for ``device="cuda"`` must then keep, byte for
byte, the activations the CPU's measured step keeps (memlab's MemoryTracker)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
import transformers
from packaging.version import Version
from torch.nn.attention import SDPBackend, sdpa_kernel

import memlab
from benchmarks.recorded_transformers import CONTIGUOUS_BIAS, recorded_transformers
from memlab import Plan
from memlab.estimation.cuda.attention import CudaAttention, efficient_refusals, flash_refusals, sdpa_backend
from memlab.estimation.cuda.gpus import GPUS, GpuKind
from memlab.estimation.dryrun.fake import FakeMode

BF16, FP32, FP16 = torch.bfloat16, torch.float32, torch.float16
H100, L4 = GPUS["H100-80GB"], GPUS["L4-24GB"]
T4 = dataclasses.replace(GPUS["L4-24GB"], capability=(7, 5), device_name="Tesla T4")


def qkv(dtype: torch.dtype = BF16, *, batch: int = 2, heads: int = 4, length: int = 32, source: int | None = None,
        head_dim: int = 64, value_dim: int | None = None, kv_heads: int | None = None,
        grad: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v as transformers makes them: (B, L, H, D) projections viewed as (B, H, L, D)."""
    source = length if source is None else source
    kv_heads = heads if kv_heads is None else kv_heads
    value_dim = head_dim if value_dim is None else value_dim

    def made(rows: int, count: int, dim: int) -> torch.Tensor:
        return torch.zeros(batch, rows, count, dim, dtype=dtype, requires_grad=grad).transpose(1, 2)

    return made(length, heads, head_dim), made(source, kv_heads, head_dim), made(source, kv_heads, value_dim)


def t5_bias(dtype: torch.dtype = FP32, heads: int = 4, length: int = 32) -> torch.Tensor:
    """T5's position bias as ``compute_bias`` makes it: an embedding's (L, S, H) output permuted to (1, H, L, S),
    trained (requires grad): its last dimension has stride H."""
    values = torch.zeros(length, length, heads, dtype=dtype, requires_grad=True)
    return values.permute(2, 0, 1).unsqueeze(0)


def offset_query(dtype: torch.dtype) -> torch.Tensor:
    """A query whose storage starts one element into its buffer (a slice)."""
    return torch.zeros(2 * 4 * 32 * 64 + 1, dtype=dtype)[1:].view(2, 4, 32, 64)


# (name, inputs, keywords, gpu, backend picked, flash's refusals, memory-efficient's refusals)
CASES: list[tuple[str, Callable[[], tuple[Any, ...]], dict[str, Any], GpuKind, str, list[str], list[str]]] = [
    ("bf16 causal, no mask", lambda: qkv(), {"is_causal": True}, H100, "flash", [], []),
    ("bf16 with dropout: both fused kernels take it", lambda: qkv(), {"dropout_p": 0.1}, H100, "flash", [], []),
    ("fp32, no mask", lambda: qkv(FP32), {}, H100, "efficient", ["check_dtypes_flash_attention"], []),
    ("bf16 with a float mask", lambda: (*qkv(), torch.zeros(2, 1, 32, 32, dtype=BF16)), {}, H100, "efficient",
     ["check_for_attn_mask"], []),
    ("a boolean mask", lambda: (*qkv(), torch.ones(32, 32, dtype=torch.bool)), {}, H100, "efficient",
     ["check_for_attn_mask"], []),
    ("T5's permuted position bias (transformers up to 5.19)", lambda: (*qkv(FP32), t5_bias()), {}, H100, "math",
     ["check_for_attn_mask", "check_dtypes_flash_attention", "check_last_dim_stride_equals_1_dense"],
     ["check_last_dim_stride_equals_1_dense"]),
    ("T5's bias made contiguous (transformers 5.20 on), requiring grad",
     lambda: (*qkv(FP32), t5_bias().contiguous()), {"dropout_p": 0.1}, H100, "efficient",
     ["check_for_attn_mask", "check_dtypes_flash_attention"], []),
    ("T5's permuted bias cast by autocast (strides kept)", lambda: (*qkv(), t5_bias().to(BF16)), {}, H100, "math",
     ["check_for_attn_mask", "check_last_dim_stride_equals_1_dense"], ["check_last_dim_stride_equals_1_dense"]),
    ("bf16 head dim 80: flash pads it to 88", lambda: qkv(head_dim=80), {}, H100, "flash", [], []),
    ("fp32 head dim 66: not a multiple of 4", lambda: qkv(FP32, head_dim=66), {}, H100, "math",
     ["check_dtypes_flash_attention"], ["check_head_dim_size_mem_efficient"]),
    ("bf16 head dim 68 with a mask: not a multiple of 8",
     lambda: (*qkv(head_dim=68), torch.zeros(1, 1, 32, 32, dtype=BF16)), {}, H100, "math",
     ["check_for_attn_mask"], ["check_head_dim_size_mem_efficient"]),
    ("bf16 head dim 320: over flash's 256", lambda: qkv(head_dim=320), {}, H100, "efficient",
     ["check_head_dim_size_flash"], []),
    ("value's head dim differs", lambda: qkv(value_dim=32), {}, H100, "efficient", ["check_head_dim_size_flash"], []),
    ("bf16 grouped-query heads, enable_gqa", lambda: qkv(kv_heads=2), {"enable_gqa": True}, H100, "flash", [],
     ["check_batch_size_and_num_heads_dense"]),
    ("fp32 grouped-query heads, enable_gqa", lambda: qkv(FP32, kv_heads=2), {"enable_gqa": True}, H100, "math",
     ["check_dtypes_flash_attention"], ["check_batch_size_and_num_heads_dense"]),
    ("grouped-query heads without enable_gqa", lambda: qkv(kv_heads=2), {}, H100, "math",
     ["check_batch_size_and_num_heads_dense"], ["check_batch_size_and_num_heads_dense"]),
    ("causal with more keys than queries", lambda: qkv(source=48), {"is_causal": True}, H100, "efficient",
     ["check_flash_causal_non_square_seqlens"], []),
    ("sm89, head dim 256, training with dropout", lambda: qkv(head_dim=256), {"dropout_p": 0.1}, L4, "efficient",
     ["check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89_or_120"], []),
    ("sm89, head dim 256, training without dropout", lambda: qkv(head_dim=256), {}, L4, "flash", [], []),
    ("sm89, head dim 200, inference", lambda: qkv(head_dim=200, grad=False), {"dropout_p": 0.1}, L4, "flash", [],
     []),
    ("sm75, bf16", lambda: qkv(), {}, T4, "math", ["check_flash_attention_hardware_support",
                                                   "check_dtypes_flash_attention"], ["check_tensor_dtype"]),
    ("sm75, fp16", lambda: qkv(FP16), {}, T4, "efficient", ["check_flash_attention_hardware_support"], []),
    ("sm75, fp32 head dim 66: no alignment below sm80", lambda: qkv(FP32, head_dim=66), {}, T4, "efficient",
     ["check_flash_attention_hardware_support", "check_dtypes_flash_attention"], []),
    ("a query one element into its storage, with a mask",
     lambda: (offset_query(BF16), *qkv()[1:], torch.zeros(1, 1, 32, 32, dtype=BF16)), {}, H100, "math",
     ["check_for_attn_mask"], ["check_data_ptr_alignment_mem_efficient"]),
]


def test_pytorchs_own_selection_does_not_run_on_a_cpu_build() -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA build with a GPU: the last test compares with PyTorch's own selection")
    q, k, v = qkv()
    params = torch.backends.cuda.SDPAParams(q, k, v, None, 0.0, False, False)
    assert not torch.backends.cuda.can_use_flash_attention(params, False)
    assert not torch.backends.cuda.can_use_efficient_attention(params, False)  # on any input: nothing is checked


@pytest.mark.parametrize(("name", "inputs", "keywords", "gpu", "backend", "flash", "efficient"), CASES,
                         ids=[case[0] for case in CASES])
def test_memlab_picks_the_backend_pytorchs_filters_pick(
    name: str, inputs: Callable[[], tuple[Any, ...]], keywords: dict[str, Any], gpu: GpuKind, backend: str,
    flash: list[str], efficient: list[str],
) -> None:
    tensors = inputs()
    assert sdpa_backend(*tensors, **keywords, gpu=gpu) == backend
    assert flash_refusals(*tensors, **keywords, gpu=gpu) == flash
    efficient_keywords = {"enable_gqa": keywords.get("enable_gqa", False)}
    assert efficient_refusals(*tensors, **efficient_keywords, gpu=gpu) == efficient


def test_backends_switched_off_are_skipped_as_select_sdp_backend_skips_them() -> None:
    q, k, v = qkv()
    with sdpa_kernel(SDPBackend.MATH):
        assert sdpa_backend(q, k, v) == "math"
        assert flash_refusals(q, k, v) == ["check_runtime_disabled_flash"]
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        assert sdpa_backend(q, k, v) == "efficient"


def _kept(call: Callable[[], torch.Tensor]) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """What autograd keeps for backward of ``call()``: each storage once, as (shape, dtype), largest first."""
    kept: dict[int, tuple[tuple[int, ...], torch.dtype, int]] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        kept[storage.data_ptr()] = (tuple(tensor.shape), tensor.dtype, storage.nbytes())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        call()
    return sorted(((shape, dtype) for shape, dtype, _ in kept.values()), key=lambda item: (-math.prod(item[0]),
                                                                                            str(item)))


@pytest.mark.parametrize("dtype", [FP32, BF16])
@pytest.mark.parametrize("kind", ["mask", "causal", "gqa", "bias that trains"])
def test_the_math_backend_keeps_what_pytorchs_math_backend_keeps(dtype: torch.dtype, kind: str) -> None:
    """The emulated math backend against ``_scaled_dot_product_attention_math`` itself, run on this CPU (the same
    composite code runs on CUDA): the same tensors kept, half precision upcast to float32 included."""
    torch.manual_seed(0)
    q, k, v = qkv(dtype, kv_heads=2 if kind == "gqa" else None)
    mask = {"mask": torch.zeros(2, 1, 32, 32, dtype=dtype), "bias that trains": t5_bias(dtype)}.get(kind)
    keywords = {"is_causal": kind == "causal", "enable_gqa": kind == "gqa"}
    reference = _kept(lambda: torch.ops.aten._scaled_dot_product_attention_math(q, k, v, mask, 0.0, **keywords))

    def emulated() -> torch.Tensor:
        with sdpa_kernel(SDPBackend.MATH), CudaAttention() as attention:
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, mask, **keywords)
        assert attention.backends == {"math"}
        return out

    assert _kept(emulated) == reference


def test_the_math_backends_dropout_keeps_cudas_one_byte_mask() -> None:
    q, k, v = qkv(BF16)
    with sdpa_kernel(SDPBackend.MATH), CudaAttention():
        kept = _kept(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=0.1))
    # The float32 probabilities (softmax's output), native_dropout's one-byte mask (the CPU keeps float32 noise)
    # and the dropped probabilities (bmm's input, folded to (B * H, L, S)).
    squares = sorted(str(dtype) for shape, dtype in kept if math.prod(shape) == 2 * 4 * 32 * 32)
    assert squares == ["torch.bool", "torch.float32", "torch.float32"]


def test_a_position_bias_that_trains_gets_the_memory_efficient_kernels_grad_bias() -> None:
    """``_efficient_attention_backward`` writes a gradient of the whole expanded bias, (B, H, L, S) with S aligned
    to 16, in the bias's dtype; autograd sums it back into the (1, H, L, S) bias, which so gets its gradient."""
    made: list[tuple[int, ...]] = []

    class Allocations(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor):
                made.append(tuple(out.shape))
            return out

    with FakeMode():
        q, k, v = qkv(FP32, length=40)
        embedded = torch.zeros(40, 40, 4, requires_grad=True)  # the relative_attention_bias embedding's output
        bias = embedded.permute(2, 0, 1).unsqueeze(0).contiguous()
        with CudaAttention() as attention:
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, bias)
        assert attention.backends == {"efficient"}
        with Allocations():
            out.sum().backward()
    assert (2, 4, 40, 48) in made
    assert embedded.grad is not None and tuple(embedded.grad.shape) == (40, 40, 4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="PyTorch's own selection needs a CUDA build and a GPU")
def test_on_a_gpu_pytorchs_own_selection_agrees_with_every_case_for_its_capability() -> None:
    capability = torch.cuda.get_device_capability()
    gpu = dataclasses.replace(H100, capability=capability)
    for name, inputs, keywords, _, _, _, _ in CASES:
        if any(t.storage_offset() for t in inputs()):
            continue  # a copy to the GPU starts its storage anew
        tensors = [t.detach().cuda().requires_grad_(t.requires_grad) for t in inputs()]
        tensors += [None] * (4 - len(tensors))
        params = torch.backends.cuda.SDPAParams(*tensors, keywords.get("dropout_p", 0.0),
                                                keywords.get("is_causal", False), keywords.get("enable_gqa", False))
        assert torch.backends.cuda.can_use_flash_attention(params, False) == (
            not flash_refusals(*tensors, **keywords, gpu=gpu)), name
        assert torch.backends.cuda.can_use_efficient_attention(params, False) == (
            not efficient_refusals(*tensors, enable_gqa=keywords.get("enable_gqa", False), gpu=gpu)), name


def gpt2() -> torch.nn.Module:
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=128, n_positions=64, n_embd=64, n_layer=2, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, attn_implementation="eager"))


def opt() -> torch.nn.Module:
    return transformers.OPTForCausalLM(transformers.OPTConfig(
        vocab_size=128, hidden_size=64, word_embed_proj_dim=32, num_hidden_layers=2, num_attention_heads=4,
        ffn_dim=128, max_position_embeddings=64, do_layer_norm_before=False, dropout=0.0, attention_dropout=0.0,
        attn_implementation="eager"))


def llama() -> torch.nn.Module:
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, attn_implementation="eager"))


@pytest.mark.parametrize("make", [gpt2, opt, llama], ids=["gpt2", "opt", "llama"])
def test_a_cuda_estimate_keeps_what_eager_attention_keeps_on_the_cpu(make: Callable[[], torch.nn.Module]) -> None:
    torch.manual_seed(0)
    model = make()
    ids = torch.randint(0, 128, (2, 48), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "labels": ids}
    estimate = memlab.estimate(model, batch, Plan(), device="cuda")
    measured = memlab.measure(model, batch, Plan(), steps=1, warmup=1, progress=False, noise=0)
    assert estimate.status == measured.status == "ok", estimate.error or measured.error
    assert estimate.breakdown["activations"] == measured.breakdown["activations"]


LENGTH = 48
T5_SIZES: dict[str, Any] = {"vocab_size": 128, "d_model": 64, "d_kv": 16, "d_ff": 128, "num_layers": 2,
                            "num_decoder_layers": 2, "num_heads": 4, "decoder_start_token_id": 0, "pad_token_id": 0}
BART_SIZES: dict[str, Any] = {"vocab_size": 128, "d_model": 64, "encoder_layers": 2, "decoder_layers": 2,
                              "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 128,
                              "decoder_ffn_dim": 128}
NO_DROPOUT = {"dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0}


def t5(attention: str) -> torch.nn.Module:
    config = transformers.T5Config(**T5_SIZES, dropout_rate=0.0, attn_implementation=attention)
    return transformers.T5ForConditionalGeneration(config)


def mt5(attention: str) -> torch.nn.Module:
    config = transformers.MT5Config(**T5_SIZES, dropout_rate=0.0, attn_implementation=attention)
    return transformers.MT5ForConditionalGeneration(config)


def bart(attention: str) -> torch.nn.Module:
    config = transformers.BartConfig(**BART_SIZES, **NO_DROPOUT, max_position_embeddings=128,
                                     attn_implementation=attention)
    return transformers.BartForConditionalGeneration(config)


def whisper(attention: str) -> torch.nn.Module:
    config = transformers.WhisperConfig(**BART_SIZES, **NO_DROPOUT, num_mel_bins=8, max_source_positions=32,
                                        max_target_positions=64, decoder_start_token_id=1, pad_token_id=0,
                                        bos_token_id=1, eos_token_id=2, attn_implementation=attention)
    return transformers.WhisperForConditionalGeneration(config)


FAMILIES: dict[str, Callable[[str], torch.nn.Module]] = {"t5": t5, "bart": bart, "whisper": whisper, "mt5": mt5}


def batch(family: str) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(2, 128, (2, LENGTH), generator=generator)
    if family == "whisper":  # 64 frames of 8 mel bins: the encoder's two convolutions make 32 positions
        return {"input_features": torch.randn(2, 8, 64, generator=generator), "labels": labels}
    return {"input_ids": torch.randint(2, 128, (2, LENGTH), generator=generator), "labels": labels}


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_cuda_estimate_keeps_the_activations_the_same_attention_keeps_on_the_cpu(family: str,
                                                                                   attention: str) -> None:
    torch.manual_seed(0)
    model = FAMILIES[family](attention)
    with sdpa_kernel(SDPBackend.MATH):  # the backend a CUDA run takes under it, and the CPU's
        estimate = memlab.estimate(model, batch(family), Plan(), device="cuda")
        measured = memlab.measure(model, batch(family), Plan(), steps=1, warmup=1, progress=False, noise=0)
    assert estimate.status == measured.status == "ok", estimate.error or measured.error
    assert estimate.breakdown["activations"] == measured.breakdown["activations"]
    notes = [note for note in estimate.notes if note.startswith("CUDA attention emulated")]
    assert notes == ([] if attention == "eager" else [
        "CUDA attention emulated for NVIDIA H100 80GB HBM3 (sm90): scaled_dot_product_attention's math backend"])


@pytest.mark.parametrize("version", ["5.17.0", None])
def test_t5s_position_bias_takes_math_where_its_last_dimension_is_strided(version: str | None) -> None:
    """T5's SDPA mask is its position bias: up to transformers 5.19 as ``permute`` made it (strided: math, for the
    encoder's and the decoder's self-attention; the cross-attention's zeros are contiguous: memory-efficient), from
    5.20 made contiguous (memory-efficient throughout). None: the installed release's code (the floor stack's 5.17
    or the newest stack's)."""
    made = Version(version or transformers.__version__)
    backends = "efficient backend" if made >= CONTIGUOUS_BIAS else "efficient, math backends"
    config = transformers.T5Config(**T5_SIZES, attn_implementation="sdpa")
    config.architectures = ["T5ForConditionalGeneration"]
    shapes = {"input_ids": (2, LENGTH), "labels": (2, LENGTH)}
    with recorded_transformers(version):
        trial = memlab.estimate(config, shapes, Plan(), device="cuda")
    assert trial.status == "ok", trial.error
    assert f"scaled_dot_product_attention's {backends}" in " ".join(trial.notes)
