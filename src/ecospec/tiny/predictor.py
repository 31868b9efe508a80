"""Build stages: routing traces of the tiny target, and the EcoSpec expert predictor trained on them.

The same pipeline a cluster runs for a real target (collect_traces -> `predictor.train.train_expert_predictor`,
which the predictor job runs too), with a small Qwen3 decoder as the backbone instead of Qwen3-0.6B.

Why this size: the paper's predictor costs a small fraction of a verify pass (0.5 %: 4 ms against 730 ms). On a
CPU a decoder's cost is its op count, so the backbone is one layer (hidden 64, 2 heads of 32) run through its own
decode path (``ExpertPredictor._decode``, leaner than the HF forward), within the design's budget of a tenth of a
verify pass (docs/design.md); a second layer would double its cost for little accuracy. The training budget reaches
a held-out accuracy well above the checkpoint levels, and the checkpoints at >= 0.50 and >= 0.65 (evaluated every
16 steps) and the final one are distinct weights, so Table 9 gets three rows. The figures behind each choice:
docs/embedded-default.md, "How the recipe was chosen".
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from ecospec.models import moe_info
from ecospec.predictor.train import PredictorTraining, train_expert_predictor
from ecospec.tiny.drafter import stream_windows


def traces_stage(ctx) -> dict:
    from ecospec.predictor.trace_files import load_traces
    from ecospec.predictor.traces import collect_traces
    from ecospec.tiny.experts import NAME

    r = ctx.budget.traces
    target = ctx.target(experts_implementation=NAME)  # batched forwards: the sorted kernel, same routing
    samples = [w.tolist() for w in stream_windows(ctx.tokens("train"), r.length, r.samples, r.seed)]
    ctx.log(f"tracing the target's routing over {len(samples)} windows of {r.length} tokens")
    collect_traces(target, ctx.bar(samples, desc="routing traces", unit="window"), ctx.out, batch_size=16)
    traces = load_traces(ctx.out)
    return {"recipe": asdict(r), "tokens": int(len(traces.tokens)), "samples": len(samples)}


def predictor_stage(ctx) -> dict:
    import torch
    from transformers import Qwen3Config

    r = ctx.budget.predictor
    target = ctx.target()
    backbone = Qwen3Config(
        vocab_size=8,
        hidden_size=r.hidden_size,
        intermediate_size=r.intermediate_size,
        num_hidden_layers=r.num_layers,
        num_attention_heads=r.num_heads,
        num_key_value_heads=r.num_kv_heads,
        head_dim=r.head_dim,
        max_position_embeddings=4096,
    )
    training = PredictorTraining(
        lr=r.lr,
        batch_size=r.batch_size,
        window=r.window,
        seed=r.seed,
        steps=r.steps,
        levels=dict(r.thresholds),
        eval_every=max(1, r.steps // 50),
    )
    ctx.log(f"training the expert predictor: {r.steps} steps x {r.batch_size} windows of {r.window} tokens")
    embedding = target.get_input_embeddings().weight.detach()
    summary = train_expert_predictor(
        moe_info(target), embedding, backbone, ctx.dirs["traces"], training, ctx.out, torch.device("cpu")
    )
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
