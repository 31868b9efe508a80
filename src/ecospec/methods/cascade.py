"""cascade: Cascade (Saxena et al., "Utility-Driven Speculative Decoding for Mixture-of-Experts", arXiv
2506.20675): the EAGLE-3 head drafts a chain of K tokens, all verified, and a per-prompt controller sets K.

Speculation utility U(K) = tokens a step produces at K x the AR step's time / the step's time at K (U is the
speedup over AR; U(0) = 1). Test phases try K for `TEST_STEPS` steps each, hill-climbing from the best K the prompt
has seen (1 at first) for at most `MAX_TRIALS` trials: up while U rises, stop when it falls, when two trials are
within `CLOSE` of each other, or at the ends of 1 .. γ - 1; a first trial below U = 1 steps down, and K = 1 below 1
ends the test. The set phase runs the best K for `SET_STEPS` steps; when the best U is below 1 it runs K = 0 (no
drafting) instead, for twice as long as the last K = 0 set phase (exponential back-off), then tests again. Times
come from the verify-cost profile for the passes the step ran (K chain head passes, a verify pass of K + 1 tokens
with the experts a block that size routes to), so two runs decide alike. Phase lengths and the 10 % are the paper's
as secondary summaries of its full text give them (docs/methods.md)."""

from ecospec.methods import MethodSpec, Session, register
from ecospec.methods._greedy import by_probability
from ecospec.methods._rate import drafted_seconds

TEST_STEPS, MAX_TRIALS, SET_STEPS, CLOSE = 4, 4, 16, 0.10


class CascadeSession(Session):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.best: dict[int, float] = {}  # K -> its utility in this prompt's last test of it
        self.off_steps = SET_STEPS // 2  # the last K = 0 set phase's length (doubled before each new one)
        self._test(self._start())

    @property
    def draft_shape(self) -> tuple[int, int]:
        return self.gamma - 1, 1

    @property
    def draft_depths(self) -> tuple[int, ...]:
        return tuple(range(1, self.gamma))

    def shape(self, behind: int = 0, left: int | None = None) -> tuple[int, int]:
        return self.k, 1

    def observe(self, accepted: int, verified: int) -> None:
        self.tokens += accepted
        self.left -= 1
        if self.left:
            return
        if not self.testing:
            self._test(self._start())
            return
        u = self.utility(self.k, self.tokens / TEST_STEPS)
        self.trials.append((self.k, u))
        self.best[self.k] = u
        nxt = self._next()
        if nxt is not None:
            self._window(nxt, TEST_STEPS)
            return
        k, u = max(self.trials, key=lambda t: (t[1], -t[0]))
        if u < 1.0:
            self.off_steps *= 2
            self._window(0, self.off_steps)
        else:
            self._window(k, SET_STEPS)
        self.testing = False

    def utility(self, k: int, tokens_per_step: float) -> float:
        cost = self.cost
        return tokens_per_step * cost.ar_step_s / cost.t_step(drafted_seconds(cost, k, "chain"), k + 1)

    def _start(self) -> int:
        return max(self.best, key=lambda k: (self.best[k], -k)) if self.best else 1

    def _test(self, k: int) -> None:
        self.testing, self.trials = True, []
        self._window(k, TEST_STEPS)

    def _window(self, k: int, steps: int) -> None:
        self.k, self.left, self.tokens = k, steps, 0

    def _next(self) -> int | None:
        """The next K to test, or None to end the test."""
        k, u = self.trials[-1]
        if len(self.trials) >= MAX_TRIALS:
            return None
        if len(self.trials) == 1:
            step = 1 if u >= 1.0 else -1
        else:
            pk, pu = self.trials[-2]
            if u <= pu or abs(u - pu) <= CLOSE * pu:  # past the top, or flat: the best so far stands
                return None
            step = k - pk
        nxt = k + step
        tried = {t for t, _ in self.trials}
        return nxt if 1 <= nxt <= self.gamma - 1 and nxt not in tried else None


SPEC = register(
    MethodSpec(
        name="cascade",
        label="Cascade",
        colour="tab:pink",
        role="cascade",
        predictor=None,
        buffered=False,
        rule=by_probability,
        adaptive=True,
        order=33,
        cost_model=True,
        session=CascadeSession,
    )
)
