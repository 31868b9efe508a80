"""Build stage (optional, built on first use by method=gto|gto_ecospec): the tiny EAGLE-3 head continued with
Group Tree Optimization (`ecospec.drafters.gto_train`) on windows of the corpus's train split, never on benchmark
prompts. The decode tree of the evaluation (depth 3, top-2) is the training tree.

Size: the stage must stay under 5 minutes on 2 cores (not part of `make demo`'s build). One step of 2 windows of
256 tokens with 8 groups of 8 positions grows 2 x 64 training trees per head (trained and reference), one target
tree pass over them per window and the EAGLE-3 loss; ~2.5 s on 2 threads here, so 100 steps. lr 3e-4 (GTO's
5e-6 is for 8B-scale heads trained for epochs; the tiny head was trained at 3e-3), 10 warm-up steps.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ecospec.tiny.drafter import stream_windows


@dataclass(frozen=True)
class GtoRecipe:
    steps: int = 100
    lr: float = 3e-4
    warmup_steps: int = 10
    batch_size: int = 2
    seq_len: int = 256
    groups: int = 8
    group_size: int = 8
    depth: int = 3
    topk: int = 2
    train_windows: int = 1000
    seed: int = 4


def gto_stage(ctx) -> dict:
    from ecospec.drafters.eagle3_checkpoint import load_eagle3, save_eagle3
    from ecospec.drafters.gto_train import GtoSettings, train_gto
    from ecospec.tiny.experts import NAME

    r = ctx.budget.gto
    target = ctx.target(experts_implementation=NAME)  # batched forwards: the sorted kernel, same routing
    head = load_eagle3(ctx.dirs["drafter"] / "head", target.config)
    train = stream_windows(ctx.tokens("train"), r.seq_len, r.train_windows, r.seed)
    bar = ctx.bar(total=r.steps, desc="GTO head", unit="step")

    def progress(event: dict) -> None:
        bar.update(1)
        bar.set_postfix(gain=f"{event['reward_gain']:+.4f}", acc=f"{event['accepted']:.2f}")

    settings = GtoSettings(depth=r.depth, topk=r.topk, groups=r.groups, group_size=r.group_size)
    ctx.log(f"GTO: {r.steps} steps x {r.batch_size} x {r.seq_len} tokens, {r.groups} x {r.group_size} trees/window")
    head, log = train_gto(head, target, train, steps=r.steps, lr=r.lr, batch_size=r.batch_size, seq_len=r.seq_len,
                          settings=settings, warmup_steps=r.warmup_steps, seed=r.seed, progress=progress)  # fmt: skip
    bar.close()
    save_eagle3(head, ctx.out / "head", layout="eagle")
    tail = lambda xs: sum(xs[-20:]) / max(len(xs[-20:]), 1)  # noqa: E731
    return {"recipe": asdict(r), "reward_gain_first": tail(log.reward_gain[:20]),
            "reward_gain_last": tail(log.reward_gain), "accepted_first": tail(log.accepted[:20]),
            "accepted_last": tail(log.accepted), "loss_last": tail(log.loss)}  # fmt: skip


def gto_summary(m: dict) -> list[str]:
    return [
        f"GTO head: r(M) - r(M0) per tree {m['reward_gain_first']:+.4f} -> {m['reward_gain_last']:+.4f}; accepted "
        f"branch length {m['accepted_first']:.2f} -> {m['accepted_last']:.2f} (first / last 20 steps)"
    ]
