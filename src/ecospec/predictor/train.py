"""Train Π_θ on routing traces: layer-wise cross-entropy against uniform top-k targets (eq. 5-6).

Samples are split 80/20 into train and held-out (an explicit split, e.g. the benchmarks' by-id split of
`ecospec.data.split`, or a seeded random one); each train sample is cut into windows of `window` tokens that are
trained causal-LM style (every position supervised). Held-out top-k accuracy is evaluated every `eval_every`
steps; checkpoints are saved every `checkpoint_every` steps, the first time the accuracy reaches each of
`checkpoint_at_accuracy` (paper Table 9: ~50 %, ~60 %, converged), and at the end. Each checkpoint's config.json
records its step and accuracy.

With `resume=True` the run also keeps its whole state (weights, Adam moments, data order, RNG, summary so far)
in `out_dir/resume/` every `save_every_s` seconds, so a killed run continues from there and ends with exactly
the weights of an uninterrupted one.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from ecospec.atomic import replace_dir, temp_dir
from ecospec.cache import digest
from ecospec.predictor.accuracy import topk_overlap
from ecospec.predictor.model import ExpertPredictor
from ecospec.predictor.trace_files import Traces, load_traces

RESUME = "resume"


@dataclass
class Checkpoint:
    path: str
    step: int
    accuracy: float  # held-out top-k accuracy at that step
    reason: str  # "every", "accuracy>=0.5", "final"
    name: str = ""  # its directory name under out_dir


@dataclass
class TrainSummary:
    losses: list[float] = field(default_factory=list)  # training loss per step
    evals: list[tuple[int, float]] = field(default_factory=list)  # (step, held-out accuracy); step 0 = untrained
    checkpoints: list[Checkpoint] = field(default_factory=list)
    train_samples: list[int] = field(default_factory=list)
    test_samples: list[int] = field(default_factory=list)
    chance: float = 0.0  # accuracy of a random expert set: k / N
    layer_accuracy: list[float] = field(default_factory=list)  # held-out accuracy per MoE layer, at the end
    resumed_at: list[int] = field(default_factory=list)  # steps at which a killed run was resumed

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
def evaluate_layers(
    predictor: ExpertPredictor, traces: Traces, spans: list[tuple[int, int]], batch_size: int = 16
) -> list[float]:
    """Held-out top-k accuracy (mean overlap / k over tokens) of `spans`, per MoE layer."""
    was_training = predictor.training
    predictor.eval()
    total = torch.zeros(traces.routes.shape[1], dtype=torch.float64)
    count = 0
    for i in range(0, len(spans), batch_size):
        ids, routes, valid = _batch(traces, spans[i : i + batch_size], predictor.device)
        overlap = topk_overlap(predictor(ids), routes, traces.top_k)  # [B, T, L]
        total += overlap[valid].sum(dim=0).cpu()
        count += int(valid.sum())
    predictor.train(was_training)
    return (total / max(count, 1)).tolist()


def evaluate(predictor: ExpertPredictor, traces: Traces, spans: list[tuple[int, int]], batch_size: int = 16) -> float:
    """Held-out top-k accuracy (mean overlap / k over tokens and MoE layers) of `spans`."""
    return float(np.mean(evaluate_layers(predictor, traces, spans, batch_size)))


def _levels(checkpoint_at_accuracy: Mapping[str, float] | tuple[float, ...]) -> list[tuple[str, float]]:
    """(checkpoint name, accuracy level) by level; a bare level is named `acc-0.50`."""
    if isinstance(checkpoint_at_accuracy, Mapping):
        pairs = [(str(k), float(v)) for k, v in checkpoint_at_accuracy.items()]
    else:
        pairs = [(f"acc-{x:.2f}", float(x)) for x in checkpoint_at_accuracy]
    return sorted(pairs, key=lambda p: p[1])


def _save_dir(out: Path, name: str, write: Callable[[Path], None]) -> Path:
    """Write a directory atomically: into a temp sibling, then swapped in for the old one."""
    final = out / name
    tmp = temp_dir(final)
    try:
        write(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    replace_dir(tmp, final)
    return final


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
    checkpoint_at_accuracy: Mapping[str, float] | tuple[float, ...] = (),
    eval_every: int | None = None,
    test_fraction: float = 0.2,
    seed: int = 0,
    max_grad_norm: float = 1.0,
    split: tuple[list[int], list[int]] | None = None,
    resume: bool = False,
    save_every_s: float = 900.0,
    on_step: Callable[[int, int, float, float | None], None] | None = None,
) -> TrainSummary:
    """Adam on the routing loss for `steps` optimizer steps (or `epochs` passes over the train
    windows); paper defaults lr 1e-5, batch 16. Returns losses, held-out accuracies and checkpoints
    (also written to `out_dir`/summary.json). `eval_every` defaults to 1/20 of the run.

    `split`: explicit (train, held-out) sample indices (default: a seeded random `test_fraction` split).
    `checkpoint_at_accuracy`: levels, or {checkpoint name: level}. `resume`: keep and continue from
    `out_dir/resume/` (see the module docstring). `on_step(step, steps, loss, accuracy or None)` after each step.
    """
    if isinstance(traces, str | Path):
        traces = load_traces(traces)
    if (steps is None) == (epochs is None):
        raise ValueError("pass exactly one of steps and epochs")
    if (checkpoint_every or checkpoint_at_accuracy or resume) and out_dir is None:
        raise ValueError("checkpoints need out_dir")
    cfg = predictor.config
    if (traces.routes.shape[1], traces.num_experts, traces.top_k) != (cfg.num_moe_layers, cfg.num_experts, cfg.top_k):
        raise ValueError(
            f"traces have L={traces.routes.shape[1]}, N={traces.num_experts}, k={traces.top_k}; the predictor "
            f"L={cfg.num_moe_layers}, N={cfg.num_experts}, k={cfg.top_k}"
        )
    train_ids, test_ids = split if split is not None else split_samples(traces.num_samples, test_fraction, seed)
    train_spans, test_spans = windows(traces, train_ids, window), windows(traces, test_ids, window)
    if not train_spans or not test_spans:
        raise ValueError(f"need tokens in both splits (train {len(train_spans)}, held-out {len(test_spans)} windows)")
    if steps is None:
        steps = max(1, math.ceil(epochs * math.ceil(len(train_spans) / batch_size)))
    eval_every = eval_every or max(1, steps // 20)
    summary = TrainSummary(
        train_samples=list(train_ids), test_samples=list(test_ids), chance=cfg.top_k / cfg.num_experts
    )
    out = Path(out_dir) if out_dir is not None else None
    pending = _levels(checkpoint_at_accuracy)

    def save(name: str, step: int, acc: float, reason: str) -> None:
        info = {"step": step, "heldout_topk_accuracy": acc, "reason": reason}
        path = _save_dir(out, name, lambda d: predictor.save(d, info=info))
        summary.checkpoints.append(Checkpoint(str(path), step, acc, reason, name))

    params = [p for p in predictor.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=lr)
    gen = torch.Generator().manual_seed(seed)
    order: list[int] = []
    step = 0
    # what the resume state must agree on: the data, the split and every knob that shapes the run
    key = digest(
        {
            "tokens": len(traces.tokens),
            "samples": traces.num_samples,
            "train": train_ids,
            "test": test_ids,
            "steps": steps,
            "lr": lr,
            "batch": batch_size,
            "window": window,
            "seed": seed,
            "levels": pending,
            "every": checkpoint_every,
            "eval_every": eval_every,
            "config": asdict(cfg),
            "backbone": predictor.backbone.config.to_dict(),
        },
        16,
    )
    state_dir = out / RESUME if resume else None
    if state_dir is not None and (state_dir / "state.json").is_file():
        state = json.loads((state_dir / "state.json").read_text())
        if state["key"] != key:
            raise ValueError(
                f"{state_dir} holds the state of a run with other data or settings; delete it to start afresh"
            )
        predictor.load_state_dict(ExpertPredictor.load(state_dir / "model", device=predictor.device).state_dict())
        opt.load_state_dict(torch.load(state_dir / "optimizer.pt", map_location=predictor.device, weights_only=True))
        gen.set_state(torch.tensor(state["generator"], dtype=torch.uint8))
        order, step, pending = state["order"], state["step"], [tuple(p) for p in state["pending"]]
        s = state["summary"]
        summary.losses, summary.evals = s["losses"], [tuple(e) for e in s["evals"]]
        summary.checkpoints = [Checkpoint(**c) for c in s["checkpoints"]]
        summary.resumed_at = s["resumed_at"] + [step]
    else:
        summary.evals.append((0, evaluate(predictor, traces, test_spans, batch_size)))

    def save_state() -> None:
        def write(d: Path) -> None:
            predictor.save(d / "model")
            torch.save(opt.state_dict(), d / "optimizer.pt")
            s = {
                "losses": summary.losses,
                "evals": summary.evals,
                "resumed_at": summary.resumed_at,
                "checkpoints": [asdict(c) for c in summary.checkpoints],
            }
            state = {
                "key": key,
                "step": step,
                "order": order,
                "pending": pending,
                "summary": s,
                "generator": gen.get_state().tolist(),
            }
            (d / "state.json").write_text(json.dumps(state))

        _save_dir(out, RESUME, write)

    last_save = time.monotonic()
    predictor.train()
    while step < steps:
        step += 1
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
        acc = None
        if not step % eval_every or every or step == steps:
            acc = evaluate(predictor, traces, test_spans, batch_size)
            summary.evals.append((step, acc))
            if every:
                save(f"step-{step:07d}", step, acc, "every")
            while pending and acc >= pending[0][1]:
                name, level = pending.pop(0)
                save(name, step, acc, f"accuracy>={level}")
        if on_step is not None:
            on_step(step, steps, summary.losses[-1], acc)
        if state_dir is not None and step < steps and time.monotonic() - last_save >= save_every_s:
            save_state()
            last_save = time.monotonic()
    predictor.eval()
    predictor.reset()
    summary.layer_accuracy = evaluate_layers(predictor, traces, test_spans, batch_size)
    if out is not None:
        save("final", steps, summary.final_accuracy, "final")
        record = asdict(summary) | {"final_accuracy": summary.final_accuracy}
        (out / "summary.json").write_text(json.dumps(record, indent=2))
        if state_dir is not None:
            shutil.rmtree(state_dir, ignore_errors=True)
    return summary


@dataclass(frozen=True)
class PredictorTraining:
    """How an expert predictor trains: the job's `training` block, or the tiny build's `PredictorRecipe`."""

    lr: float
    batch_size: int
    window: int
    seed: int
    steps: int | None = None
    epochs: float | None = None
    levels: Mapping[str, float] = field(default_factory=dict)  # {checkpoint name: first held-out accuracy}
    eval_every: int | None = None  # None: 1/20 of the run


def train_expert_predictor(
    info,
    embedding: torch.Tensor,
    backbone,
    traces: Traces | Path,
    training: PredictorTraining,
    out_dir: Path,
    device: torch.device,
    *,
    split: tuple[list[int], list[int]] | None = None,
    resume: bool = False,
    save_every_s: float = 900.0,
    on_step: Callable[[int, int, float, float | None], None] | None = None,
) -> TrainSummary:
    """A fresh predictor for a target (its MoE facts `info` and input embedding), seeded, trained on `traces` into
    `out_dir` (`train_predictor`): what `experiment=predictor` and the tiny build's predictor stage
    both run."""
    torch.manual_seed(training.seed)
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 matmuls for the fp32 predictor (the README's estimate)
    dtype = torch.float32 if embedding.dtype in (torch.bfloat16, torch.float16) else embedding.dtype
    predictor = ExpertPredictor.create(info, embedding.to(dtype), backbone).to(device)
    return train_predictor(
        predictor,
        traces,
        steps=training.steps,
        epochs=training.epochs,
        lr=training.lr,
        batch_size=training.batch_size,
        window=training.window,
        out_dir=out_dir,
        checkpoint_at_accuracy=dict(training.levels),
        eval_every=training.eval_every,
        seed=training.seed,
        split=split,
        resume=resume,
        save_every_s=save_every_s,
        on_step=on_step,
    )
