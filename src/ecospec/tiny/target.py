"""The embedded target: a small ``Qwen3MoeForCausalLM`` with fine-grained experts, trained on the corpus.

Training: next-token cross-entropy on random windows of the training stream (``<|bos|> file <|eos|>``
documents packed back to back) plus ``router_aux_loss_coef`` x the Switch-style load-balancing loss
computed per layer from the router logits of ``output_router_logits=True`` (``load_balancing_loss``),
AdamW, linear warmup then cosine decay, gradient clipping. Everything is drawn from private generators
seeded by ``TargetRecipe.seed``: the same recipe, data and thread count give the same weights.

Why this shape: the cost regime of the real systems (docs/design.md). Decoding on a CPU costs per op, not per
FLOP, at these sizes, so what a forward costs is how many ops it runs: a target layer costs its attention, norms
and router plus a share per unique expert of the per-expert loop, and the one-layer EAGLE-3 head a fixed cost per
forward whatever its width. Depth is therefore what keeps a draft a small fraction of an AR step, as in the paper's
systems: 20 layers is the fewest that keeps a three-forward draft under a fifth of our AR step (the older, wider
and shallower targets made drafting a large share of a step). Attention: 2 heads of 32 (1 KV head), because vLLM's
CPU attention takes no head size below 32 and the build must load there as it is; the projections keep the shapes
of the earlier 4 heads of 16. 32 experts, top-4, expert width 64: the routing shape other issues refer to.

Recipe (what was measured when each knob was chosen, and what was tried and dropped: docs/embedded-default.md,
"How the recipe was chosen"):

* Budget: enough steps that most greedy outputs no longer end in a short loop (greedy quality tracks the held-out
  loss, and fewer steps left nearly all of them looping), in a build that stays minutes long on 2 cores.
  256-token windows: at 512, attention costs a large share of each step.
* Balancing: the per-layer Switch loss on the micro-batch; its coefficient is the smallest at which every layer
  passes the routing check on the machines tried. A smaller one concentrates the load without making routing more
  local (the overlap rises, but so does the independent baseline) and leaves dead experts; Qwen3's global-batch
  balancing gave less locality. The paper's Qwen3-235B locality is out of reach of a CPU-trained target this
  size, and it bounds what cost-aware selection can save here (``reports/tiny``).
* HF's ``load_balancing_loss_func`` sums expert counts and probabilities over layers before the
  product, so it balances each expert id across layers, not each layer: with it, every layer routed all tokens
  to the same few experts early on and some experts stayed dead.
* Training kernel ``ecospec_sorted`` (``tiny/experts.py``): faster than the eager per-expert loop and
  deterministic, which transformers' ``grouped_mm`` is not on a 2-thread CPU. Decoding always runs the eager loop
  (``sources.tiny.load_trained``).
* Thread contention: with 2 threads and another busy process on a 2-core machine, OpenMP spin-waits make steps
  many times slower; 1 thread is not slowed this way. The trainer warns when steps slow down over 4x.

Checks on held-out data (``routing_load_stats``): per MoE layer, the share of routed (token, slot)
pairs each expert receives. A healthy fine-grained MoE has every expert above ``min_share`` (0.1 %)
and none above ``max_over_mean`` (5x) the mean; ``check_routing`` lists the violations and
``train_target`` warns on any (raises ``RoutingImbalanceError`` when ``strict``).

Routing overlap of consecutive tokens (step-1 temporal locality), per layer l with expert sets S_t:
empirical = mean over consecutive pairs in a sequence of |S_t ∩ S_{t+1}| / k; independence =
sum_e pi_e^2 / k with pi_e = k * share_e (the expected overlap if tokens drew their sets independently
with the measured marginals); uniform = k / N. Reported values are means over layers.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict

import numpy as np
import torch

from ecospec.tiny.budgets import TargetRecipe


class RoutingImbalanceError(RuntimeError):
    """The trained target's held-out expert loads violate the recipe's bounds."""

    def __init__(self, message: str, stats: dict):
        super().__init__(message)
        self.stats = stats


def target_config(recipe: TargetRecipe, vocab_size: int):
    """The ``Qwen3MoeConfig`` of the recipe (`TargetRecipe.hf_config`)."""
    from transformers import Qwen3MoeConfig

    kwargs = recipe.hf_config(vocab_size)
    kwargs.pop("model_type")
    return Qwen3MoeConfig(**kwargs)


def init_target(recipe: TargetRecipe, vocab_size: int):
    """Random init of the recipe's model (seeded; the global RNG is untouched), float32, train mode."""
    from transformers import AutoModelForCausalLM

    import ecospec.tiny.experts  # noqa: F401 - registers the "ecospec_sorted" experts kernel

    config = target_config(recipe, vocab_size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(recipe.seed)
        model = AutoModelForCausalLM.from_config(
            config,
            attn_implementation="sdpa",
            experts_implementation=recipe.experts_implementation,
            dtype=torch.float32,
        )
    return model


def eval_batches(ids: np.ndarray, seq_len: int, max_tokens: int, batch_size: int = 16) -> list[torch.Tensor]:
    """Held-out batches: up to ``max_tokens // seq_len`` windows of ``seq_len`` tokens spread evenly over
    ``ids`` (non-overlapping), as LongTensors [<=batch_size, seq_len]."""
    n_windows = min(max(max_tokens // seq_len, 1), len(ids) // seq_len)
    if n_windows == 0:
        raise ValueError(f"held-out stream of {len(ids)} tokens is shorter than seq_len {seq_len}")
    stride = len(ids) // n_windows
    starts = [i * stride for i in range(n_windows)]
    windows = torch.from_numpy(np.stack([ids[s : s + seq_len].astype(np.int64) for s in starts]))
    return list(windows.split(batch_size))


@torch.no_grad()
def heldout_loss(model, batches: Iterable[torch.Tensor]) -> float:
    """Mean next-token cross-entropy (nats) over all predicted positions of ``batches``."""
    total, count = 0.0, 0
    for x in batches:
        logits = model(input_ids=x).logits[:, :-1].float()
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum"
        )
        total += loss.item()
        count += x[:, 1:].numel()
    return total / count


def routing_stats_from_routes(routes: Sequence[torch.Tensor] | torch.Tensor, num_experts: int) -> dict:
    """Load and overlap statistics of routed sequences.

    ``routes``: one LongTensor [L, B, T, k] (or [L, T, k], one sequence) or a list of such tensors
    (e.g. one per batch; sequences may differ in length). Consecutive-token pairs are taken within each
    sequence only. Returns per layer ``loads`` (counts of (token, slot) assignments per expert),
    ``min_share``, ``max_share``, ``max_over_mean`` and ``overlap`` (``empirical``, ``independence``,
    ``uniform`` means over layers, plus ``empirical_per_layer``/``independence_per_layer``).
    """
    if isinstance(routes, torch.Tensor):
        routes = [routes]
    loads, inter, pairs = None, None, 0
    k = None
    for r in routes:
        r = r.detach().to("cpu", torch.long)
        if r.dim() == 3:
            r = r.unsqueeze(1)  # [L, 1, T, k]
        num_layers, _, seq, k = r.shape
        counts = torch.zeros(num_layers, num_experts, dtype=torch.long)
        counts.scatter_add_(1, r.reshape(num_layers, -1), torch.ones(num_layers, r[0].numel(), dtype=torch.long))
        loads = counts if loads is None else loads + counts
        if seq > 1:
            onehot = torch.zeros(*r.shape[:3], num_experts, dtype=torch.bool)
            onehot.scatter_(3, r, True)  # [L, B, T, N]
            both = (onehot[:, :, 1:] & onehot[:, :, :-1]).sum(dim=(1, 2, 3))  # [L]
            inter = both if inter is None else inter + both
            pairs += onehot.shape[1] * (seq - 1)
    if loads is None:
        raise ValueError("no routes")
    shares = loads.double() / loads.sum(dim=1, keepdim=True).clamp_min(1)  # [L, N], rows sum to 1
    pi = shares * k  # activation probability of each expert
    independence = (pi**2).sum(dim=1) / k  # [L]
    empirical = inter.double() / (pairs * k) if pairs else torch.full((loads.shape[0],), float("nan"))
    return {
        "num_tokens": int(loads[0].sum().item()) // k,
        "num_experts": num_experts,
        "top_k": k,
        "loads": loads.tolist(),
        "min_share": shares.min(dim=1).values.tolist(),
        "max_share": shares.max(dim=1).values.tolist(),
        "max_over_mean": (shares.max(dim=1).values * num_experts).tolist(),
        "overlap": {
            "empirical": float(empirical.mean()),
            "independence": float(independence.mean()),
            "uniform": k / num_experts,
            "empirical_per_layer": empirical.tolist(),
            "independence_per_layer": independence.tolist(),
        },
    }


@torch.no_grad()
def _heldout_pass(model, token_batches: Iterable[torch.Tensor]) -> tuple[float, dict]:
    """One pass over the batches: (mean next-token loss, ``routing_stats_from_routes`` of the routing)."""
    from ecospec.engine.routing import RoutingCapture
    from ecospec.models.adapters import moe_info

    info = moe_info(model)
    per_batch = []
    total, count = 0.0, 0
    with RoutingCapture(model) as cap:
        for x in token_batches:
            x = x.to(model.device)
            logits = model(input_ids=x).logits[:, :-1].float()
            r = cap.take()  # [L, B*T, k], batch-major
            per_batch.append(r.reshape(r.shape[0], x.shape[0], x.shape[1], r.shape[-1]))
            total += torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum"
            ).item()
            count += x[:, 1:].numel()
    return total / max(count, 1), routing_stats_from_routes(per_batch, info.num_experts)


def routing_load_stats(model, token_batches: Iterable[torch.Tensor]) -> dict:
    """Run ``model`` over ``token_batches`` (LongTensors [B, T]) and return ``routing_stats_from_routes``
    of its top-k routing (per-layer ``min_share``, ``max_over_mean``, ``loads``, and ``overlap``)."""
    return _heldout_pass(model, token_batches)[1]


def check_routing(stats: dict, min_share: float = 0.001, max_over_mean: float = 5.0) -> list[str]:
    """Violations of the load bounds, one line per offending layer (empty when routing is healthy)."""
    problems = []
    for layer, (lo, ratio) in enumerate(zip(stats["min_share"], stats["max_over_mean"], strict=True)):
        if lo < min_share:
            problems.append(f"layer {layer}: an expert gets {lo:.4%} of routed tokens (< {min_share:.2%})")
        if ratio > max_over_mean:
            problems.append(f"layer {layer}: busiest expert at {ratio:.2f}x the mean load (> {max_over_mean}x)")
    return problems


def load_balancing_loss(router_logits: Sequence[torch.Tensor], top_k: int) -> torch.Tensor:
    """Switch-Transformer load-balancing loss, per MoE layer, averaged over layers.

    For layer l with router logits [tokens, N]: N * sum_e f_e * P_e, where f_e is the fraction of the
    layer's (token, slot) assignments that go to expert e and P_e the mean router probability of e.
    1.0 when balanced. (HF's ``load_balancing_loss_func`` sums f and P over all layers before taking the
    product, which balances each expert id across layers, not each layer; a tiny model trained with it
    collapses some layers onto a few experts.)
    """
    losses = []
    for logits in router_logits:
        probs = torch.softmax(logits.float(), dim=-1)  # [tokens, N]
        num_experts = probs.shape[-1]
        top = probs.topk(top_k, dim=-1).indices
        counts = torch.zeros(num_experts, device=probs.device).scatter_add_(
            0, top.reshape(-1), torch.ones(top.numel(), device=probs.device)
        )
        losses.append(num_experts * (counts / top.numel() * probs.mean(dim=0)).sum())
    return torch.stack(losses).mean()


def _lr_at(step: int, recipe: TargetRecipe) -> float:
    if step < recipe.warmup_steps:
        return recipe.lr * (step + 1) / recipe.warmup_steps
    span = max(recipe.steps - recipe.warmup_steps, 1)
    progress = min((step - recipe.warmup_steps) / span, 1.0)
    floor = recipe.min_lr_ratio
    return recipe.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def _param_groups(model, weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.dim() < 2 or "norm" in name or "embed_tokens" in name else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def train_target(
    recipe: TargetRecipe,
    train_ids: np.ndarray,
    val_ids: np.ndarray,
    vocab_size: int,
    progress: Callable | None = None,
    log: Callable[[str], None] | None = None,
    strict: bool = False,
) -> tuple[torch.nn.Module, dict]:
    """Train the recipe's target on the token streams; return (model in eval mode, metrics).

    ``progress``: optional tqdm-like factory, called as ``progress(total=steps, desc=...)``; the bar gets
    ``set_postfix`` with the running loss. Metrics: initial and final held-out loss (nats/token),
    train loss (mean of the last 10 % of steps), aux loss, steps/s, tokens/s, seconds, routing stats
    (``routing_load_stats`` on the held-out batches) and the routing violations (``check_routing``).
    Violations are a warning through ``log`` with the figures (the build finishes); ``strict`` raises
    ``RoutingImbalanceError`` instead (``python -m ecospec.tiny build --strict``, for whoever cuts a release).

    ``log`` (default ``warnings.warn``) gets one message if steps become over 4x slower than in the
    first 50: the signature of OpenMP threads spinning against other processes on a busy machine
    (``torch.set_num_threads(1)`` is then far faster).
    """
    r = recipe
    if len(train_ids) <= r.seq_len + 1:
        raise ValueError(f"training stream of {len(train_ids)} tokens is too short for seq_len {r.seq_len}")
    model = init_target(r, vocab_size)
    heldout = eval_batches(val_ids, r.seq_len, r.eval_tokens)
    model.eval()
    loss0 = heldout_loss(model, heldout[: max(len(heldout) // 8, 1)])  # a subset: only for reference
    model.train()
    opt = torch.optim.AdamW(_param_groups(model, r.weight_decay), lr=r.lr, betas=(0.9, r.beta2), eps=1e-8)
    gen = torch.Generator().manual_seed(r.seed + 1)
    data = torch.from_numpy(train_ids.astype(np.int64))
    offsets = torch.arange(r.seq_len)
    bar = progress(total=r.steps, desc="target") if progress is not None else None
    ce_hist, aux_hist, step_times = [], [], []
    slow_warned = False
    t0 = time.perf_counter()
    for step in range(r.steps):
        t_step = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, r)
        starts = torch.randint(0, len(data) - r.seq_len, (r.batch_size,), generator=gen)
        x = data[starts[:, None] + offsets]
        out = model(input_ids=x, output_router_logits=True)
        ce = torch.nn.functional.cross_entropy(
            out.logits[:, :-1].reshape(-1, out.logits.shape[-1]).float(), x[:, 1:].reshape(-1)
        )
        aux = load_balancing_loss(out.router_logits, r.top_k)
        (ce + r.router_aux_loss_coef * aux).backward()
        if r.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), r.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        ce_hist.append(ce.item())
        aux_hist.append(aux.item())
        step_times.append(time.perf_counter() - t_step)
        if not slow_warned and step >= 70:
            base, recent = float(np.median(step_times[10:50])), float(np.mean(step_times[-20:]))
            if recent > 4 * base:
                slow_warned = True
                (log or warnings.warn)(
                    f"target training slowed from {base:.2f} to {recent:.2f} s/step at step {step}: the machine is "
                    f"busy and {torch.get_num_threads()} torch threads contend with other processes; "
                    "a build with threads=1 (--threads 1) is not slowed this way"
                )
        if bar is not None:
            bar.update(1)
            if step % 10 == 0 or step == r.steps - 1:
                bar.set_postfix(loss=f"{np.mean(ce_hist[-20:]):.3f}", aux=f"{aux:.3f}")
    train_seconds = time.perf_counter() - t0
    if bar is not None:
        bar.close()
    model.eval()
    t1 = time.perf_counter()
    loss, stats = _heldout_pass(model, heldout)
    eval_seconds = time.perf_counter() - t1
    problems = check_routing(stats, r.min_share, r.max_over_mean)
    tail = max(r.steps // 10, 1)
    metrics = {
        "params": sum(p.numel() for p in model.parameters()),
        "active_params": _active_params(model, r),
        "vocab_size": vocab_size,
        "heldout_loss_init": loss0,
        "heldout_loss": loss,
        "heldout_tokens": sum(x[:, 1:].numel() for x in heldout),
        "log_vocab": math.log(vocab_size),
        "train_loss": float(np.mean(ce_hist[-tail:])),
        "aux_loss": float(np.mean(aux_hist[-tail:])),
        "train_seconds": train_seconds,
        "eval_seconds": eval_seconds,
        "steps": r.steps,
        "steps_per_second": r.steps / train_seconds,
        "tokens_per_second": r.steps * r.batch_size * r.seq_len / train_seconds,
        "train_tokens": r.steps * r.batch_size * r.seq_len,
        "threads": torch.get_num_threads(),
        "routing": stats,
        "routing_violations": problems,
        "recipe": asdict(r),
    }
    if problems:
        message = (
            f"trained target's expert loads are out of bounds on held-out data (held-out loss {loss:.3f}):\n  "
            + "\n  ".join(problems)
            + f"\nhint: raise router_aux_loss_coef (now {r.router_aux_loss_coef}) or the number of steps "
            f"(now {r.steps}), then rebuild with --force"
        )
        if strict:
            raise RoutingImbalanceError(message, stats)
        (log or warnings.warn)(f"WARNING (the build goes on; --strict fails here): {message}")
    return model, metrics


def _active_params(model, recipe: TargetRecipe) -> int:
    """Parameters touched per token: everything but the unrouted experts."""
    total = sum(p.numel() for p in model.parameters())
    per_expert = 3 * recipe.hidden_size * recipe.moe_intermediate_size
    return total - recipe.num_layers * (recipe.num_experts - recipe.top_k) * per_expert
