"""A section for the GPU acceptance run (see :mod:`benchmarks.gpu_acceptance`): issue 46's levers on CUDA, each
measured beside memlab's CPU-made-style estimate (``memlab.estimate(..., device="cuda")``, fake tensors).

On Llama-3.2-1B's shape (the tiny Llama at the smoke size), bf16 autocast:
- selective checkpointing: ``checkpointing`` = 0, half the blocks, every block: the measured peak (on CUDA the
  tracked step's ``max_memory_allocated``) against the estimate (5%), and the activations falling as k grows;
- the attention lever: eager, sdpa and flash_attention_2 (where flash-attn is installed; else an error trial that
  says what to install) at two sequence lengths: measured against the estimate (5%), eager above sdpa;
- ``memlab.limits`` at a boundary (issue 57 item 4): a Qwen2-like model (Qwen2-0.5B's widths and its 151,936-token
  vocabulary, 8 of its 24 layers, 32,768 positions), bf16 + checkpointing, one row, under a real 8 GiB cap of the
  caching allocator: the longest length the CPU-made dry runs name (sizes of 256 tokens) and the next size are each
  run on the GPU under that cap, as memlab measures them (``memlab.measure`` with the budget) and in a user's own
  loop (fused AdamW, autocast, two steps, the allocator capped the same way; on a GPU each in a fresh process that
  holds nothing but the model, issue 86): the answer must run and the next must not fit. The measured limits (steps
  capped at the budget, each out-of-memory recovered) are recorded beside them.
Run it alone with ``python -m benchmarks.gpu_sections_fill [--smoke]``; the suite runs it at the smoke size on the CPU.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from benchmarks.gpu_common import LLAMA_1B, TINY, Checks, build_llama, is_cuda, ratio, release, timing, within


def section_fill(size: str, device: torch.device) -> dict[str, Any]:
    """Selective checkpointing, the attention lever and limits: measured against the estimate."""
    import memlab

    shape = LLAMA_1B.replace(rows=2, length=1024) if size == "full" else TINY
    model = build_llama(shape, device)
    config = shape.config()
    checks, rows = Checks(), []

    def batch(length: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, shape.vocab, (shape.rows, length), device=device,
                            generator=torch.Generator(device=device).manual_seed(1))
        return {"input_ids": ids, "labels": ids}

    def shapes(length: int) -> dict[str, tuple[int, int]]:
        return {"input_ids": (shape.rows, length), "labels": (shape.rows, length)}

    def row(kind: str, name: str, plan: Any, length: int) -> dict[str, Any]:
        trial = memlab.measure(model, batch(length), plan, steps=1, warmup=1, **timing(size))
        release(device)
        estimate = memlab.estimate(config, shapes(length), plan, device="cuda")
        entry = {"kind": kind, "plan": name, "tokens": length, "status": trial.status, "error": trial.error,
                 "measured_bytes": trial.peak_bytes, "estimated_bytes": estimate.peak_bytes,
                 "estimate_over_measured": ratio(estimate.peak_bytes, trial.peak_bytes),
                 "measured_activations": trial.breakdown.get("activations"),
                 "estimated_activations": estimate.breakdown.get("activations")}
        rows.append(entry)
        return entry

    bf16 = memlab.Plan(precision="bf16")
    half = max(1, shape.layers // 2)
    activations = []
    for k in (False, half, True):
        entry = row("checkpointing", f"bf16 checkpointing={k}", bf16.replace(checkpointing=k), shape.length)
        checks.add(f"checkpointing={k}: measured", entry["status"] == "ok", error=entry["error"])
        checks.add(f"checkpointing={k}: estimate within 5% of the measured peak on CUDA",
                   within(entry["estimated_bytes"], entry["measured_bytes"], 0.05) if is_cuda(device) else None,
                   ratio=entry["estimate_over_measured"])
        activations.append(entry["measured_activations"] or 0)
    checks.add("activations fall as more blocks are checkpointed", activations[0] > activations[1] > activations[2],
               activations=activations)

    flash = importlib_spec("flash_attn") and is_cuda(device)
    for length in (shape.length // 2, shape.length):
        peaks = {}
        for kernel in ("eager", "sdpa", "flash_attention_2"):
            entry = row("attention", f"bf16 attention={kernel}", bf16.replace(attention=kernel), length)
            if kernel == "flash_attention_2" and not flash:
                checks.add(f"{kernel} at {length} tokens without flash-attn on CUDA: an error trial saying what to "
                           "install", entry["status"] == "error" and "flash-attn" in (entry["error"] or ""))
                continue
            checks.add(f"{kernel} at {length} tokens: measured", entry["status"] == "ok", error=entry["error"])
            checks.add(f"{kernel} at {length} tokens: estimate within 5% of the measured peak on CUDA",
                       within(entry["estimated_bytes"], entry["measured_bytes"], 0.05) if is_cuda(device) else None,
                       ratio=entry["estimate_over_measured"])
            peaks[kernel] = entry["measured_bytes"]
        checks.add(f"eager holds more than sdpa at {length} tokens", peaks.get("eager", 0) > peaks.get("sdpa", 0),
                   **peaks)

    return {"model": dataclasses.asdict(shape), "rows": rows, "checks": checks.items}


def section_boundary(size: str, device: torch.device) -> dict[str, Any]:
    """``limits``' boundary under a real cap, as a part of its own: a fresh process holds nothing but its model.

    It ran at the end of ``fill`` until the H100 run of 2026-11-26 (shared/gpu-runs/2026-11-26-h100-turn7): there the
    fill rows' Llama (1.2 billion fp32 parameters, 4.6 GiB) was still alive in the process when the capped runs
    started, so the cap of 8 GiB held it too, and the answer, the user's loop and the measured ``limits`` all ran out
    of memory (6.5 GiB allocated before the measured route's first try). Each capped run records what the process
    held before it (``held_besides_model_bytes``), so that a run that starts from anything but nothing shows it."""
    return limits_boundary(size, device)


# Qwen2-0.5B's widths and vocabulary, 8 of its 24 layers: the loss's logits are most of a long row's memory.
BOUNDARY_MODEL: dict[str, dict[str, Any]] = {
    "full": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 8, "num_attention_heads": 14,
             "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 32768,
             "tie_word_embeddings": True},
    "smoke": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
              "num_key_value_heads": 1, "vocab_size": 4096, "max_position_embeddings": 4096,
              "tie_word_embeddings": True},
}
BOUNDARY_BUDGET = 8 * 2**30
"""The card the boundary is found for on the GPU (what the card shows: the allocator's reserve and the context)."""
BOUNDARY_STEP = {"full": 256, "smoke": 32}
OOM_STATS = ("allocated_bytes.all.current", "reserved_bytes.all.current", "inactive_split_bytes.all.current",
             "num_alloc_retries", "num_ooms")
"""The caching allocator's statistics kept where a user's loop runs out of memory (fragmentation shows in the
inactive split bytes)."""
BOUNDARY_START = {"full": 1024, "smoke": 64}
HELD_BESIDES_MODEL_BYTES = 64 * 2**20
"""What the boundary's process may hold on the GPU beside its model before a capped run (the allocator's rounding and
what a kernel left cached, never another model: the 4.6 GiB that made the 2026-11-26 answer run out of memory)."""


def boundary_model(size: str, device: torch.device) -> tuple[Any, torch.nn.Module]:
    """The boundary's Qwen2-like config and its model (fp32, random weights) made on ``device``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**BOUNDARY_MODEL[size])
    torch.manual_seed(0)
    with torch.device(device):
        return config, Qwen2ForCausalLM(config)


def boundary_batch(vocab: int, length: int, device: torch.device) -> dict[str, torch.Tensor]:
    """One row of ``length`` random tokens (the same in every process)."""
    ids = torch.randint(0, vocab, (1, length), device=device, generator=torch.Generator(device=device).manual_seed(1))
    return {"input_ids": ids, "labels": ids}


def own_loop_here(request: str) -> None:
    """:func:`own_loop` at one length in a process of its own, which holds nothing but the boundary's model (issue
    86: a size ``limits`` names must train in a fresh process): prints its answer as one JSON line."""
    import json

    from benchmarks import common

    asked = json.loads(request)
    common.quiet()
    device = torch.device(asked["device"])
    config, model = boundary_model(asked["size"], device)
    answer = own_loop(model, boundary_batch(config.vocab_size, asked["length"], device), asked["budget"], device)
    print(json.dumps({"answered": "ok", **answer}), flush=True)


def limits_boundary(size: str, device: torch.device) -> dict[str, Any]:
    """``limits``' answer and the next size, each run under a real cap of the caching allocator at the budget: in
    memlab's step here, and on a GPU in a user's own loop in a fresh process each."""
    import memlab
    from benchmarks.gpu_common import gpu_kind_name, in_fresh_process

    size = "full" if size == "full" else "smoke"
    config, model = boundary_model(size, device)
    plan = memlab.Plan(precision="bf16", checkpointing=True)
    model_bytes = sum(tensor.numel() * tensor.element_size() for tensor in (*model.parameters(), *model.buffers()))
    step, start = BOUNDARY_STEP[size], BOUNDARY_START[size]
    checks = Checks()

    def batch(length: int) -> dict[str, torch.Tensor]:
        return boundary_batch(config.vocab_size, length, device)

    if is_cuda(device):
        budget = BOUNDARY_BUDGET
    else:  # no real cap on the CPU: a budget a little over the start's peak, which the tracker enforces
        short = memlab.measure(model, batch(start), plan, steps=1, warmup=0, noise=0, progress=False)
        budget = int(short.peak_bytes * 1.5)
    gpu = gpu_kind_name(torch.cuda.get_device_name(device) if is_cuda(device) else None)
    shapes = {"input_ids": (1, start), "labels": (1, start)}
    # The dry runs as a laptop makes them (fake tensors; for CUDA where the section runs on it, the CPU's peaks at
    # the smoke size, where no card is modelled).
    estimated = memlab.limits(config, plan, budget=budget, batch=shapes, device=device.type, gpu=gpu, multiple=step)
    result: dict[str, Any] = {
        "config": BOUNDARY_MODEL[size], "plan": plan.label(), "budget_bytes": budget, "multiple": step, "gpu": gpu,
        "estimated_value": estimated.value, "estimated_next": estimated.next,
        "estimated_tries": [[length, trial.status, trial.card_bytes, trial.reserved_bytes, trial.peak_bytes]
                            for length, trial in estimated.tried],
        "runs": [],
    }
    checks.add("limits at a boundary: the dry runs name a length and the next, one step apart",
               bool(estimated.value) and estimated.next == estimated.value + step, value=estimated.value,
               next=estimated.next, tries=len(estimated.tried))
    for role, length in (("answer", estimated.value), ("next", estimated.next)):
        if not length:
            continue
        before = int(torch.cuda.memory_allocated(device)) - model_bytes if is_cuda(device) else None
        checks.add(f"before the {role} ({length} tokens): the process holds its model and nothing else on the GPU",
                   before < HELD_BESIDES_MODEL_BYTES if before is not None else None, held_besides_model_bytes=before)
        trial = memlab.measure(model, batch(length), plan, budget=budget, steps=1, warmup=1, noise=0,
                               progress=False)
        release(device)
        if is_cuda(device):  # a fresh process: what a user who starts the answer's training holds
            own = in_fresh_process("benchmarks.gpu_sections_fill:own_loop_here",
                                   {"size": size, "device": str(device), "length": length, "budget": budget}, 120)
        else:
            own = own_loop(model, batch(length), budget, device)
        release(device)
        estimate = estimated.trial if role == "answer" else estimated.next_trial
        run = {"role": role, "tokens": length, "held_besides_model_bytes": before,
               "memlab_status": trial.status, "memlab_fits": trial.fits,
               "memlab_card_bytes": trial.card_bytes, "memlab_reserved_bytes": trial.reserved_bytes,
               "memlab_peak_bytes": trial.peak_bytes, "own_loop": own,
               "estimated_card_bytes": estimate.card_bytes if estimate else None,
               "estimated_reserved_bytes": estimate.reserved_bytes if estimate else None,
               "estimated_peak_bytes": estimate.peak_bytes if estimate else None}
        result["runs"].append(run)
        cuda = is_cuda(device)
        if role == "answer":
            checks.add(f"the answer ({length} tokens) runs under the cap (memlab's step)", trial.fits, **_short(run))
            checks.add(f"the answer ({length} tokens) trains under the cap (a user's own loop, a fresh process)",
                       own["status"] == "ok" if cuda else None, **own)
        else:
            checks.add(f"the next size ({length} tokens) does not fit under the cap (memlab's step)",
                       not trial.fits, **_short(run))
            checks.add(f"the next size ({length} tokens) runs out of memory under the cap (a user's own loop, a fresh "
                       "process)",
                       own["status"] == "oom" if cuda else None, **own)
    measured = memlab.limits(model, plan, budget=budget, batch=batch(start), multiple=step)
    release(device)
    result.update(measured_value=measured.value, measured_next=measured.next, measured_tries=len(measured.tried),
                  measured_tried=[[length, trial.status, (trial.error or "")[:300], trial.card_bytes]
                                  for length, trial in measured.tried])
    # The dry runs' answer does not count on the capped allocator giving its cache back (memlab.search.limits), so
    # the measured steps, which may be lucky there, can go a step or two further; never shorter.
    checks.add("limits: the measured answer is at least the dry runs', within two sizes of it",
               estimated.value <= measured.value <= estimated.value + 2 * step if is_cuda(device) else None,
               measured=measured.value, estimated=estimated.value)
    del model
    release(device)
    return {**result, "checks": checks.items}


def _short(run: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in run.items() if key != "own_loop"}


def own_loop(model: torch.nn.Module, batch: dict[str, torch.Tensor], budget: int,
             device: torch.device) -> dict[str, Any]:
    """Two optimizer steps as a user writes them (fused AdamW, bf16 autocast, transformers' checkpointing), the
    caching allocator capped at ``budget`` less the CUDA context as memlab caps it: ``"ok"`` or ``"oom"`` (with the
    whole message and :data:`OOM_STATS`), and the allocator's reserved and allocated peaks. On the CPU (no cap to run
    under) nothing runs."""
    if not is_cuda(device):
        return {"status": None, "why": "no allocator cap on the CPU"}
    from memlab.measure.cuda import cap_cuda_memory

    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    optimizer: torch.optim.Optimizer | None = None
    status, error, at_oom = "ok", None, None
    torch.cuda.reset_peak_memory_stats(device)
    try:
        with cap_cuda_memory(budget, device):
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
            for _ in range(2):
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(**batch).loss
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                del loss
    except torch.OutOfMemoryError as oom:
        # The whole first line: its end says how much was allocated and how much reserved but unallocated.
        status, error = "oom", str(oom).splitlines()[0][:600]
        stats = torch.cuda.memory_stats(device)
        at_oom = {key: stats.get(key) for key in OOM_STATS}
        del oom
    finally:
        for parameter in model.parameters():
            parameter.grad = None
        del optimizer
        model.gradient_checkpointing_disable()
    reserved = int(torch.cuda.max_memory_reserved(device))
    return {"status": status, "error": error, "reserved_peak_bytes": reserved, "at_oom": at_oom,
            "allocated_peak_bytes": int(torch.cuda.max_memory_allocated(device))}


def importlib_spec(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the section on the GPU (the CPU with ``--smoke``) and print its JSON."""
    import argparse
    import json

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="the tiny Llama on the CPU")
    args = parser.parse_args(argv)
    device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    result = section_fill("smoke" if args.smoke else "full", device)
    print(json.dumps(result, indent=1, default=str))
    return result


if __name__ == "__main__":
    main()
