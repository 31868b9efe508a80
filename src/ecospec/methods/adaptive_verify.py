"""adaptive_verify: vLLM's adaptive verification (merged into vLLM in 2026), lossless and training-free. Every
sequence drafts the configured tree; each step ranks every sequence's nodes together by survival probability (the
chance that a node and its whole prefix are accepted, estimated by its path probability P), so every prefix of that
order is a subtree of each tree, and verifies the global top k, k chosen for the most expected tokens per second
of the whole batched step: the bonus token of every sequence + the sum of the chosen nodes' P, over the drafting
already done and the profile's verify time for the batch padded to its longest block (`VerifyProfile.t_batch`).
k = 0 makes the step an AR step for every sequence. At one sequence it is EVICT's rule.

Ours beyond vLLM's rule, because the drafting is paid before k is chosen (on a small target the head's passes are a
large part of a step): a sequence drafts only where a step of the configured tree could beat AR steps at the
batch's prices if every drafted token on its path were accepted, where that could repay the head's catch-up over the
tokens it has not seen, and not for a while (`_decline.Backoff`) after its steps gave fewer tokens per second than
AR steps would have (what each step produced over its drafting and verify pass at the batch's prices, averaged half
each step), as EcoSpec-Adaptive declines. A sequence that drafts nothing verifies its root alone."""

from ecospec.methods import MethodSpec, Session, register
from ecospec.methods._decline import Backoff, best_gain, repays
from ecospec.methods._greedy import by_probability
from ecospec.methods._rate import best_prefix, drafted_seconds


class VerifySession(Session):
    """Whether a sequence drafts this step (the module docstring); what it verifies is the batch's rule's."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.backoff, self.drafting, self._gains, self.ratio = Backoff(), False, (None, 0.0), None

    def shape(self, behind: int = 0, left: int | None = None) -> tuple[int, int]:
        self.drafting = False
        if self.cost is None:  # asked only for its shapes
            return self.depth, self.topk
        if self.backoff.waiting():
            return 0, self.topk
        if self._gains[0] != id(self.cost):  # the batch's prices change with its size: priced once per profile
            self._gains = (id(self.cost), best_gain(self.cost, self.depth, self.gamma))
        gain = self._gains[1]
        if gain <= 0 or not repays(self.cost, gain, behind, left, self.gamma):
            return 0, self.topk
        self.drafting = True
        return self.depth, self.topk

    def observe(self, accepted: int, verified: int) -> None:
        """After a step it drafted for: what the step gave against AR steps at the batch's prices (its tokens over
        its drafting and verify pass), averaged with the steps before it (half each step); below AR's, it backs
        off."""
        if not self.drafting:
            return
        drafted = drafted_seconds(self.cost, self.depth, "tree")
        ratio = accepted * self.cost.ar_step_s / self.cost.t_step(drafted, verified)
        self.ratio = ratio if self.ratio is None else (self.ratio + ratio) / 2
        (self.backoff.paid if self.ratio >= 1.0 else self.backoff.lost)()


def global_top_k(cost, trees, budget: int) -> list[list[int]]:
    """Each sequence's chosen nodes: the prefix of the batch's survival order with the best rate (each sequence
    at most `budget` nodes)."""
    order = sorted(
        ((t.probs[i], t.depths[i], b, i) for b, t in enumerate(trees) for i in range(len(t))),
        key=lambda c: (-c[0], c[1], c[2], c[3]),  # ties: shallower, then sequence, then node: parents first
    )
    taken: list[set[int]] = [set() for _ in trees]
    picks = []
    for p, _, b, i in order:
        parent = trees[b].parents[i]
        if len(taken[b]) < budget and (parent < 0 or parent in taken[b]):
            taken[b].add(i)
            picks.append((b, i, p))
    rows = len(trees)
    drafted = cost.overhead_s + cost.t_draft(rows, max(max(t.depths, default=0) for t in trees))
    sizes, seconds = [1] * rows, [drafted + cost.t_batch(rows, 1)]
    for b, _, _ in picks:
        sizes[b] += 1
        seconds.append(drafted + cost.t_batch(rows, max(sizes)))
    n, _ = best_prefix([p for _, _, p in picks], seconds, base=rows)
    chosen: list[list[int]] = [[] for _ in trees]
    for b, i, _ in picks[:n]:
        chosen[b].append(i)
    return [sorted(c) for c in chosen]


SPEC = register(
    MethodSpec(
        name="adaptive_verify",
        label="Adaptive verify",
        colour="tab:olive",
        role="adaptive_verify",
        predictor=None,
        buffered=False,
        rule=by_probability,
        adaptive=True,
        order=36,
        cost_model=True,
        batch_rule=global_top_k,
        session=VerifySession,
    )
)
