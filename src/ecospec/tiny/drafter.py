"""Build stage: the tiny target's EAGLE-3 head, trained on the target's own hidden states and outputs.

Teacher forcing plus two training-time-test steps (`ttt_steps=3`), on windows of the corpus stream;
saved in the speculators layout (`layers.0.*`, top-level `eagle_aux_hidden_state_layer_ids` in HF indices: vLLM's own
format, so `vllm serve` loads the build's head as it is), without `d2t`/`t2d` (its draft vocabulary is the whole
vocabulary, for which vLLM refuses the tables); `load_eagle3` reads it back like a public head. Its attention has the
target's shape (heads of 32: vLLM's CPU attention takes no head size below 32).

Size: one decoder layer at the target's hidden size (64), as every public EAGLE-3 head; on a CPU its cost per
forward is fixed whatever its width, so a 3-level tree (3 forwards + tree bookkeeping) stays a small fraction of an
AR step of the deep target, as drafting is of a step in the paper's systems. MLP width 512 (8 x hidden): better
held-out agreement with the target than 256 at the same cost per draft forward. The draft vocabulary is the whole
vocabulary (a smaller one agreed less and was no faster). The teacher forwards use the sorted experts kernel
(faster than the eager loop). The figures behind each choice: docs/embedded-default.md, "How the recipe was chosen".
"""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import torch


def stream_windows(tokens: np.ndarray, length: int, count: int, seed: int) -> list[torch.Tensor]:
    """`count` windows of `length` tokens at seeded random offsets of a token stream."""
    rng = np.random.default_rng(seed)
    count = min(count, max(1, len(tokens) // length))
    starts = rng.choice(len(tokens) - length, size=count, replace=False)
    return [torch.from_numpy(tokens[s : s + length].astype(np.int64)) for s in np.sort(starts)]


def drafter_stage(ctx) -> dict:
    from ecospec.drafters.eagle3_checkpoint import save_eagle3
    from ecospec.drafters.eagle3_train import default_head_config, train_eagle3
    from ecospec.tiny.experts import NAME

    r = ctx.budget.drafter
    target = ctx.target(experts_implementation=NAME)  # teacher forwards: the sorted kernel is faster than eager
    train = stream_windows(ctx.tokens("train"), r.seq_len, r.train_windows, r.seed)
    val = stream_windows(ctx.tokens("val"), r.seq_len, r.eval_windows, r.seed + 1)
    bar = ctx.bar(total=r.steps, desc="EAGLE-3 head", unit="step")

    def progress(event: dict) -> None:
        if "loss" in event and "step" in event:
            bar.update(1)
            bar.set_postfix(loss=f"{event['loss']:.3f}")

    ctx.log(f"training the EAGLE-3 head: {r.steps} steps x {r.batch_size} x {r.seq_len} tokens, TTT {r.ttt_steps}")
    config = default_head_config(target, intermediate_size=r.intermediate_size)
    head = train_eagle3(
        target,
        train,
        config,
        steps=r.steps,
        lr=r.lr,
        batch_size=r.batch_size,
        seq_len=r.seq_len,
        ttt_steps=r.ttt_steps,
        seed=r.seed,
        progress=progress,
        eval_sequences=val,
    )
    bar.close()
    save_eagle3(head, ctx.out / "head", layout="speculators")  # vLLM's own format
    log = head.train_log
    return {"recipe": asdict(r), "layout": "speculators", **_log_metrics(log)}


def _log_metrics(log) -> dict:
    tail = log.loss[-20:]
    return {
        "first_loss": log.loss[0],
        "final_loss": sum(tail) / len(tail),
        "agreement_untrained": log.agreement_untrained,
        "agreement": log.agreement,
        "draft_vocab_coverage": log.draft_vocab_coverage,
    }


def drafter_summary(m: dict) -> list[str]:
    agree = " / ".join(f"{a:.3f}" for a in m["agreement"] or [])
    return [
        f"EAGLE-3 head: loss {m['first_loss']:.3f} -> {m['final_loss']:.3f}; held-out top-1 agreement with the "
        f"target per unrolled step {agree}"
    ]
