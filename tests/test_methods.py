"""The method interface (ecospec.methods): per step a session says how much to draft (depth 0: none), which nodes to
verify (none: an AR step) and hears what the step produced; the registry's rules choose what `ecospec.select`
chooses. Whatever a method decides, greedy decoding stays token-exact against AR, eager and with an EAGLE-3 head
(whose hidden states pile up while a step drafts nothing)."""

import pytest
import torch
from conftest import eagle3_drafter

import ecospec
from ecospec.drafters.draft_model import DraftModelDrafter
from ecospec.methods import MethodSpec, Session, method, methods, names
from ecospec.models import perturbed_copy, tiny_model


class Sometimes(Session):
    """Drafts nothing every third step, verifies the root alone every fourth, else the default."""

    def __init__(self, *args):
        super().__init__(*args)
        self.step, self.seen = 0, []

    def shape(self, behind=0, left=None):
        self.step += 1
        return (0, self.topk) if self.step % 3 == 0 else (self.depth, self.topk)

    def choose(self, tree, experts, root_experts, budget):
        return [] if self.step % 4 == 0 else super().choose(tree, experts, root_experts, budget)

    def observe(self, accepted, verified):
        self.seen.append((accepted, verified))


def _sometimes():
    base = method("confidence")
    return MethodSpec(
        name="sometimes",
        label="Sometimes",
        colour="k",
        role="sometimes",
        predictor=None,
        buffered=False,
        rule=base.rule,
        session=Sometimes,
    )


def test_the_registry_is_the_selectors_and_says_what_each_needs():
    assert names() == (
        "confidence",
        "chain",
        "global_cost",
        "ecospec",
        "evict",
        "cascade",
        "ecospec_adaptive",
        "adaptive_verify",
        "oracle",
    )
    assert {m.name: m.predictor for m in methods()} == {
        "confidence": None,
        "chain": None,
        "global_cost": "learned",
        "ecospec": "learned",
        "evict": None,
        "cascade": None,
        "ecospec_adaptive": "learned",
        "adaptive_verify": None,
        "oracle": "oracle",
    }
    assert [m.name for m in methods() if m.buffered] == ["ecospec", "ecospec_adaptive", "oracle"]
    assert [m.name for m in methods() if m.cost_model] == ["evict", "cascade", "ecospec_adaptive", "adaptive_verify"]
    with pytest.raises(ValueError, match="unknown policy 'nope'; allowed: confidence, chain, global_cost"):
        method("nope")


@pytest.mark.parametrize("head", [False, True])
def test_a_session_that_skips_drafting_and_verifying_stays_lossless(monkeypatch, head):
    import ecospec.methods as registry

    names()  # the registry is filled before the toy joins it, and the toy leaves with the test
    monkeypatch.setitem(registry._REGISTRY, "sometimes", _sometimes())
    target = tiny_model("qwen3_moe-a", seed=0, dtype=torch.float64)
    cfg = target.config
    if head:
        drafter = eagle3_drafter(target)
    else:
        drafter = DraftModelDrafter(perturbed_copy(target, 0.05, seed=1))
    ids = torch.randint(3, cfg.vocab_size, (1, 14), generator=torch.Generator().manual_seed(5))
    ar = ecospec.generate(target, ids, max_new_tokens=24, eos_token_id=[])
    res = ecospec.generate(
        target, ids, drafter=drafter, selector="sometimes", gamma=4, max_new_tokens=24, eos_token_id=[]
    )
    assert res.tokens == ar.tokens
    assert sum(st.verified == 1 for st in res.steps) >= 3  # the AR steps the session asked for
    assert any(st.verified > 1 for st in res.steps)


def test_the_chain_drafts_gamma_minus_one_single_rows_and_verifies_them_all():
    """eagle3_chain: each step's block is a chain of γ − 1 drafted tokens (one head pass each), greedy-exact
    against AR, and its per-position acceptance equals vLLM's definition (every step drafts every position)."""
    from ecospec.experiment.metrics import acceptance_by_position, positions

    target = tiny_model("qwen3_moe-a", seed=0, dtype=torch.float64)
    ids = torch.randint(3, target.config.vocab_size, (1, 14), generator=torch.Generator().manual_seed(5))
    ar = ecospec.generate(target, ids, max_new_tokens=24, eos_token_id=[])
    res = ecospec.generate(
        target,
        ids,
        drafter=eagle3_drafter(target),
        selector="chain",
        gamma=5,
        max_new_tokens=24,
        eos_token_id=[],
        trace=True,
    )
    assert res.tokens == ar.tokens
    for st in res.steps:
        assert st.drafted_depth == 4 and st.trace.parents == [-1, 0, 1, 2, 3] and st.trace.depths == [0, 1, 2, 3, 4]
    acc = acceptance_by_position([positions(res.steps)])
    n = len(res.steps)
    assert acc == [sum(st.accepted - 1 >= i for st in res.steps) / n for i in range(1, 5)]


@pytest.mark.compiled
def test_the_chain_decodes_compiled_as_eager():
    target = tiny_model("qwen3_moe-a", seed=0, dtype=torch.float64)
    drafter = eagle3_drafter(target)
    ids = torch.randint(3, target.config.vocab_size, (1, 14), generator=torch.Generator().manual_seed(5))
    kw = dict(drafter=drafter, selector="chain", gamma=5, max_new_tokens=24, eos_token_id=[])
    eager = ecospec.generate(target, ids, **kw)
    compiled = ecospec.generate(target, ids, engine="compiled", **kw)
    assert compiled.tokens == eager.tokens
    assert [st.accepted for st in compiled.steps] == [st.accepted for st in eager.steps]
