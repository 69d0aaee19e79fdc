"""Tiny models built from configs (nothing is downloaded) and a fingerprint of everything a trial may change."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

import torch
import transformers
from torch import nn

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore", category=FutureWarning)
# One thread: steadier timings on shared 2-core machines, and tiny models gain nothing from more. The variable is
# for the processes the tests start (the CLI, benchmark sections, the notebooks' kernels): threads that wait for
# each other on a busy core cost many times the CPU of one thread.
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")

VOCAB = 128


def tiny_gpt2(layers: int = 2, width: int = 32) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_layer=layers, n_embd=width, n_head=2, vocab_size=VOCAB, n_positions=64,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )
    torch.manual_seed(0)
    return GPT2LMHeadModel(config)


def llama_config_dir(folder: Any, width: int, heads: int, vocab: int) -> Any:
    """``folder`` with the config.json of a 2-layer Llama ``width`` wide (what ``memlab estimate PATH`` reads)."""
    transformers.LlamaConfig(hidden_size=width, intermediate_size=2 * width, num_hidden_layers=2,
                             num_attention_heads=heads, num_key_value_heads=heads, vocab_size=vocab
                             ).save_pretrained(folder)
    return folder


def tiny_llama(layers: int = 2, width: int = 32) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=width, intermediate_size=2 * width, num_hidden_layers=layers, num_attention_heads=2,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def tiny_t5() -> nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=2,
        dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0,
    )
    torch.manual_seed(0)
    return T5ForConditionalGeneration(config)


def tiny_bert() -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=3,
    )
    torch.manual_seed(0)
    return BertForSequenceClassification(config)


def tiny_mlp(blocks: int = 4, width: int = 32) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(blocks):
        layers += [nn.Sequential(nn.Linear(width, width), nn.GELU())]
    return nn.Sequential(*layers, nn.Linear(width, 1))


def mlp_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    inputs, targets = batch
    return nn.functional.mse_loss(model(inputs).squeeze(-1), targets)


def lm_batch(rows: int = 8, length: int = 16, seed: int = 1) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (rows, length), generator=generator)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def mlp_batch(rows: int = 8, width: int = 32, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, width, generator=generator), torch.randn(rows, generator=generator)


MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[], Any], Any]] = {
    "gpt2": (tiny_gpt2, lm_batch, None),
    "llama": (tiny_llama, lm_batch, None),
    "mlp": (tiny_mlp, mlp_batch, mlp_loss),
}


def fingerprint(model: nn.Module) -> dict[str, Any]:
    """Everything about a model that memlab promises to leave as it was, in a form that compares with ==."""
    modules = dict(model.named_modules(remove_duplicate=False))
    return {
        # named_parameters/named_buffers, not state_dict: non-persistent buffers (rotary inv_freq) count too.
        "tensors": {
            k: (v.dtype, v.detach().clone())
            for k, v in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
        },
        "tensor_ids": {
            k: id(v)
            for k, v in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
        },
        "requires_grad": {k: p.requires_grad for k, p in model.named_parameters()},
        "grads": {k: None if p.grad is None else p.grad.clone() for k, p in model.named_parameters()},
        "grad_ids": {k: id(p.grad) for k, p in model.named_parameters()},
        "param_ids": {k: id(p) for k, p in model.named_parameters()},
        "training": {k: m.training for k, m in modules.items()},
        "hooks": {
            k: tuple(
                tuple(getattr(m, name).keys())
                for name in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
            )
            for k, m in modules.items()
        },
        "patched": {
            k: tuple(sorted(a for a in ("forward", "gradient_checkpointing", "_require_grads_hook") if a in m.__dict__))
            for k, m in modules.items()
        },
        # Every attribute of every module and parameter, whatever its name: a flag or hook that a library sets
        # lazily during a trial shows here.
        "attributes": {k: _attributes(m) for k, m in modules.items()},
        "parameter_attributes": {k: _attributes(p) for k, p in model.named_parameters()},
        "checkpointing": {k: getattr(m, "gradient_checkpointing", None) for k, m in modules.items()},
    }


def _attributes(owner: Any) -> dict[str, Any]:
    """An object's instance attributes by identity, with the keys of the dicts it holds (hook ids, registries)."""
    described: dict[str, Any] = {}
    for name, value in vars(owner).items():
        if isinstance(value, (bool, int, float, str, type(None))):
            described[name] = value
        elif isinstance(value, dict):
            described[name] = (id(value), tuple((key, id(item)) for key, item in value.items()))
        elif isinstance(value, (set, list, tuple)):
            described[name] = (id(value), len(value))
        else:
            described[name] = id(value)
    return described


def assert_same(before: dict[str, Any], after: dict[str, Any]) -> None:
    assert before.keys() == after.keys()
    for key in before:
        if key == "tensors":
            assert before[key].keys() == after[key].keys()
            for name, (dtype, value) in before[key].items():
                assert after[key][name][0] == dtype, name
                assert torch.equal(after[key][name][1], value), f"{name} changed"
        elif key == "grads":
            for name, grad in before[key].items():
                other = after[key][name]
                assert (grad is None) == (other is None), name
                if grad is not None:
                    assert torch.equal(grad, other), name
        else:
            assert before[key] == after[key], key


MOE_EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
MOE_SMALL = dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1)


def tiny_qwen3_moe() -> nn.Module:
    """A 2-layer Qwen3-MoE of 4 experts (fused 3-D expert parameters in transformers 5)."""
    torch.manual_seed(0)
    config = transformers.Qwen3MoeConfig(**MOE_SMALL, intermediate_size=64, moe_intermediate_size=32, head_dim=16,
                                         num_experts=4, num_experts_per_tok=2)
    return transformers.Qwen3MoeForCausalLM(config)


def tiny_mixtral() -> nn.Module:
    """A 2-layer Mixtral of 4 experts."""
    torch.manual_seed(0)
    config = transformers.MixtralConfig(**MOE_SMALL, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2)
    return transformers.MixtralForCausalLM(config)


def optimizer_gradients(model: nn.Module, batch: Any, plan: Any, loss_fn: Any = None) -> list[torch.Tensor]:
    """The gradients the optimizer sees at the first step of ``memlab.apply(model, plan)`` (read by a step
    pre-hook), on a copy of the model."""
    import copy

    import memlab

    model = copy.deepcopy(model)
    applied = memlab.apply(model, plan, loss_fn=loss_fn)
    seen: list[torch.Tensor] = []

    def grab(optimizer, args, kwargs):
        seen.extend(p.grad.detach().clone() for group in optimizer.param_groups for p in group["params"])

    applied.optimizer.register_step_pre_hook(grab)
    applied.step(batch)
    applied.undo()
    return seen


def relative_error(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    """The gradients' relative error, over all of them."""
    top = torch.sqrt(sum(((g - w).double() ** 2).sum() for g, w in zip(got, want, strict=False)))
    bottom = torch.sqrt(sum((w.double() ** 2).sum() for w in want))
    return float(top / bottom)
