"""Build stage (optional, built on first use by method=gto|gto_ecospec): the tiny EAGLE-3 head continued with
Group Tree Optimization (`drafters.gto_train.train_gto_head`, as the GTO job runs it) on the target's own text, as
GTO trains: 256 seeded 64-token prompts of the corpus's train split (never benchmark prompts), each continued
greedily by the target for 192 tokens (batched). The decode tree of the evaluation (depth 3, top-2) is the
training tree.

Size: the stage must stay under 5 minutes on 2 cores (not part of `make demo`'s build); a step (2 windows x 8 groups
x 8 positions grows 2 x 64 trees per head, trained and reference, one target tree pass per window and the EAGLE-3
loss) is costly, so 100 steps. lr 3e-4 (GTO's 5e-6 is for 8B-scale heads trained for epochs; the tiny head was
trained at 3e-3), 10 warm-up steps.

What moves alpha here (`benchmarks/studies/gto_study.py`): this recipe about matches the EAGLE-3 head's alpha,
and beats the same steps without the GTO term (continued EAGLE-3 training on the same texts), so GTO's term is
worth something against same-compute continued training, not against the head it starts from. More steps helped
a little but overrun the time bound; other group shapes, deeper training trees, higher learning rates and corpus
windows instead of generated text did no better. The figures: docs/embedded-default.md, "How the recipe was chosen".
"""

from __future__ import annotations

from dataclasses import asdict

import torch

from ecospec.drafters.gto_train import GtoTraining, train_gto_head
from ecospec.tiny.budgets import GtoRecipe
from ecospec.tiny.drafter import stream_windows


def gto_stage(ctx) -> dict:
    from ecospec.drafters.eagle3_checkpoint import load_eagle3, save_eagle3
    from ecospec.tiny.experts import NAME

    r = ctx.budget.gto
    target = ctx.target(experts_implementation=NAME)  # batched forwards: the sorted kernel, same routing
    head = load_eagle3(ctx.dirs["drafter"] / "head", target.config)
    if r.data == "generated":
        ctx.log(
            f"generating {r.train_windows} training texts: {r.prompt_len}-token train-split prompts + the "
            f"target's greedy {r.seq_len - r.prompt_len} tokens"
        )
        train = generated_windows(target, ctx.tokens("train"), r)
    else:
        train = stream_windows(ctx.tokens("train"), r.seq_len, r.train_windows, r.seed)
    bar = ctx.bar(total=r.steps, desc="GTO head", unit="step")

    def progress(event: dict) -> None:
        bar.update(1)
        bar.set_postfix(gain=f"{event['reward_gain']:+.4f}", acc=f"{event['accepted']:.2f}")

    ctx.log(f"GTO: {r.steps} steps x {r.batch_size} x {r.seq_len} tokens, {r.groups} x {r.group_size} trees/window")
    head, log = train_gto_head(head, target, train, GtoTraining.of(asdict(r)), progress=progress)
    bar.close()
    save_eagle3(head, ctx.out / "head", layout="speculators")  # vLLM's own format
    tail = lambda xs: sum(xs[-20:]) / max(len(xs[-20:]), 1)  # noqa: E731
    return {
        "recipe": asdict(r),
        "reward_gain_first": tail(log.reward_gain[:20]),
        "reward_gain_last": tail(log.reward_gain),
        "accepted_first": tail(log.accepted[:20]),
        "accepted_last": tail(log.accepted),
        "loss_last": tail(log.loss),
    }


@torch.no_grad()
def generated_windows(target, stream, r: GtoRecipe) -> list[torch.Tensor]:
    """`r.train_windows` texts of `r.seq_len` tokens: seeded `r.prompt_len`-token windows of the train stream,
    continued greedily by the target (batched; end-of-text suppressed so every text is full length)."""
    from ecospec.tiny.corpus import PAD_ID

    prompts = stream_windows(stream, r.prompt_len, r.train_windows, r.seed)
    out: list[torch.Tensor] = []
    for i in range(0, len(prompts), r.gen_batch):
        ids = torch.stack(prompts[i : i + r.gen_batch]).to(target.device)
        new = r.seq_len - r.prompt_len
        seqs = target.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            pad_token_id=PAD_ID,
        )
        out.extend(seqs.cpu())
    return out


def gto_summary(m: dict) -> list[str]:
    return [
        f"GTO head: r(M) - r(M0) per tree {m['reward_gain_first']:+.4f} -> {m['reward_gain_last']:+.4f}; accepted "
        f"branch length {m['accepted_first']:.2f} -> {m['accepted_last']:.2f} (first / last 20 steps)"
    ]
