"""chain: the EAGLE-3 head drafting a chain, γ − 1 single-row head passes, each taking its top-1 token, all verified:
speculative decoding as vLLM, SGLang and MLPerf's GPT-OSS-120B interactive scenario deploy it (not the top-1 path
picked from the usual tree: the head drafts only the chain)."""

from ecospec.methods import CHAIN, MethodSpec, Session, register
from ecospec.methods._greedy import by_probability


class ChainSession(Session):
    @property
    def draft_shape(self) -> tuple[int, int]:
        return self.gamma - 1, 1

    def shape(self, behind: int = 0, left: int | None = None) -> tuple[int, int]:
        return self.draft_shape


SPEC = register(
    MethodSpec(
        name="chain",
        label="Chain",
        colour="tab:olive",
        role="chain",
        predictor=None,
        buffered=False,
        rule=by_probability,
        session=ChainSession,
        drafts=CHAIN,
        order=15,
    )
)
