"""Build stage: the tiny target's EAGLE-3 head, trained on the target's own hidden states and outputs.

Teacher forcing plus two training-time-test steps (`ttt_steps=3`), on windows of the corpus stream;
saved in the EAGLE repo layout (`midlayer.*`), which `load_eagle3` reads back like a public head.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class DrafterRecipe:
    steps: int = 600
    lr: float = 3e-3
    batch_size: int = 4
    seq_len: int = 256
    ttt_steps: int = 3
    train_windows: int = 3000
    eval_windows: int = 32
    seed: int = 0


def stream_windows(tokens: np.ndarray, length: int, count: int, seed: int) -> list[torch.Tensor]:
    """`count` windows of `length` tokens at seeded random offsets of a token stream."""
    rng = np.random.default_rng(seed)
    count = min(count, max(1, len(tokens) // length))
    starts = rng.choice(len(tokens) - length, size=count, replace=False)
    return [torch.from_numpy(tokens[s : s + length].astype(np.int64)) for s in np.sort(starts)]


def drafter_stage(ctx) -> dict:
    from ecospec.drafters.eagle3_checkpoint import save_eagle3
    from ecospec.drafters.eagle3_train import train_eagle3

    r = ctx.budget.drafter
    target = ctx.target()
    train = stream_windows(ctx.tokens("train"), r.seq_len, r.train_windows, r.seed)
    val = stream_windows(ctx.tokens("val"), r.seq_len, r.eval_windows, r.seed + 1)
    bar = ctx.bar(total=r.steps, desc="EAGLE-3 head", unit="step")

    def progress(event: dict) -> None:
        if "loss" in event and "step" in event:
            bar.update(1)
            bar.set_postfix(loss=f"{event['loss']:.3f}")

    ctx.log(f"training the EAGLE-3 head: {r.steps} steps x {r.batch_size} x {r.seq_len} tokens, TTT {r.ttt_steps}")
    head = train_eagle3(
        target, train, steps=r.steps, lr=r.lr, batch_size=r.batch_size, seq_len=r.seq_len, ttt_steps=r.ttt_steps,
        seed=r.seed, progress=progress, eval_sequences=val,
    )  # fmt: skip
    bar.close()
    save_eagle3(head, ctx.out / "head", layout="eagle")
    log = head.train_log
    return {"recipe": asdict(r), "layout": "eagle", **_log_metrics(log)}


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
