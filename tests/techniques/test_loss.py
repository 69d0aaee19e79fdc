"""loss="chunked", the chunked cross-entropy (one of issue 15's levers), on CPU: the loss and gradients of the full
one, a step that trains on the same loss, at most 60% of the full loss's activations with the estimate agreeing, an
MoE's router aux loss kept, and one refusal where it cannot apply."""


import pytest
import torch
from models import assert_same, fingerprint, lm_batch, tiny_bert, tiny_gpt2, tiny_llama
from torch import nn

import memlab
import memlab.techniques.optimizer
from memlab import Plan
from memlab.errors import UnsupportedTechnique
from memlab.techniques.loss import chunked_causal_lm_loss, chunked_loss_applies


def masked_lm_batch(rows: int = 2, length: int = 24) -> dict[str, torch.Tensor]:
    batch = lm_batch(rows=rows, length=length)
    batch["labels"][0, :5] = -100  # a prompt the loss ignores
    return batch


@pytest.mark.parametrize("make", [tiny_llama, tiny_gpt2], ids=["llama", "gpt2"])
def test_chunked_loss_and_gradients_equal_the_full_loss(make):
    model, batch = make(), masked_lm_batch()
    full = model(**batch).loss
    full.backward()
    full_grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    chunked = chunked_causal_lm_loss(model, batch)
    chunked.backward()
    torch.testing.assert_close(chunked, full, rtol=1e-5, atol=1e-6)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, full_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_a_step_with_the_chunked_loss_trains_on_the_same_loss():
    model, batch = tiny_llama(), masked_lm_batch()
    with memlab.apply(model, Plan(), lr=1e-3) as applied:
        full = applied.step(batch)
    trained = tiny_llama()  # the same start: apply trains the weights for real
    with memlab.apply(trained, Plan(loss="chunked"), lr=1e-3) as applied:
        chunked = applied.step(batch)
        assert applied.step(batch) < chunked
    assert chunked == pytest.approx(full, rel=1e-5)


def big_vocab_llama() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
        vocab_size=16384, max_position_embeddings=256,
    )
    torch.manual_seed(0)
    ids = torch.randint(0, 16384, (1, 192), generator=torch.Generator().manual_seed(1))
    return LlamaForCausalLM(config), {"input_ids": ids, "labels": ids.clone()}


def test_chunked_loss_activations_are_at_most_60_percent_of_the_full_loss_and_estimate_agrees():
    model, batch = big_vocab_llama()
    full, chunked = memlab.compare(
        model, batch, [Plan(), Plan(loss="chunked")], steps=1, noise=0, progress=False
    ).trials
    assert full.status == chunked.status == "ok", (full.error, chunked.error)
    assert chunked.breakdown["activations"] <= 0.6 * full.breakdown["activations"]
    predicted = memlab.estimate(model, batch, Plan(loss="chunked"), device="cpu")
    assert predicted.status == "ok", predicted.error
    assert abs(predicted.peak_bytes - chunked.peak_bytes) <= 0.1 * chunked.peak_bytes


def test_the_chunked_loss_is_refused_where_it_cannot_apply():
    llama, batch = tiny_llama(), lm_batch(rows=2)
    before = fingerprint(llama)

    def own_loss(model, micro):
        return model(**micro).loss

    with pytest.raises(UnsupportedTechnique, match="drop loss_fn"):
        memlab.apply(llama, Plan(loss="chunked"), loss_fn=own_loss)
    trial = memlab.measure(llama, batch, Plan(loss="chunked"), loss_fn=own_loss, steps=1, noise=0)
    assert trial.status == "error" and "loss='full'" in (trial.error or "")
    assert_same(before, fingerprint(llama))

    for model in (tiny_bert(), nn.Linear(4, 4)):
        assert not chunked_loss_applies(model)
        with pytest.raises(UnsupportedTechnique, match="causal LM with an LM head"):
            memlab.apply(model, Plan(loss="chunked"))
    with pytest.raises(UnsupportedTechnique, match="dict batch"):
        chunked_causal_lm_loss(llama, (batch["input_ids"],))  # type: ignore[arg-type]
    with pytest.raises(UnsupportedTechnique, match="labels"):
        chunked_causal_lm_loss(llama, {"input_ids": batch["input_ids"]})
    assert chunked_loss_applies(llama) and chunked_loss_applies(tiny_gpt2())


def tiny_moe(family: str, router_logits: bool = True) -> nn.Module:
    import transformers

    config_class, model_class, experts = {
        "mixtral": ("MixtralConfig", "MixtralForCausalLM", {"num_local_experts": 4}),
        "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", {"num_experts": 4, "moe_intermediate_size": 16,
                                                                 "shared_expert_intermediate_size": 16}),
        "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", {"num_experts": 4}),
    }[family]
    config = getattr(transformers, config_class)(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        num_experts_per_tok=2, vocab_size=128, output_router_logits=router_logits, router_aux_loss_coef=0.5,
        **experts,
    )
    torch.manual_seed(0)
    return getattr(transformers, model_class)(config)


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe", "olmoe"])
def test_chunked_loss_keeps_an_moe_router_aux_loss_and_its_gradients(family):
    model, batch = tiny_moe(family), masked_lm_batch()
    batch["input_ids"] = batch["input_ids"] % 128
    batch["labels"] = torch.where(batch["labels"] == -100, -100, batch["labels"] % 128)
    full = model(**batch)
    assert full.aux_loss is not None and full.aux_loss.item() > 0
    full.loss.backward()
    full_grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    assert chunked_loss_applies(model)
    chunked = chunked_causal_lm_loss(model, batch)
    chunked.backward()
    torch.testing.assert_close(chunked, full.loss, rtol=1e-5, atol=1e-6)
    for name, p in model.named_parameters():
        if name in full_grads:
            torch.testing.assert_close(p.grad, full_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_chunked_loss_of_an_moe_without_router_logits_is_the_plain_loss():
    model, batch = tiny_moe("mixtral", router_logits=False), lm_batch(rows=2)
    batch["input_ids"] = batch["input_ids"] % 128
    batch["labels"] = batch["labels"] % 128
    torch.testing.assert_close(chunked_causal_lm_loss(model, batch), model(**batch).loss, rtol=1e-5, atol=1e-6)


def test_chunked_loss_refuses_a_model_that_adds_an_aux_loss_it_cannot_reproduce():
    model = tiny_moe("mixtral")
    del model.router_aux_loss_coef  # a forward whose aux-loss form memlab does not know
    before = fingerprint(model)
    assert not chunked_loss_applies(model)
    with pytest.raises(UnsupportedTechnique, match="loss='full'"):
        memlab.apply(model, Plan(loss="chunked"))
    assert_same(before, fingerprint(model))


def test_a_chunks_recomputation_throws_nothing_through_the_loss(monkeypatch):
    # Checkpoint's early stop ends a recomputation by raising through the op that saves the last tensor (here
    # cross_entropy's C++); under CUDA's allocator history (torch 2.11, an H100) that exception came out as a
    # SystemError. The chunked loss's recomputation runs to its end instead.
    import torch.utils.checkpoint as checkpointing

    raised = []
    original = checkpointing._StopRecomputationError.__init__

    def counted(self, *args):
        raised.append(self)
        original(self, *args)

    monkeypatch.setattr(checkpointing._StopRecomputationError, "__init__", counted)
    model, batch = tiny_llama(), masked_lm_batch()
    chunked_causal_lm_loss(model, batch).backward()
    assert raised == []
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    # The counter sees a stop where one happens: the same head and loss checkpointed with early stop do raise.
    head = model.get_output_embeddings()
    hidden = torch.randn(4, head.in_features, requires_grad=True)
    checkpointing.checkpoint(lambda h: nn.functional.cross_entropy(head(h).float(), torch.zeros(4, dtype=torch.long)),
                             hidden, use_reentrant=False).backward()
    assert len(raised) == 1
