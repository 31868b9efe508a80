"""Train an EAGLE-3 head on a frozen target: teacher forcing plus training-time test (TTT).

Data. `sequences` are token sequences (ideally text the target itself produced, so the head learns the
target's own behaviour). Each batch is `batch_size` windows of `seq_len` tokens x_0..x_{T-1}. The frozen
target runs once over every window (no grad, `output_hidden_states=True`); it gives the features
f_i = concat(hidden_states[l] for l in aux_hidden_layers) at position i and the logits z_i (distribution
of x_{i+1}). The head has n = T-1 entries per window.

Unrolled steps (`ttt_steps` counts them all; 1 = teacher forcing only, the default 3 = teacher forcing
plus two TTT steps, like `speculators`' `ttt_steps=3`; the EAGLE repo unrolls 7):

    step 0, entry i:  hidden = fc(f_i),          token x_{i+1},   position i,     target z_{i+1} (x_{i+2})
    step j, entry i:  hidden = out_{j-1}[i],     token x_{i+1+j}, position i + j, target z_{i+1+j}

i.e. step j's entry i is the depth-j tree node grown from root entry i at inference time: its hidden input
is the head's own output one step earlier (fc is not applied), its token is the real next token (teacher
tokens, as the EAGLE-3 trainer does), its position is root + depth (the `Eagle3Drafter` convention).
Entries whose target falls past the window end (i >= n - j) are padded and left out of loss and metrics.

TTT attention (`ttt_visibility`). All steps share one KV cache: step j's keys are appended after those of
steps 0..j-1, so the query block of step j ([n] queries) sees [(j+1) n] keys. Entry i of step j sees

* step-0 keys 0..i (the real prefix, causal, including root entry i itself), and
* the keys of entry i in steps 1..j ("diagonal": its own ancestors in the unrolled chain, and itself),

exactly the keys a depth-j node rooted at entry i sees in `Eagle3Drafter._run_level` (committed entries +
its ancestors + itself). Learned from the EAGLE-3 trainer (SafeAILab/EAGLE `eagle/traineagle3/cnets.py`:
`LlamaAttention.forward` scores the query against the step-0 keys under the causal mask and against every
later step's key at the same position with an elementwise dot product, i.e. the diagonal; rotary positions
are `position_ids + step`; loss weights `0.8 ** step` in `main.py`) and the `speculators` trainer
(`src/speculators/train/eagle3/attention.py`: causal block or'ed with `kv_idx % seq_len == q_idx` on each
extended block). The current EAGLE repo additionally masks, after each step j, the step-0 entries (t, t-j)
so that step j sees only step-0 keys 0..i-j; that drops the root entry and its j-1 predecessors, which the
inference drafter does see (SafeAILab/EAGLE issue #247 and SpecForge PR #245 "remove attention mask shift"
question it). We use the inference-consistent mask; `eagle_shift=True` reproduces EAGLE's for comparison.

Loss (documented choice: soft targets, as EAGLE-3). The target's logits restricted to the draft vocabulary
and renormalised give p; the head's log-softmax over the draft vocabulary gives log q; step j's loss is
KL(p || q) (= EAGLE's cross-entropy -sum p log q minus the constant entropy of p, same gradients) averaged
over the valid entries whose target argmax lies in the draft vocabulary (EAGLE's `position_mask`). Total
loss = sum_j 0.8^j loss_j. Gradients flow through the recurrent hidden states across steps (as in EAGLE).

Optimiser: AdamW (betas 0.9/0.95), linear warmup then cosine decay to 0, gradient-norm clipping.
Deterministic for a seed on CPU (init under a forked RNG, window sampling from a private generator).

The head has no embedding of its own: token embeddings are the target's input embedding (frozen), and the
lm_head starts from the target's lm_head rows of the draft vocabulary (as `speculators` does;
`init_lm_head_from_target=False` keeps the random init of the EAGLE repo).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from ecospec.drafters.eagle3 import Eagle3Config, Eagle3Head, KVCache

__all__ = [
    "TrainLog",
    "count_tokens",
    "default_feature_layers",
    "default_head_config",
    "draft_vocab_from_counts",
    "evaluate_agreement",
    "train_eagle3",
    "ttt_visibility",
    "unrolled_logits",
]

LOSS_DECAY = 0.8  # EAGLE-3 main.py: ploss_weight = 0.8 ** step


@dataclass
class TrainLog:
    """Metrics of one `train_eagle3` run (attached to the returned head as `head.train_log`)."""

    loss: list[float] = field(default_factory=list)  # weighted total loss per optimiser step
    step_losses: list[list[float]] = field(default_factory=list)  # per optimiser step: KL of each unrolled step
    lr: list[float] = field(default_factory=list)
    # held-out top-1 agreement with the target's argmax, per unrolled step (index 0 = teacher forcing)
    agreement_untrained: list[float] | None = None
    agreement: list[float] | None = None
    eval_windows: int = 0
    draft_vocab_coverage: float = 1.0  # share of training tokens inside the draft vocabulary


# ----------------------------------------------------------------------------------------------------
# Vocabulary and config
# ----------------------------------------------------------------------------------------------------


def count_tokens(sequences: Sequence[torch.Tensor] | torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Occurrences of every token id in `sequences` (int64 [vocab_size])."""
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for seq in as_list(sequences):
        counts += torch.bincount(seq.reshape(-1).cpu(), minlength=vocab_size)[:vocab_size]
    return counts


def draft_vocab_from_counts(token_counts: torch.Tensor | Sequence[int], draft_vocab_size: int):
    """(d2t, t2d) for the `draft_vocab_size` most frequent target tokens (ties: lower id first).

    `token_counts` has one entry per target token id. Draft ids are the chosen target ids in ascending
    order (as EAGLE's `scandata`): target id = draft id + d2t[draft id]. d2t is int64 [draft_vocab_size],
    t2d bool [vocab_size] (True for target ids in the draft vocabulary).
    """
    counts = torch.as_tensor(token_counts).reshape(-1).to(torch.float64)
    vocab = counts.numel()
    if not 1 <= draft_vocab_size <= vocab:
        raise ValueError(f"draft_vocab_size must be in [1, {vocab}], got {draft_vocab_size}")
    order = torch.sort(-counts, stable=True).indices  # stable: equal counts keep ascending ids
    chosen = order[:draft_vocab_size].sort().values
    d2t = chosen - torch.arange(draft_vocab_size)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[chosen] = True
    return d2t.to(torch.int64), t2d


def default_feature_layers(num_layers: int) -> tuple[int, int, int]:
    """Three HF hidden_states indices (0 = embedding output, L = final, normed, state), low -> high.

    L >= 7: EAGLE-3's (2, L//2, L-3), which are then distinct inputs of inner decoder layers. Smaller
    targets would give repeated or out-of-range ids, so we spread three ids evenly (floor) over the inner
    boundaries [1, L-1] when there are at least three of them (L = 4, 5, 6 -> (1, 2, 3), (1, 2, 4),
    (1, 3, 5)), else over the whole range [0, L] (L = 2 -> (0, 1, 2): embedding, layer-0 output, final state;
    L = 3 -> (0, 1, 3); L = 1 -> (0, 0, 1)).
    """
    n = int(num_layers)
    if n < 1:
        raise ValueError(f"num_layers must be >= 1, got {n}")
    if n >= 7:
        return (2, n // 2, n - 3)
    lo, hi = (1, n - 1) if n >= 4 else (0, n)
    return tuple(lo + (hi - lo) * k // 2 for k in range(3))  # type: ignore[return-value]


def _text_config(target) -> Any:
    cfg = target.config
    return getattr(cfg, "text_config", None) or cfg


def default_head_config(target, **overrides) -> Eagle3Config:
    """An `Eagle3Config` for `target`: head hidden size = target hidden size, one layer whose attention
    heads / kv heads / head_dim / MLP width / norm eps / rope theta / max positions follow the target,
    full draft vocabulary, aux layers `default_feature_layers(L)`. `overrides` replace any field.

    head_dim is the target's `head_dim`, except for MLA targets (DeepSeek: `kv_lora_rank` set, whose
    `head_dim` is the rotary part only) where it is hidden_size // heads. RoPE scaling is not copied (the
    head drafts a few tokens at a time; pass `rope_scaling=` to override).
    """
    tc = _text_config(target)
    hidden = int(tc.hidden_size)
    heads = int(tc.num_attention_heads)
    head_dim = getattr(tc, "head_dim", None)
    if not head_dim or getattr(tc, "kv_lora_rank", None) is not None:
        head_dim = hidden // heads
    rope = getattr(tc, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(tc, "rope_theta", 10000.0))
    kw: dict[str, Any] = dict(
        hidden_size=hidden,
        intermediate_size=int(getattr(tc, "intermediate_size", None) or 4 * hidden),
        num_attention_heads=heads,
        num_key_value_heads=int(getattr(tc, "num_key_value_heads", None) or heads),
        head_dim=int(head_dim),
        vocab_size=int(tc.vocab_size),
        draft_vocab_size=int(tc.vocab_size),
        target_hidden_size=hidden,
        aux_hidden_layers=default_feature_layers(int(tc.num_hidden_layers)),
        rms_norm_eps=float(getattr(tc, "rms_norm_eps", 1e-6) or 1e-6),
        rope_theta=float(theta),
        max_position_embeddings=int(getattr(tc, "max_position_embeddings", 2048) or 2048),
    )
    kw.update(overrides)
    return Eagle3Config(**kw)


# ----------------------------------------------------------------------------------------------------
# TTT attention and the unrolled forward
# ----------------------------------------------------------------------------------------------------


def ttt_visibility(n: int, step: int, *, eagle_shift: bool = False, device=None) -> torch.Tensor:
    """Bool [n, (step + 1) * n]: what the n queries of unrolled step `step` see of the keys of steps
    0..step (in cache order). Block 0: causal (entry i sees step-0 keys 0..i); blocks 1..step: identity
    (entry i sees its own chain). `eagle_shift=True`: SafeAILab/EAGLE's variant, where block 0 is
    additionally cut to keys 0..i-step."""
    if n < 1 or step < 0:
        raise ValueError(f"need n >= 1 and step >= 0, got n={n}, step={step}")
    idx = torch.arange(n, device=device)
    block0 = idx[None, :] <= idx[:, None] - (step if eagle_shift else 0)
    eye = torch.eye(n, dtype=torch.bool, device=device)
    return torch.cat([block0] + [eye] * step, dim=1)


def unroll(
    head: Eagle3Head, features: torch.Tensor, embeds: list[torch.Tensor], eagle_shift: bool
) -> list[torch.Tensor]:
    """Draft-vocabulary logits [B, n, Dv] of every unrolled step. features [B, n, F]; embeds[j] [B, n, H]:
    embeddings of step j's tokens."""
    n = features.shape[1]
    positions = torch.arange(n, device=features.device)
    cache = KVCache()
    hidden = head.project(features)
    logits = []
    for j, emb in enumerate(embeds):
        vis = ttt_visibility(n, j, eagle_shift=eagle_shift, device=features.device)
        hidden = head(hidden, emb, positions + j, cache, vis)
        logits.append(head.logits(hidden).float())
    return logits


@torch.no_grad()
def target_pass(target, windows: torch.Tensor, aux: Sequence[int], dtype: torch.dtype):
    """features [B, T-1, F] (positions 0..T-2) and logits [B, T, V] (float32) of the frozen target."""
    out = target(input_ids=windows, output_hidden_states=True, use_cache=False)
    feats = torch.cat([out.hidden_states[i][:, :-1] for i in aux], dim=-1).to(dtype)
    return feats, out.logits.float()


@torch.no_grad()
def step_embeds(target, windows: torch.Tensor, ttt_steps: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """Embeddings of the teacher tokens of each unrolled step: x_{i+1+j} for entry i (pad id 0 past the end)."""
    b, t = windows.shape
    n = t - 1
    padded = torch.cat([windows, windows.new_zeros(b, ttt_steps)], dim=1)
    emb = target.get_input_embeddings()(padded).to(dtype)
    return [emb[:, 1 + j : 1 + j + n] for j in range(ttt_steps)]


def step_targets(logits: torch.Tensor, ttt_steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per step: target logits [B, n, V] (z_{i+1+j}, zero-padded) and validity [B, n] (i + 1 + j <= T - 1)."""
    b, t, v = logits.shape
    n = t - 1
    padded = torch.cat([logits, logits.new_zeros(b, ttt_steps, v)], dim=1)
    out = []
    for j in range(ttt_steps):
        valid = (torch.arange(n, device=logits.device) < n - j).expand(b, n)
        out.append((padded[:, 1 + j : 1 + j + n], valid))
    return out


def kl_loss(head_logits: torch.Tensor, target_logits: torch.Tensor, valid: torch.Tensor, head: Eagle3Head):
    """Mean over valid entries (target argmax in the draft vocabulary) of KL(p_target|draft || q_head)."""
    draft_ids = torch.arange(head.config.draft_vocab_size, device=head.d2t.device) + head.d2t
    valid = valid & head.t2d[target_logits.argmax(-1)]
    p_logits = target_logits.index_select(-1, draft_ids)
    logp = F.log_softmax(p_logits, dim=-1)
    logq = F.log_softmax(head_logits, dim=-1)
    kl = (logp.exp() * (logp - logq)).sum(-1)
    return (kl * valid).sum() / valid.sum().clamp(min=1)


# ----------------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------------


def as_list(sequences) -> list[torch.Tensor]:
    if isinstance(sequences, torch.Tensor):
        seqs = [sequences] if sequences.dim() == 1 else list(sequences)
    else:
        seqs = [torch.as_tensor(s) for s in sequences]
    return [s.reshape(-1).to(torch.int64) for s in seqs]


class Windows:
    """Uniform sampling of `seq_len`-token windows over all start offsets of all long-enough sequences."""

    def __init__(self, sequences: list[torch.Tensor], seq_len: int, generator: torch.Generator):
        self.seqs = [s for s in sequences if s.numel() >= seq_len]
        if not self.seqs:
            raise ValueError(f"no training sequence has at least seq_len={seq_len} tokens")
        self.seq_len = seq_len
        self.cum = torch.tensor([s.numel() - seq_len + 1 for s in self.seqs]).cumsum(0)
        self.gen = generator

    def sample(self, batch_size: int) -> torch.Tensor:
        flat = torch.randint(0, int(self.cum[-1]), (batch_size,), generator=self.gen)
        which = torch.searchsorted(self.cum, flat, right=True)
        rows = []
        for w, f in zip(which.tolist(), flat.tolist(), strict=True):
            start = f - (int(self.cum[w - 1]) if w else 0)
            rows.append(self.seqs[w][start : start + self.seq_len])
        return torch.stack(rows)


def _eval_windows(sequences: list[torch.Tensor], seq_len: int, max_windows: int) -> torch.Tensor | None:
    rows = [s[k : k + seq_len] for s in sequences for k in range(0, s.numel() - seq_len + 1, seq_len)]
    return torch.stack(rows[:max_windows]) if rows else None


# ----------------------------------------------------------------------------------------------------
# Evaluation and training
# ----------------------------------------------------------------------------------------------------


@torch.no_grad()
def unrolled_logits(
    head: Eagle3Head, target, windows: torch.Tensor, ttt_steps: int = 3, *, eagle_shift: bool = False
) -> list[torch.Tensor]:
    """The training forward on its own: draft-vocabulary logits [B, T-1, Dv] (float32) of each unrolled
    step over token windows [B, T] (entry i of step j predicts x_{i+2+j}; entries i >= T-1-j are padding)."""
    windows = windows.to(head.device)
    feats, _ = target_pass(target, windows, head.config.aux_hidden_layers, head.dtype)
    return unroll(head, feats, step_embeds(target, windows, ttt_steps, head.dtype), eagle_shift)


@torch.no_grad()
def evaluate_agreement(
    head: Eagle3Head,
    target,
    windows: torch.Tensor,
    ttt_steps: int = 3,
    *,
    batch_size: int = 16,
    eagle_shift: bool = False,
) -> list[float]:
    """Top-1 agreement, per unrolled step, of the head (mapped to target ids) with the target's argmax
    over windows [N, T] (teacher tokens as inputs; a target argmax outside the draft vocab counts as a miss)."""
    hits = [0] * ttt_steps
    total = [0] * ttt_steps
    dev = head.device
    for k in range(0, windows.shape[0], batch_size):
        w = windows[k : k + batch_size].to(dev)
        feats, logits = target_pass(target, w, head.config.aux_hidden_layers, head.dtype)
        embeds = step_embeds(target, w, ttt_steps, head.dtype)
        outs = unroll(head, feats, embeds, eagle_shift)
        for j, (out, (tgt, valid)) in enumerate(zip(outs, step_targets(logits, ttt_steps), strict=True)):
            same = head.to_target_ids(out.argmax(-1)) == tgt.argmax(-1)
            hits[j] += int((same & valid).sum())
            total[j] += int(valid.sum())
    return [h / max(t, 1) for h, t in zip(hits, total, strict=True)]


def train_eagle3(
    target,
    sequences: Sequence[torch.Tensor] | torch.Tensor,
    config: Eagle3Config | None = None,
    *,
    steps: int,
    lr: float,
    batch_size: int,
    seq_len: int,
    ttt_steps: int = 3,
    draft_vocab_size: int | None = None,
    seed: int = 0,
    progress: Callable[[dict[str, Any]], None] | None = None,
    eval_sequences: Sequence[torch.Tensor] | torch.Tensor | None = None,
    holdout: float = 0.1,
    max_eval_windows: int = 64,
    warmup: float = 0.05,
    weight_decay: float = 0.0,
    grad_clip: float = 0.5,
    init_lm_head_from_target: bool = True,
    eagle_shift: bool = False,
) -> Eagle3Head:
    """Train an EAGLE-3 head for the frozen `target` on `sequences` (list of 1-D token tensors or [N, L]).

    `config` defaults to `default_head_config(target)`; `draft_vocab_size` (else the config's) < vocab
    selects the most frequent training tokens as the draft vocabulary. `ttt_steps` unrolled steps per
    window (1 = teacher forcing only). Held-out windows: `eval_sequences`, else the last `holdout` share of
    `sequences` (none if that is empty); up to `max_eval_windows` non-overlapping windows are scored
    before and after training. `warmup`: share of steps with linear warmup (then cosine to 0).
    `progress(info)` is called after every step ({"step", "loss", "step_losses", "lr"}) and with
    {"eval": ..., "when": "before"|"after"}. Returns the head (float32, eval mode) with `head.train_log`.
    """
    if steps < 0 or batch_size < 1 or ttt_steps < 1 or lr <= 0:
        raise ValueError("need steps >= 0, batch_size >= 1, ttt_steps >= 1 and lr > 0")
    if seq_len < ttt_steps + 2:
        raise ValueError(f"seq_len must be >= ttt_steps + 2 = {ttt_steps + 2}, got {seq_len}")
    tc = _text_config(target)
    vocab = int(tc.vocab_size)
    if config is None:
        config = default_head_config(target)
    if draft_vocab_size is not None:
        config = Eagle3Config(**{**config.to_dict(), "draft_vocab_size": int(draft_vocab_size)})
    if config.vocab_size != vocab or config.target_hidden_size != int(tc.hidden_size):
        raise ValueError("config.vocab_size / target_hidden_size do not match the target")
    if max(config.aux_hidden_layers) > int(tc.num_hidden_layers):
        raise ValueError(f"aux_hidden_layers {config.aux_hidden_layers} exceed [0, {tc.num_hidden_layers}]")

    seqs = as_list(sequences)
    if eval_sequences is not None:
        train_seqs, eval_seqs = seqs, as_list(eval_sequences)
    else:
        n_eval = int(len(seqs) * holdout) if len(seqs) > 1 else 0
        train_seqs, eval_seqs = seqs[: len(seqs) - n_eval], seqs[len(seqs) - n_eval :]
    dev = target.device
    log = TrainLog()

    # Head init (private RNG so the global one is untouched and the result depends only on `seed`).
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        head = Eagle3Head(config).to(device=dev, dtype=torch.float32)
    counts = count_tokens(train_seqs, vocab)
    if config.draft_vocab_size < vocab:
        d2t, t2d = draft_vocab_from_counts(counts, config.draft_vocab_size)
        with torch.no_grad():
            head.d2t.copy_(d2t)
            head.t2d.copy_(t2d)
    log.draft_vocab_coverage = float(counts[head.t2d.cpu()].sum()) / max(int(counts.sum()), 1)
    if init_lm_head_from_target:
        out_emb = target.get_output_embeddings()
        if out_emb is not None and out_emb.weight.shape == (vocab, config.hidden_size):
            draft_ids = torch.arange(config.draft_vocab_size, device=dev) + head.d2t
            with torch.no_grad():
                head.lm_head.weight.copy_(out_emb.weight.detach()[draft_ids].float())

    eval_w = _eval_windows(eval_seqs, seq_len, max_eval_windows)
    log.eval_windows = 0 if eval_w is None else eval_w.shape[0]
    if eval_w is not None:
        log.agreement_untrained = evaluate_agreement(head, target, eval_w, ttt_steps, eagle_shift=eagle_shift)
        if progress:
            progress({"eval": log.agreement_untrained, "when": "before"})

    gen = torch.Generator().manual_seed(seed)
    data = Windows(train_seqs, seq_len, gen) if steps else None
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay)
    n_warm = max(1, int(round(warmup * steps)))

    def lr_at(s: int) -> float:
        if s < n_warm:
            return (s + 1) / n_warm
        return 0.5 * (1.0 + math.cos(math.pi * (s - n_warm) / max(steps - n_warm, 1)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    weights = [LOSS_DECAY**j for j in range(ttt_steps)]
    head.train()
    for s in range(steps):
        windows = data.sample(batch_size).to(dev)
        feats, logits = target_pass(target, windows, config.aux_hidden_layers, head.dtype)
        embeds = step_embeds(target, windows, ttt_steps, head.dtype)
        outs = unroll(head, feats, embeds, eagle_shift)
        losses = [
            kl_loss(out, tgt, valid, head)
            for out, (tgt, valid) in zip(outs, step_targets(logits, ttt_steps), strict=True)
        ]
        loss = sum(w * x for w, x in zip(weights, losses, strict=True))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if grad_clip:
            torch.nn.utils.clip_grad_norm_(params, grad_clip)
        cur_lr = opt.param_groups[0]["lr"]
        opt.step()
        sched.step()
        log.loss.append(float(loss.detach()))
        log.step_losses.append([float(x.detach()) for x in losses])
        log.lr.append(cur_lr)
        if progress:
            progress({"step": s, "loss": log.loss[-1], "step_losses": log.step_losses[-1], "lr": cur_lr})
    head.eval()
    if eval_w is not None:
        log.agreement = evaluate_agreement(head, target, eval_w, ttt_steps, eagle_shift=eagle_shift)
        if progress:
            progress({"eval": log.agreement, "when": "after"})
    head.train_log = log
    return head
