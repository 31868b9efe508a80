"""Group Tree Optimization (GTO; Hu, Li, Lu, Zhou, arXiv 2509.22134): train an EAGLE-3 head on the draft trees it
grows at decoding time, against a frozen copy of the head it starts from. Decoding is unchanged (lossless).

Per training window (T tokens of text the target produced or reads) and per step:

1. Trees. At each chosen position i (root x_{i+1}, the prefix x_0..x_{i+1}) the trained head M and the frozen
   reference M0 each grow the tree the decode loop grows: `Eagle3Drafter.begin_positions` + `engine.tree.grow_trees`
   (the same code; depth and top-k knobs, default the evaluation's 3 and 2).
2. Reward, from one tree-attention forward of the target over all trees of the window (`target_tree_probs`;
   temperature 1 whatever the evaluation temperature, as GTO): node u's probability T(s_u | prefix, ancestors);
   a root-to-leaf branch s_1..s_l is worth L = sum_u prod_{v<=u} T(s_v) (`branch_values`: the expected number of
   tokens accepted along it), the tree r = (1/eta) log sum_j exp(eta L_j) (`tree_reward`, eta = 1).
3. Advantage. Positions come in K groups of m consecutive ones; R_i = r(tree of M) - r(tree of M0) takes out how
   easy the prefix is; A_i = (R_i - mean) / (std + delta) within the group.
4. Surrogate, along the longest branch of M's tree the target accepts greedily (`accepted_branch`):
   rho_i = exp((log M(branch) - log M0(branch)) / max(len, 1)); loss = -(1/m) sum_i min(rho_i A_i,
   clip(rho_i, 1 - eps, 1 + eps) A_i), averaged over groups. log M(branch) comes from the training unroll
   (`eagle3_train.unroll`) fed the branch tokens instead of the teacher tokens: step j's entry i is then the
   depth-(j+1) node of the branch (same hidden-state recurrence, positions and visibility as decoding), so gradients
   reach the trained head through its branch tokens only, never the reference.
5. Total loss = the EAGLE-3 loss (KL to the target, training-time test) + `gto_weight` (0.5) x the GTO loss.

Optimiser: AdamW (0.9, 0.95), linear warm-up then constant, gradient clipping (GTO: lr 5e-6, 1k warm-up, clip 0.5).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields

import torch
import torch.nn.functional as F

from ecospec.drafters.eagle3 import Eagle3Drafter, Eagle3Head
from ecospec.drafters.eagle3_train import (
    LOSS_DECAY,
    Windows,
    as_list,
    kl_loss,
    step_embeds,
    step_targets,
    target_pass,
    unroll,
)
from ecospec.engine.forward import attention_layout, forward_block, new_cache
from ecospec.engine.tree import DraftTree, ancestor_mask, grow_trees


@dataclass(frozen=True)
class GtoSettings:
    depth: int = 3  # training trees: the decode loop's growth (EAGLE-2/3), depth and top-k
    topk: int = 2
    groups: int = 16  # K groups of m consecutive positions per window
    group_size: int = 8
    eta: float = 1.0  # soft maximum of the branch values
    eps: float = 0.2  # surrogate clip
    delta: float = 1e-6  # advantage standardisation
    gto_weight: float = 0.5
    eagle_weight: float = 1.0  # the EAGLE-3 part of the loss (0: GTO alone, for ablations and tests)
    ttt_steps: int = 3


@dataclass
class GtoLog:
    loss: list[float] = field(default_factory=list)
    eagle_loss: list[float] = field(default_factory=list)
    gto_loss: list[float] = field(default_factory=list)
    reward_gain: list[float] = field(default_factory=list)  # mean over positions of r(M) - r(M0)
    accepted: list[float] = field(default_factory=list)  # mean greedy-accepted branch length of M's trees


# -- the reward ------------------------------------------------------------------------------------------------


def leaves(tree: DraftTree) -> list[int]:
    """Nodes without children (the ends of the root-to-leaf branches)."""
    has_child = set(tree.parents)
    return [i for i in range(len(tree)) if i not in has_child]


def branch_values(tree: DraftTree, probs: Sequence[float]) -> list[tuple[list[int], float]]:
    """Per root-to-leaf branch (node indices, first level first): L = sum_u prod_{v<=u} probs[s_v], the expected
    number of its tokens the target accepts when each is accepted with the target's probability of it and
    acceptance stops at the first rejection. probs[i]: T(token of node i | prefix, its ancestors)."""
    out = []
    for leaf in leaves(tree):
        path = tree.path(leaf)
        run, value = 1.0, 0.0
        for node in path:
            run *= probs[node]
            value += run
        out.append((path, value))
    return out


def tree_reward(values: Sequence[float], eta: float = 1.0) -> float:
    """(1/eta) log sum_j exp(eta L_j): a soft maximum over the branches."""
    top = max(values)
    return top + math.log(sum(math.exp(eta * (v - top)) for v in values)) / eta


def accepted_branch(tree: DraftTree, greedy_ok: Sequence[bool]) -> list[int]:
    """The longest root-to-node path whose every token is the target's greedy choice (greedy_ok[i]: node i's token
    is the argmax of the target at its parent); ties: the first in node order. Empty when no first-level node is."""
    best: list[int] = []
    for node in range(len(tree)):
        path = tree.path(node)
        if len(path) > len(best) and all(greedy_ok[n] for n in path):
            best = path
    return best


@torch.no_grad()
def target_tree_probs(target, window: torch.Tensor, trees: Sequence[DraftTree], positions: Sequence[int]):
    """For each tree (the tree grown at position i: root = window[i + 1]) the target's probability of every node's
    token given the prefix and the node's ancestors (temperature 1), and whether it is the target's greedy choice:
    one forward over the window, then one tree-attention forward over every tree's nodes together."""
    layout = attention_layout(target.config, target)
    cache = new_cache()
    t = window.shape[0]
    pos = torch.arange(t, device=target.device)
    res = forward_block(
        target,
        layout,
        cache,
        window[None].to(target.device),
        pos,
        pos,
        torch.ones(t, t, dtype=torch.bool, device=target.device).tril(),
    )
    prefix_logits = res.logits[0].float()  # position i + 1's logits: the distribution of the first draft level
    tokens, qpos, offsets = [], [], []
    for tree, i in zip(trees, positions, strict=True):
        offsets.append(len(tokens))
        tokens += tree.tokens
        qpos += [i + 1 + d for d in tree.depths]
    q = len(tokens)
    vis = torch.zeros(q, t + q, dtype=torch.bool)
    for tree, i, off in zip(trees, positions, offsets, strict=True):
        n = len(tree)
        vis[off : off + n, : i + 2] = True  # the prefix x_0..x_{i+1}
        vis[off : off + n, t + off : t + off + n] = ancestor_mask(tree.parents)[1:, 1:]
    dev = target.device
    qpos_t = torch.tensor(qpos, device=dev)
    out = forward_block(
        target, layout, cache, torch.tensor([tokens], device=dev), qpos_t, torch.cat([pos, qpos_t]), vis.to(dev)
    )
    node_logits = out.logits[0].float()
    probs, greedy = [], []
    for tree, i, off in zip(trees, positions, offsets, strict=True):
        p, g = [], []
        for tok, parent in zip(tree.tokens, tree.parents, strict=True):
            logits = prefix_logits[i + 1] if parent < 0 else node_logits[off + parent]
            p.append(float(torch.softmax(logits, -1)[tok]))
            g.append(int(logits.argmax()) == tok)
        probs.append(p)
        greedy.append(g)
    return probs, greedy


# -- the surrogate -----------------------------------------------------------------------------------------------


def branch_logprobs(head: Eagle3Head, target, window: torch.Tensor, feats: torch.Tensor, branches) -> torch.Tensor:
    """log M(branch) at every window entry [T - 1] (0 where the entry has no branch): the training unroll with
    step j's token at entry i = the branch's depth-j token (step 0: the root, the teacher token x_{i+1}).
    Differentiable in the head; `feats` [1, T - 1, F] are the target's features of the window."""
    n = feats.shape[1]
    depth = max((len(b) for b in branches.values()), default=0)
    if depth == 0:
        return torch.zeros(n, device=feats.device)
    emb = target.get_input_embeddings()
    teacher = step_embeds(target, window[None], 1, head.dtype)[0]  # [1, n, H]: x_{i+1}
    steps = [teacher]
    ids = torch.zeros(depth, n, dtype=torch.long)  # the branch token each step predicts, per entry
    mask = torch.zeros(depth, n, dtype=torch.bool)
    for i, b in branches.items():
        for j, tok in enumerate(b):
            ids[j, i] = tok
            mask[j, i] = True
    for j in range(1, depth):  # step j's input token: the branch's token at depth j
        steps.append(emb(ids[j - 1][None].to(feats.device)).to(head.dtype))
    logits = unroll(head, feats, steps, eagle_shift=False)
    inverse = torch.full((head.config.vocab_size,), 0, dtype=torch.long, device=feats.device)
    draft_ids = torch.arange(head.config.draft_vocab_size, device=feats.device)
    inverse[draft_ids + head.d2t] = draft_ids
    total = torch.zeros(n, device=feats.device, dtype=feats.dtype)
    for j in range(depth):
        lp = F.log_softmax(logits[j][0], dim=-1).gather(-1, inverse[ids[j].to(feats.device)][:, None])[:, 0]
        total = total + torch.where(mask[j].to(feats.device), lp, torch.zeros_like(lp))
    return total


def group_advantages(gains: torch.Tensor, delta: float) -> torch.Tensor:
    """[K, m] reward gains -> advantages standardised within each group."""
    mean = gains.mean(dim=1, keepdim=True)
    std = gains.std(dim=1, keepdim=True, unbiased=False)
    return (gains - mean) / (std + delta)


def surrogate(logp: torch.Tensor, logp_ref: torch.Tensor, lengths: torch.Tensor, adv: torch.Tensor, eps: float):
    """GTO's clipped surrogate, [K, m] inputs: mean over groups of -(1/m) sum_i min(rho A, clip(rho) A)."""
    rho = torch.exp((logp - logp_ref) / lengths.clamp(min=1))
    return -torch.minimum(rho * adv, rho.clamp(1 - eps, 1 + eps) * adv).mean()


# -- one step and the trainer -------------------------------------------------------------------------------------


def _positions(n: int, s: GtoSettings, gen: torch.Generator) -> list[list[int]]:
    """K groups of m consecutive training positions in [0, n - depth) (fewer when the window is short)."""
    span = s.group_size
    top = max(1, n - s.depth - span)
    starts = torch.randperm(top, generator=gen)[: s.groups].sort().values.tolist()
    return [list(range(a, a + span)) for a in starts]


def _trees(head: Eagle3Head, target, window, feats, positions, s: GtoSettings) -> list[DraftTree]:
    drafter = Eagle3Drafter(head, target.get_input_embeddings())
    logp, ids = drafter.begin_positions(window, feats[0], positions, s.topk)
    return grow_trees(logp, ids, drafter.expand_rows, s.depth)


def gto_terms(
    head: Eagle3Head,
    ref: Eagle3Head,
    target,
    window: torch.Tensor,
    feats: torch.Tensor,
    s: GtoSettings,
    gen: torch.Generator,
) -> tuple[torch.Tensor, dict]:
    """The GTO loss of one window (differentiable in `head`) and its statistics."""
    groups = _positions(feats.shape[1], s, gen)
    flat = [i for g in groups for i in g]
    with torch.no_grad():
        mine, theirs = _trees(head, target, window, feats, flat, s), _trees(ref, target, window, feats, flat, s)
        probs, greedy = target_tree_probs(target, window, mine + theirs, flat + flat)
    k = len(flat)
    r_m = [tree_reward([v for _, v in branch_values(t, p)], s.eta) for t, p in zip(mine, probs[:k], strict=True)]
    r_0 = [tree_reward([v for _, v in branch_values(t, p)], s.eta) for t, p in zip(theirs, probs[k:], strict=True)]
    gains = torch.tensor(r_m) - torch.tensor(r_0)
    shape = (len(groups), s.group_size)
    adv = group_advantages(gains.view(shape), s.delta).to(feats.device)
    branches = {}
    for i, tree, ok in zip(flat, mine, greedy[:k], strict=True):
        path = accepted_branch(tree, ok)
        if path:
            branches[i] = [tree.tokens[n] for n in path]
    lp = branch_logprobs(head, target, window, feats, branches)
    with torch.no_grad():
        lp_ref = branch_logprobs(ref, target, window, feats, branches)
    idx = torch.tensor(flat, device=feats.device)
    lengths = torch.tensor([len(branches.get(i, ())) for i in flat], dtype=feats.dtype, device=feats.device)
    loss = surrogate(lp[idx].view(shape), lp_ref[idx].view(shape), lengths.view(shape), adv, s.eps)
    return loss, {"reward_gain": float(gains.mean()), "accepted": float(lengths.mean())}


def eagle_loss(head: Eagle3Head, target, windows: torch.Tensor, feats, logits, ttt_steps: int) -> torch.Tensor:
    outs = unroll(head, feats, step_embeds(target, windows, ttt_steps, head.dtype), eagle_shift=False)
    losses = [kl_loss(o, t, v, head) for o, (t, v) in zip(outs, step_targets(logits, ttt_steps), strict=True)]
    return sum(LOSS_DECAY**j * x for j, x in enumerate(losses))


def train_gto(
    head: Eagle3Head,
    target,
    sequences,
    *,
    steps: int,
    lr: float,
    batch_size: int,
    seq_len: int,
    settings: GtoSettings = GtoSettings(),
    warmup_steps: int = 0,
    grad_clip: float = 0.5,
    seed: int = 0,
    progress: Callable[[dict], None] | None = None,
    state: dict | None = None,
    save: Callable[[dict], None] | None = None,
    save_every: int = 0,
    reference: Eagle3Head | None = None,
) -> tuple[Eagle3Head, GtoLog]:
    """Continue training `head` (in place) with GTO + the EAGLE-3 loss on windows of `sequences` (text the target
    produced, ideally) against a frozen copy of it as it is now. `state` (from `save`): resume an interrupted run
    (optimiser, data order, RNG, log, step, the reference weights) so it ends where the uninterrupted one would.
    `reference`: the frozen M0 (default: a copy of `head` as it is now)."""
    s = settings
    ref = copy.deepcopy(reference if reference is not None else head).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    gen = torch.Generator().manual_seed(seed)
    data = Windows(as_list(sequences), seq_len, gen)
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: min(1.0, (k + 1) / max(warmup_steps, 1)))
    log, start = GtoLog(), 0
    if state is not None:
        ref.load_state_dict(state["ref"])
        head.load_state_dict(state["head"])
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        gen.set_state(state["gen"])
        log, start = GtoLog(**state["log"]), state["step"]
    dev = head.device
    for step in range(start, steps):
        head.train()
        windows = data.sample(batch_size).to(dev)
        feats, logits = target_pass(target, windows, head.config.aux_hidden_layers, head.dtype)
        base = eagle_loss(head, target, windows, feats, logits, s.ttt_steps) if s.eagle_weight else torch.zeros(())
        terms = [gto_terms(head, ref, target, w, f[None], s, gen) for w, f in zip(windows, feats, strict=True)]
        g = sum(t for t, _ in terms) / len(terms)
        loss = s.eagle_weight * base + s.gto_weight * g
        opt.zero_grad(set_to_none=True)
        if loss.requires_grad:  # GTO alone on windows where no branch was accepted has nothing to learn from
            loss.backward()
        if grad_clip:
            torch.nn.utils.clip_grad_norm_(params, grad_clip)
        opt.step()
        sched.step()
        log.loss.append(float(loss.detach()))
        log.eagle_loss.append(float(base.detach()))
        log.gto_loss.append(float(g.detach()))
        log.reward_gain.append(sum(st["reward_gain"] for _, st in terms) / len(terms))
        log.accepted.append(sum(st["accepted"] for _, st in terms) / len(terms))
        if progress:
            progress(
                {"step": step, "loss": log.loss[-1], "reward_gain": log.reward_gain[-1], "accepted": log.accepted[-1]}
            )
        if save and save_every and (step + 1) % save_every == 0 and step + 1 < steps:
            save(
                {
                    "head": head.state_dict(),
                    "ref": ref.state_dict(),
                    "opt": opt.state_dict(),
                    "step": step + 1,
                    "sched": sched.state_dict(),
                    "gen": gen.get_state(),
                    "log": dict(log.__dict__),
                }
            )
    head.eval()
    return head, log


@dataclass(frozen=True)
class GtoTraining:
    """How a GTO head trains: the job's `gto` block, or the tiny build's `GtoRecipe`."""

    steps: int
    lr: float
    warmup_steps: int
    batch_size: int
    seq_len: int
    groups: int
    group_size: int
    depth: int
    topk: int
    seed: int
    gto_weight: float = GtoSettings.gto_weight  # 0: continued EAGLE-3 training alone (the tiny build's ablation)

    @classmethod
    def of(cls, settings: Mapping) -> GtoTraining:
        """The fields of `settings` this dataclass names (the rest: data, generation, saving)."""
        return cls(**{f.name: settings[f.name] for f in fields(cls) if f.name in settings})


def train_gto_head(
    head,
    target,
    sequences,
    training: GtoTraining,
    progress: Callable[[dict], None] | None = None,
    state: dict | None = None,
    save: Callable[[dict], None] | None = None,
    save_every: int = 0,
) -> tuple[object, GtoLog]:
    """`head` (float32, on the target's device) trained further with GTO on `sequences`
    (`train_gto`; `state` / `save`: resume and save a run): what `experiment=gto` and the tiny
    build's GTO stage both run."""
    settings = GtoSettings(
        depth=training.depth,
        topk=training.topk,
        groups=training.groups,
        group_size=training.group_size,
        gto_weight=training.gto_weight,
    )
    return train_gto(
        head.to(device=target.device, dtype=torch.float32),
        target,
        sequences,
        steps=training.steps,
        lr=training.lr,
        batch_size=training.batch_size,
        seq_len=training.seq_len,
        settings=settings,
        warmup_steps=training.warmup_steps,
        seed=training.seed,
        progress=progress,
        state=state,
        save=save,
        save_every=save_every,
    )
