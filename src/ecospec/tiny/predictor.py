"""Build stages: routing traces of the tiny target, and the EcoSpec expert predictor trained on them.

The same pipeline a cluster runs for a real target (collect_traces -> train_predictor), with a
small Qwen3 decoder as the backbone instead of Qwen3-0.6B.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from ecospec.tiny.drafter import stream_windows


@dataclass(frozen=True)
class TracesRecipe:
    samples: int = 400  # windows of the corpus stream (80/20 split by sample at training time)
    length: int = 256
    seed: int = 2


@dataclass(frozen=True)
class PredictorRecipe:
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    intermediate_size: int = 256
    steps: int = 400
    lr: float = 2e-3
    batch_size: int = 8
    window: int = 256
    thresholds: tuple[float, ...] = (0.5, 0.6)  # save the first checkpoints that reach these (Table 9)
    seed: int = 0


def traces_stage(ctx) -> dict:
    from ecospec.predictor.traces import collect_traces, load_traces

    r = ctx.budget.traces
    target = ctx.target()
    samples = [w.tolist() for w in stream_windows(ctx.tokens("train"), r.length, r.samples, r.seed)]
    ctx.log(f"tracing the target's routing over {len(samples)} windows of {r.length} tokens")
    collect_traces(target, ctx.bar(samples, desc="routing traces", unit="window"), ctx.out, progress=False)
    traces = load_traces(ctx.out)
    return {"recipe": asdict(r), "tokens": int(len(traces.tokens)), "samples": len(samples)}


def predictor_stage(ctx) -> dict:
    import torch
    from transformers import Qwen3Config

    from ecospec.predictor.model import ExpertPredictor
    from ecospec.predictor.train import train_predictor

    r = ctx.budget.predictor
    target = ctx.target()
    backbone = Qwen3Config(
        vocab_size=8, hidden_size=r.hidden_size, intermediate_size=r.intermediate_size, num_hidden_layers=r.num_layers,
        num_attention_heads=r.num_heads, num_key_value_heads=r.num_kv_heads, head_dim=r.head_dim,
        max_position_embeddings=4096,
    )  # fmt: skip
    torch.manual_seed(r.seed)
    predictor = ExpertPredictor.from_target(target, backbone)
    ctx.log(f"training the expert predictor: {r.steps} steps x {r.batch_size} windows of {r.window} tokens")
    summary = train_predictor(
        predictor, ctx.dirs["traces"], steps=r.steps, lr=r.lr, batch_size=r.batch_size, window=r.window,
        out_dir=ctx.out, checkpoint_at_accuracy=r.thresholds, eval_every=max(1, r.steps // 20), seed=r.seed,
    )  # fmt: skip
    return {
        "recipe": asdict(r),
        "accuracy": summary.final_accuracy,
        "accuracy_untrained": summary.evals[0][1],
        "chance": summary.chance,
        "evals": summary.evals,
        "checkpoints": [
            {"dir": str(Path(c.path).relative_to(ctx.out)), "step": c.step, "accuracy": c.accuracy, "reason": c.reason}
            for c in summary.checkpoints
        ],
        "final_loss": sum(summary.losses[-20:]) / len(summary.losses[-20:]),
    }


def traces_summary(m: dict) -> list[str]:
    return [f"routing traces: {m['samples']} windows, {m['tokens']:,} tokens"]


def predictor_summary(m: dict) -> list[str]:
    return [
        f"expert predictor: held-out top-k accuracy {m['accuracy']:.3f} (untrained {m['accuracy_untrained']:.3f}, "
        f"chance {m['chance']:.3f}); checkpoints at " + ", ".join(f"{c['accuracy']:.2f}" for c in m["checkpoints"])
    ]
