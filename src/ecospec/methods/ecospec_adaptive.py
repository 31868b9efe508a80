"""ecospec_adaptive: EcoSpec's marginal-expert selection priced in seconds by the verify-cost profile (ours).

Frontier-greedy like EcoSpec's Alg. 1, but a node's score is P over what verifying it adds to the pass on this
engine: one token's seconds plus its predicted experts not yet in the buffer, each at the profile's seconds per
unique expert per layer. Every prefix of that order is priced as a whole step (the loop's overhead, the drafting and
predicting done, the verify pass of its tokens and its buffer's experts) and the prefix with the most expected
tokens per second is verified; none makes the step an AR step. Three more decisions, each from the same rate:
- the predictor runs only where its pass costs less than the most it can save (every expert a full block may add,
  at the profile's price); without it a block's experts are the profile's expectation for its size;
- it drafts only depths that could beat an AR step if every drafted token were accepted (none: it never drafts),
  and the next step drafts the depth whose subtree of this step's tree had the best rate (one deeper when the
  deepest drafted was best, up to the configured depth);
- when the best rate, both this step's and its average over the prompt's drafting steps (an exponential average,
  half each step), is below an AR step's, the next steps draft nothing (`_decline.Backoff`: 8, then 64, ... until a
  step pays again): the method declines to speculate where it does not pay;
- a step drafts only where drafting could repay what it costs to start: before it drafts, the head (and the
  predictor) run over every token they have not seen (the prompt at the first step, the tokens of the steps that
  drafted nothing since), priced by the profile's `t_catchup`; at best each step left in the prompt gains what a
  step of the depth it would draft gains over AR steps when every drafted token is accepted, and a catch-up those
  steps cannot repay is not started.
The expected tokens are 1 + the sum of c_d x P over the verified nodes, c_d the prompt's own calibration at the node's
depth d so far: how often its speculative steps' accepted paths reached depth d over the P they put there (`PRIOR`
steps of trust in P to start). The drafter's P is fitted to greedy acceptance over all depths; deep nodes and
sampling accept less, and c_d learns how much less."""

from ecospec.methods import Candidates, MethodSpec, Session, method, register
from ecospec.methods._candidates import candidates
from ecospec.methods._decline import Backoff, best_gain, repays
from ecospec.methods._greedy import greedy_buffered, picks_buffered, picks_static
from ecospec.methods._rate import best_prefix, drafted_seconds

PRIOR = 2.0  # the calibration at each depth starts from this much expected acceptance, accepted as expected


class AdaptiveSession(Session):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.backoff, self.next_depth, self.rate = Backoff(), self.depth, None
        self._gains: tuple = (None, 0.0)  # (profile, depth, predicting) -> a step's best gain per token produced
        # the calibration's sums per depth (index d - 1), and this step's P per depth
        self.expected, self.reached, self.pending = [PRIOR] * self.depth, [PRIOR] * self.depth, [0.0] * self.depth
        cost = self.cost  # None when asked only for its shapes
        if cost is None:
            self.predicting, self.depths = True, tuple(range(1, self.depth + 1))
            return
        saving = cost.per_expert_layer_s * cost.layers * (cost.experts(self.gamma) - cost.experts(1))
        self.predicting = (cost.predictor_pass_s or 0.0) < saving
        self.depths = tuple(d for d in range(1, self.depth + 1) if self._gain(d) > 0)
        self.next_depth = self.depths[-1] if self.depths else 0

    def _gain(self, depth: int) -> float:
        return best_gain(self.cost, depth, self.gamma, self.predicting)

    @property
    def draft_depths(self) -> tuple[int, ...]:
        return tuple(range(1, self.depth + 1))

    @property
    def wants_experts(self) -> bool:
        return self.predicting

    def shape(self, behind: int = 0, left: int | None = None) -> tuple[int, int]:
        if self.backoff.waiting() or not self.next_depth:
            return 0, self.topk
        if not self._repays(behind, left):
            return 0, self.topk
        return self.next_depth, self.topk

    def _repays(self, behind: int, left: int | None) -> bool:
        """Whether drafting now could repay its catch-up over the `behind` unseen tokens (`shape`)."""
        if self.cost is None:
            return True
        key = (id(self.cost), self.next_depth, self.predicting)  # a step's best gain: priced once per profile and depth
        if self._gains[0] != key:
            self._gains = (key, self._gain(self.next_depth))
        return repays(self.cost, self._gains[1], behind, left, self.gamma, self.predicting)

    def choose(self, tree, experts, root_experts, budget: int) -> list[int]:
        if self.predicting:
            c = candidates(self.spec, tree.parents, tree.probs, experts, root_experts)
        else:  # no expert sets: the tree as a rule without them sees it
            c = candidates(method("confidence"), tree.parents, tree.probs, None)
        drawn = max(tree.depths)
        rates = {d: self._best(c, budget, d) for d in range(1, drawn + 1)}
        order, n, rate = rates[drawn]
        self.pending = [sum(c.probs[i] for i in order[:n] if c.depth[i] == d) for d in range(1, self.depth + 1)]
        feasible = [d for d in rates if d in self.depths] or [drawn]
        best = max(feasible, key=lambda d: (rates[d][2], -d))
        deeper = [d for d in self.depths if d > drawn]
        self.next_depth = deeper[0] if best == drawn and deeper else best
        best_rate = max(r for _, _, r in rates.values())
        self.rate = best_rate if self.rate is None else (self.rate + best_rate) / 2
        if max(self.rate, best_rate) * self.cost.ar_step_s < 1.0:  # slower than AR at every depth, now and lately
            self.backoff.lost()
        else:
            self.backoff.paid()
        return sorted(order[:n])

    def observe(self, accepted: int, verified: int) -> None:
        if verified > 1:  # a speculative step: where its P expected the accepted path to reach, and where it did
            for d in range(self.depth):
                if self.pending[d]:
                    self.expected[d] += self.pending[d]
                    self.reached[d] += accepted - 1 > d
        self.pending = [0.0] * self.depth

    def _best(self, c: Candidates, budget: int, depth: int) -> tuple[list[int], int, float]:
        """(the pick order, its best prefix, that prefix's rate) of the subtree of `c` down to `depth`, priced as
        a step that drafted `depth` levels."""
        cost = self.cost
        sub = Candidates(
            c.parents,
            c.probs,
            c.depth,
            c.roots,
            [[j for j in ch if c.depth[j] <= depth] for ch in c.children],
            c.traj,
            c.buffer,
            c.eps,
        )
        drafted = drafted_seconds(cost, depth, "tree", predictor=self.predicting)
        if self.predicting:
            order, buffers = picks_buffered(sub, budget, cost.per_token_s, cost.per_expert_layer_s)
            seconds = [cost.t_step(drafted, n + 1, b.bit_count() / cost.layers) for n, b in enumerate(buffers)]
        else:
            order = picks_static(sub, sub.probs, budget)
            seconds = [cost.t_step(drafted, n + 1) for n in range(len(order) + 1)]
        calib = [r / e for r, e in zip(self.reached, self.expected, strict=True)]
        n, rate = best_prefix([calib[c.depth[i] - 1] * c.probs[i] for i in order], seconds)
        return order, n, rate


SPEC = register(
    MethodSpec(
        name="ecospec_adaptive",
        label="EcoSpec-Adaptive",
        colour="tab:brown",
        role="ecospec_adaptive",
        predictor="learned",
        buffered=True,
        rule=greedy_buffered,
        adaptive=True,
        rivals=("ecospec", "evict"),  # the static method it adapts, and the adaptive rule it must at least match
        order=35,
        cost_model=True,
        session=AdaptiveSession,
    )
)
