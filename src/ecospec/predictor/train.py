"""Train Π_θ on routing traces: layer-wise cross-entropy against uniform top-k targets (eq. 5-6).

Samples are split 80/20 (seeded, by sample) into train and held-out; each train sample is cut into
windows of `window` tokens that are trained causal-LM style (every position supervised). Held-out
top-k accuracy is evaluated every `eval_every` steps; checkpoints are saved every `checkpoint_every`
steps, the first time the accuracy reaches each of `checkpoint_at_accuracy` (paper Table 9: ~50 %,
~60 %, converged), and at the end. Each checkpoint's config.json records its step and accuracy.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from ecospec.predictor.accuracy import topk_overlap
from ecospec.predictor.model import ExpertPredictor
from ecospec.predictor.traces import Traces, load_traces


@dataclass
class Checkpoint:
    path: str
    step: int
    accuracy: float  # held-out top-k accuracy at that step
    reason: str  # "every", "accuracy>=0.5", "final"


@dataclass
class TrainSummary:
    losses: list[float] = field(default_factory=list)  # training loss per step
    evals: list[tuple[int, float]] = field(default_factory=list)  # (step, held-out accuracy); step 0 = untrained
    checkpoints: list[Checkpoint] = field(default_factory=list)
    train_samples: list[int] = field(default_factory=list)
    test_samples: list[int] = field(default_factory=list)
    chance: float = 0.0  # accuracy of a random expert set: k / N

    @property
    def final_accuracy(self) -> float:
        return self.evals[-1][1]


def split_samples(num_samples: int, test_fraction: float = 0.2, seed: int = 0) -> tuple[list[int], list[int]]:
    """(train, held-out) sample indices, a seeded random split; both non-empty when there are >= 2."""
    perm = np.random.default_rng(seed).permutation(num_samples).tolist()
    n_test = min(max(round(num_samples * test_fraction), 1), num_samples - 1) if num_samples > 1 else 0
    return sorted(perm[n_test:]), sorted(perm[:n_test])


def windows(traces: Traces, samples: list[int], length: int) -> list[tuple[int, int]]:
    """Token ranges [start, end) cutting each sample into consecutive windows of at most `length`."""
    spans = []
    for s in samples:
        a, b = int(traces.offsets[s]), int(traces.offsets[s + 1])
        spans.extend((i, min(i + length, b)) for i in range(a, b, length))
    return spans


def _batch(traces: Traces, spans: list[tuple[int, int]], device) -> tuple[torch.Tensor, ...]:
    """Right-padded ids [B, T], routes [B, T, L, k] and valid [B, T] (causal attention never lets a real
    token see the padding behind it, so no attention mask is needed)."""
    width = max(b - a for a, b in spans)
    ids = np.zeros((len(spans), width), dtype=np.int64)
    routes = np.zeros((len(spans), width, *traces.routes.shape[1:]), dtype=np.int64)
    valid = np.zeros((len(spans), width), dtype=bool)
    for row, (a, b) in enumerate(spans):
        ids[row, : b - a] = traces.tokens[a:b]
        routes[row, : b - a] = traces.routes[a:b]
        valid[row, : b - a] = True
    return tuple(torch.from_numpy(x).to(device) for x in (ids, routes, valid))


def routing_loss(logits: torch.Tensor, routes: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Eq. (5)-(6): -sum_e q_e log p_e with q = 1/k on the true experts, averaged over valid tokens
    and MoE layers. logits [B, T, L, N], routes [B, T, L, k], valid [B, T]."""
    logp = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    ce = -logp.gather(-1, routes).mean(dim=-1)  # [B, T, L]
    return ce[valid].mean()


@torch.no_grad()
def evaluate(predictor: ExpertPredictor, traces: Traces, spans: list[tuple[int, int]], batch_size: int = 16) -> float:
    """Held-out top-k accuracy (mean overlap / k over tokens and MoE layers) of `spans`."""
    was_training = predictor.training
    predictor.eval()
    total, count = 0.0, 0
    for i in range(0, len(spans), batch_size):
        ids, routes, valid = _batch(traces, spans[i : i + batch_size], predictor.device)
        overlap = topk_overlap(predictor(ids), routes, traces.top_k)  # [B, T, L]
        total += float(overlap[valid].sum())
        count += int(valid.sum()) * overlap.shape[-1]
    predictor.train(was_training)
    return total / max(count, 1)


def train_predictor(
    predictor: ExpertPredictor,
    traces: Traces | str | Path,
    *,
    steps: int | None = None,
    epochs: float | None = None,
    lr: float = 1e-5,
    batch_size: int = 16,
    window: int = 256,
    out_dir: str | Path | None = None,
    checkpoint_every: int | None = None,
    checkpoint_at_accuracy: tuple[float, ...] = (),
    eval_every: int | None = None,
    test_fraction: float = 0.2,
    seed: int = 0,
    max_grad_norm: float = 1.0,
) -> TrainSummary:
    """Adam on the routing loss for `steps` optimizer steps (or `epochs` passes over the train
    windows); paper defaults lr 1e-5, batch 16. Returns losses, held-out accuracies and checkpoints
    (also written to `out_dir`/summary.json). `eval_every` defaults to 1/20 of the run."""
    if isinstance(traces, str | Path):
        traces = load_traces(traces)
    if (steps is None) == (epochs is None):
        raise ValueError("pass exactly one of steps and epochs")
    if (checkpoint_every or checkpoint_at_accuracy) and out_dir is None:
        raise ValueError("checkpoints need out_dir")
    cfg = predictor.config
    if (traces.routes.shape[1], traces.num_experts, traces.top_k) != (cfg.num_moe_layers, cfg.num_experts, cfg.top_k):
        raise ValueError(
            f"traces have L={traces.routes.shape[1]}, N={traces.num_experts}, k={traces.top_k}; the predictor "
            f"L={cfg.num_moe_layers}, N={cfg.num_experts}, k={cfg.top_k}"
        )
    train_ids, test_ids = split_samples(traces.num_samples, test_fraction, seed)
    train_spans, test_spans = windows(traces, train_ids, window), windows(traces, test_ids, window)
    if not train_spans or not test_spans:
        raise ValueError(f"need tokens in both splits (train {len(train_spans)}, held-out {len(test_spans)} windows)")
    if steps is None:
        steps = max(1, math.ceil(epochs * math.ceil(len(train_spans) / batch_size)))
    eval_every = eval_every or max(1, steps // 20)
    summary = TrainSummary(train_samples=train_ids, test_samples=test_ids, chance=cfg.top_k / cfg.num_experts)
    out = Path(out_dir) if out_dir is not None else None
    pending = sorted(checkpoint_at_accuracy)

    def save(name: str, step: int, acc: float, reason: str) -> None:
        path = predictor.save(out / name, info={"step": step, "heldout_topk_accuracy": acc, "reason": reason})
        summary.checkpoints.append(Checkpoint(str(path), step, acc, reason))

    params = [p for p in predictor.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=lr)
    gen = torch.Generator().manual_seed(seed)
    summary.evals.append((0, evaluate(predictor, traces, test_spans, batch_size)))
    order: list[int] = []
    predictor.train()
    for step in range(1, steps + 1):
        if not order:
            order = torch.randperm(len(train_spans), generator=gen).tolist()
        chosen, order = order[:batch_size], order[batch_size:]
        ids, routes, valid = _batch(traces, [train_spans[i] for i in chosen], predictor.device)
        loss = routing_loss(predictor(ids), routes, valid)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        opt.step()
        summary.losses.append(loss.item())

        every = checkpoint_every is not None and step % checkpoint_every == 0
        if step % eval_every and not every and step != steps:
            continue
        acc = evaluate(predictor, traces, test_spans, batch_size)
        summary.evals.append((step, acc))
        if every:
            save(f"step-{step:07d}", step, acc, "every")
        while pending and acc >= pending[0]:
            save(f"acc-{pending[0]:.2f}", step, acc, f"accuracy>={pending[0]}")
            pending.pop(0)
    predictor.eval()
    predictor.reset()
    if out is not None:
        save("final", steps, summary.final_accuracy, "final")
        record = asdict(summary) | {"final_accuracy": summary.final_accuracy}
        (out / "summary.json").write_text(json.dumps(record, indent=2))
    return summary
