"""How well an EAGLE-3 head's confidence predicts the target's acceptance, and a temperature that makes it.

EAGLE-2's premise, which the confidence selector builds on: a draft node's cumulative probability (the product of
the draft probabilities along its path) ≈ the chance the target accepts it. When the head is under-confident at
its top token, a sibling's probability outranks the chain's deeper nodes that the target would have accepted, and
a tree of γ−1 nodes accepts fewer tokens than a plain chain. `collect` decodes with the chain (depth d, top-1:
every drafted token is verified) and keeps, for each depth, the head's full logits and the target's own token
there (known wherever the chain was accepted up to that depth); `fit_temperature` finds the temperature T of
softmax(logits / T) that minimises the target tokens' negative log-likelihood (temperature scaling);
`reliability` bins top-1 probability against acceptance, per depth and cumulatively.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class DraftSamples:
    """One row per drafted chain position: `depth` rows per SD step, in depth order."""

    logits: torch.Tensor  # [N, V] the head's raw logits (temperature 1)
    labels: torch.Tensor  # [N] the target's greedy token there; -1 past the step's first rejection (unknown)
    depths: torch.Tensor  # [N] draft depth (1 = the root's child)
    steps: torch.Tensor  # [N] the SD step it belongs to (a global counter)

    def known(self) -> DraftSamples:
        keep = self.labels >= 0
        return DraftSamples(self.logits[keep], self.labels[keep], self.depths[keep], self.steps[keep])


@torch.no_grad()
def collect(target, drafter, prompts: list[torch.Tensor], depth: int = 3, max_new_tokens: int = 64) -> DraftSamples:
    """Chain-decode every prompt (depth `depth`, top-1, all `depth` nodes verified, greedy) with the drafter at
    temperature 1, and keep each draft distribution's logits with the target's token at that position."""
    import ecospec

    saved, drafter.temperature = drafter.temperature, 1.0
    logits, labels, depths, steps = [], [], [], []
    step_id = 0
    try:
        for ids in prompts:
            drafter.logits_log = []
            res = ecospec.generate(
                target,
                ids,
                drafter=drafter,
                selector="confidence",
                gamma=depth + 1,
                depth=depth,
                topk=1,
                max_new_tokens=max_new_tokens,
                eos_token_id=[],
            )
            rows = torch.cat([x.reshape(-1, x.shape[-1]) for x in drafter.logits_log])
            if rows.shape[0] != depth * len(res.steps):
                raise RuntimeError(
                    f"expected {depth} draft distributions per step, got {rows.shape[0]} for {len(res.steps)} steps"
                )
            pos = 1  # res.tokens[0] is the prefill's token
            for i, st in enumerate(res.steps):
                produced = res.tokens[pos : pos + st.accepted]  # the target's tokens at depths 1..accepted
                pos += st.accepted
                if len(produced) < st.accepted:  # cut by max_new_tokens: not a whole step
                    break
                for d in range(1, depth + 1):
                    logits.append(rows[i * depth + d - 1])
                    labels.append(produced[d - 1] if d <= len(produced) else -1)
                    depths.append(d)
                    steps.append(step_id)
                step_id += 1
    finally:
        drafter.logits_log = None
        drafter.temperature = saved
    return DraftSamples(torch.stack(logits), torch.tensor(labels), torch.tensor(depths), torch.tensor(steps))


def nll(samples: DraftSamples, temperature: float | tuple[float, ...]) -> float:
    """Mean negative log-likelihood of the target's tokens under softmax(logits / temperature) (known rows; a tuple:
    one temperature per depth)."""
    samples = samples.known()
    logp = torch.log_softmax(scaled(samples, temperature), dim=-1)
    return float(-logp.gather(1, samples.labels[:, None]).mean())


def fit_temperature(samples: DraftSamples, low: float = 0.05, high: float = 4.0, iters: int = 60) -> float:
    """The temperature minimising `nll` (convex in 1/T: golden-section search on log T)."""
    a, b = np.log(low), np.log(high)
    g = (np.sqrt(5) - 1) / 2
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = nll(samples, float(np.exp(c))), nll(samples, float(np.exp(d)))
    for _ in range(iters):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = nll(samples, float(np.exp(c)))
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = nll(samples, float(np.exp(d)))
    return float(np.exp((a + b) / 2))


def fit_temperatures(samples: DraftSamples) -> tuple[float, ...]:
    """One temperature per draft depth (`fit_temperature` on that depth's rows): a head trained with unrolled steps
    is confident differently at each depth, and the confidence selector compares nodes across depths."""
    out = []
    for d in range(1, int(samples.depths.max()) + 1):
        m = samples.depths == d
        out.append(
            fit_temperature(DraftSamples(samples.logits[m], samples.labels[m], samples.depths[m], samples.steps[m]))
        )
    return tuple(out)


def scaled(samples: DraftSamples, temperature: float | tuple[float, ...]) -> torch.Tensor:
    """The rows' logits divided by their depth's temperature."""
    temps = temperature if isinstance(temperature, tuple | list) else (temperature,)
    t = torch.tensor(temps, dtype=samples.logits.dtype)[(samples.depths - 1).clamp(max=len(temps) - 1)]
    return samples.logits / t[:, None]


@dataclass
class Reliability:
    """Per depth: mean top-1 draft probability vs the rate the target accepts it (given its parent accepted), and
    the cumulative versions (the product along the chain vs the rate the whole chain up to that depth is accepted),
    plus binned points for a reliability diagram and the expected calibration error of each."""

    depth: list[int]
    confidence: list[float]  # mean conditional top-1 probability
    accuracy: list[float]  # acceptance rate given the parent was accepted
    cum_confidence: list[float]
    cum_accuracy: list[float]
    count: list[int]
    bins: list[tuple[float, float, int]]  # (mean confidence, accuracy, count) over all depths, conditional
    ece: float  # expected calibration error (conditional, all depths)


def reliability(samples: DraftSamples, temperature: float | tuple[float, ...] = 1.0, n_bins: int = 10) -> Reliability:
    """`Reliability` of the head's top-1 probabilities at `temperature` (the chain's tokens do not depend on it)."""
    probs = torch.softmax(scaled(samples, temperature), dim=-1)
    conf, top = probs.max(dim=-1)
    conf = conf.double()
    known = samples.labels >= 0
    correct = ((top == samples.labels) & known).double()
    n_depth = int(samples.depths.max())
    p = conf.view(-1, n_depth)  # [steps, depth]: rows are whole steps in depth order
    ok = correct.view(-1, n_depth)
    cum_p, cum_ok = p.cumprod(dim=1), ok.cumprod(dim=1)  # the chain up to depth d / accepted up to depth d
    depth, confidence, accuracy, count = [], [], [], []
    for d in range(1, n_depth + 1):
        m = known & (samples.depths == d)
        depth.append(d)
        count.append(int(m.sum()))
        confidence.append(float(conf[m].mean()))
        accuracy.append(float(correct[m].mean()))
    edges = torch.linspace(0, 1, n_bins + 1, dtype=torch.float64)
    c, a = conf[known], correct[known]
    bins, ece = [], 0.0
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        m = (c > lo) & (c <= hi)
        if m.any():
            bins.append((float(c[m].mean()), float(a[m].mean()), int(m.sum())))
            ece += float(m.sum()) / len(c) * abs(float(c[m].mean()) - float(a[m].mean()))
    return Reliability(depth, confidence, accuracy, cum_p.mean(0).tolist(), cum_ok.mean(0).tolist(), count, bins, ece)
