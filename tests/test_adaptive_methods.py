"""The methods that price a step in seconds with the verify-cost profile (EVICT, Cascade, EcoSpec-Adaptive,
adaptive_verify): their
decisions follow their rules, they stay token-exact against AR whatever they decide (eager here, compiled under
the `compiled` marker), and one without a profile is told how to make one."""

from dataclasses import replace

import pytest
import torch

import ecospec
from ecospec.analysis.verify_profile import VerifyProfile
from ecospec.drafters.draft_model import DraftModelDrafter
from ecospec.methods import method
from ecospec.methods._decline import FIRST_SKIP, best_gain
from ecospec.methods._rate import best_prefix
from ecospec.methods.cascade import SET_STEPS, TEST_STEPS
from ecospec.models import perturbed_copy, tiny_model

ADAPTIVE = ("evict", "cascade", "ecospec_adaptive")


def profile(per_expert: float, overhead: float = 0.001, layers: int = 2, batch=None) -> VerifyProfile:
    """A made-up profile: `per_expert` decides whether a wider block pays; `batch`: its `verify_by_batch`."""
    return VerifyProfile(
        model="t",
        engine="eager",
        dtype="float64",
        processor="x",
        layers=layers,
        intercept_s=0.002,
        per_token_s=0.0002,
        per_expert_layer_s=per_expert,
        r2=1.0,
        points=5,
        ar_step_s=0.0024 + overhead + 0.0003,
        overhead_s=overhead,
        draft_pass_s={"tree": 0.0003, "chain": 0.0002},
        predictor_pass_s=0.0002,
        experts_by_tokens={str(t): min(8.0, 2.0 * t) for t in range(1, 9)},
        source="test",
        verify_by_batch=batch,
    )


CHEAP, DEAR = profile(1e-6, overhead=0.01), profile(2e-3)  # a big per-step overhead favours big blocks


@pytest.fixture(scope="module")
def pair():
    target = tiny_model("qwen3_moe-a", seed=0, dtype=torch.float64)
    ids = torch.randint(3, target.config.vocab_size, (1, 14), generator=torch.Generator().manual_seed(5))
    return target, DraftModelDrafter(perturbed_copy(target, 0.02, seed=1)), ids


@pytest.mark.parametrize("selector", ADAPTIVE)
def test_greedy_is_token_exact_whatever_the_profile_decides(pair, selector):
    target, drafter, ids = pair
    ar = ecospec.generate(target, ids, max_new_tokens=40, eos_token_id=[])
    kw = dict(drafter=drafter, selector=selector, gamma=6, max_new_tokens=40, eos_token_id=[])
    if method(selector).predictor:
        kw["predictor"] = "oracle"
    cheap = ecospec.generate(target, ids, profile=CHEAP, **kw)
    dear = ecospec.generate(target, ids, profile=DEAR, **kw)
    assert cheap.tokens == ar.tokens and dear.tokens == ar.tokens
    spec = lambda res: sum(st.verified > 1 for st in res.steps) / len(res.steps)  # noqa: E731
    assert spec(cheap) > 0.5, "verifying is nearly free: the method should speculate on most steps"
    assert spec(dear) < spec(cheap), "a dear expert should make the method speculate less"
    assert max(st.verified for st in cheap.steps) <= 6


def test_a_method_that_prices_passes_needs_a_profile(pair):
    target, drafter, ids = pair
    with pytest.raises(ValueError, match="selector 'evict' prices passes in seconds.*python -m ecospec.bench.profile"):
        ecospec.generate(target, ids, drafter=drafter, selector="evict", max_new_tokens=4)


def test_best_prefix_maximises_expected_tokens_per_second():
    # P = 0.9, 0.5, 0.1: tokens 1, 1.9, 2.4, 2.5 over 1, 1.2, 1.5, 2.0 s -> rates 1, 1.583, 1.6, 1.25
    assert best_prefix([0.9, 0.5, 0.1], [1.0, 1.2, 1.5, 2.0]) == (2, pytest.approx(1.6))
    assert best_prefix([0.1], [1.0, 1.5])[0] == 0  # not worth a token: an AR step


def test_evict_verifies_the_best_prefix_of_the_best_first_order():
    """A tree whose best-first order is 0, 2, 1 (P 0.9, 0.6, 0.3): EVICT prices each prefix with the profile's
    expected experts for its size and takes the one with the most expected tokens per second."""
    from ecospec.engine.tree import DraftTree

    tree = DraftTree(tokens=[5, 6, 7], parents=[-1, -1, 0], probs=[0.9, 0.3, 0.6], depths=[1, 1, 2])
    for prof in (CHEAP, DEAR):
        session = method("evict").open(6, 2, 2, prof)
        drafted = 2 * prof.draft_pass_s["tree"]
        rates = [(1 + sum([0.9, 0.6, 0.3][:n])) / prof.t_step(drafted, n + 1) for n in range(4)]
        n = max(range(4), key=lambda i: (rates[i], -i))
        assert session.choose(tree, None, None, 5) == sorted([0, 2, 1][:n])
    assert method("evict").open(6, 2, 2, CHEAP).choose(tree, None, None, 5) == [0, 1, 2]
    assert method("evict").open(6, 2, 2, DEAR).choose(tree, None, None, 5) == [0]  # the sure node only


def test_cascade_tests_then_sets_and_backs_off_when_speculation_does_not_pay():
    """Scripted steps: every drafted token accepted under the cheap profile (utility grows with K: the test climbs
    to its trial limit and sets the best K), nothing accepted under the dear one (K = 1 below 1: K = 0 for a set
    phase, twice as long the next time)."""
    s = method("cascade").open(6, 3, 2, CHEAP)
    ks = []
    for _ in range(4 * TEST_STEPS + SET_STEPS):
        k, _ = s.shape()
        ks.append(k)
        s.observe(k + 1, k + 1)
    assert ks == [1] * 4 + [2] * 4 + [3] * 4 + [4] * 4 + [4] * SET_STEPS

    s = method("cascade").open(6, 3, 2, DEAR)
    ks = []
    for _ in range(TEST_STEPS + SET_STEPS + TEST_STEPS + 2 * SET_STEPS + 1):
        k, _ = s.shape()
        ks.append(k)
        s.observe(1, k + 1)
    assert ks == [1] * 4 + [0] * SET_STEPS + [1] * 4 + [0] * (2 * SET_STEPS) + [1]


def test_adaptive_stops_drafting_while_speculation_does_not_pay(pair):
    """Under the dear profile EcoSpec-Adaptive's best block is slower than AR, so it drafts nothing for 1, 2, 4 ...
    steps: most steps draft no tree at all."""
    target, drafter, ids = pair
    res = ecospec.generate(
        target,
        ids,
        drafter=drafter,
        selector="ecospec_adaptive",
        predictor="oracle",
        gamma=6,
        max_new_tokens=40,
        eos_token_id=[],
        profile=DEAR,
    )
    undrafted = sum(st.drafted_depth == 0 for st in res.steps)
    assert undrafted > len(res.steps) / 2


def test_adaptive_starts_drafting_only_where_it_can_repay_the_catch_up(pair):
    """Before it drafts, the head (and the predictor) run over every token they have not seen: EcoSpec-Adaptive
    starts where the best case of the tokens left repays that catch-up (the profile's `t_catchup`), and where it
    cannot, it drafts nothing at all; a catch-up within a step's own γ tokens costs nothing extra."""
    from ecospec.methods._rate import drafted_seconds

    cheap = replace(CHEAP, catchup={"head": [0.0, 1e-4], "predictor": [0.0, 0.0]})
    session = method("ecospec_adaptive").open(6, 3, 2, cheap)
    d = session.next_depth
    assert d and cheap.t_catchup(6, 6) == 0.0 and cheap.t_catchup(100, 6) == pytest.approx(0.01)
    path = min(d, 5)
    gain = (1 + path) * cheap.ar_step_s - cheap.t_step(drafted_seconds(cheap, d, "tree", session.predicting), path + 1)
    enough = int(0.01 / gain * (1 + path)) + 1 + path  # tokens left whose best case repays 100 tokens' catch-up
    assert session.shape(behind=100, left=enough) == (d, 2)
    assert session.shape(behind=100, left=enough - 2 - path)[0] == 0
    assert session.shape(behind=6, left=1) == (d, 2) and session.shape(behind=100, left=None) == (d, 2)

    target, drafter, ids = pair  # a catch-up no prompt can repay: the decode never drafts, and is AR's
    never = replace(CHEAP, catchup={"head": [1.0, 0.0]})
    kw = dict(gamma=6, max_new_tokens=20, eos_token_id=[])
    res = ecospec.generate(
        target, ids, drafter=drafter, selector="ecospec_adaptive", predictor="oracle", profile=never, **kw
    )
    assert all(st.drafted_depth == 0 for st in res.steps)
    assert res.tokens == ecospec.generate(target, ids, **kw).tokens


@pytest.mark.compiled
@pytest.mark.parametrize("selector", ADAPTIVE)
def test_adaptive_methods_decode_compiled_as_eager(selector):
    from conftest import eagle3_drafter

    target = tiny_model("qwen3_moe-a", seed=0, dtype=torch.float64)
    drafter = eagle3_drafter(target)
    ids = torch.randint(3, target.config.vocab_size, (1, 14), generator=torch.Generator().manual_seed(5))
    kw = dict(drafter=drafter, selector=selector, gamma=5, max_new_tokens=24, eos_token_id=[], profile=CHEAP)
    if method(selector).predictor:
        kw["predictor"] = "oracle"
    eager = ecospec.generate(target, ids, **kw)
    compiled = ecospec.generate(target, ids, engine="compiled", **kw)
    assert compiled.tokens == eager.tokens
    assert [st.verified for st in compiled.steps] == [st.verified for st in eager.steps]


@pytest.mark.parametrize("selector", ADAPTIVE)
def test_each_sequence_of_a_batch_decides_its_own_steps(pair, selector):
    """At B > 1 every sequence keeps its own session: its tokens equal AR's and its steps (drafted depth, block,
    tokens produced) equal `generate`'s on its prompt alone, though the batch drafts to its deepest row each step
    (EVICT drafts the configured tree every step; EcoSpec-Adaptive's rows keep in step here)."""
    target, drafter, _ = pair
    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, target.config.vocab_size, (n,), generator=gen) for n in (14, 9, 20)]
    kw = dict(drafter=drafter, selector=selector, gamma=6, max_new_tokens=30, eos_token_id=[])
    if method(selector).predictor:
        kw["predictor"] = "oracle"
    steps = lambda res: [(st.drafted_depth, st.verified, st.accepted) for st in res.steps]  # noqa: E731
    mixed = False
    for prof in (CHEAP, profile(2e-4), DEAR):
        got = ecospec.generate_batch(target, prompts, profile=prof, **kw)
        for p, res in zip(prompts, got.results, strict=True):
            alone = ecospec.generate(target, p[None], profile=prof, **kw)
            assert (
                res.tokens
                == alone.tokens
                == ecospec.generate(target, p[None], max_new_tokens=30, eos_token_id=[]).tokens
            )
            assert steps(res) == steps(alone)
        together = min(len(r.steps) for r in got.results)  # every sequence was in the first passes
        mixed |= any(len({r.steps[j].drafted_depth for r in got.results}) > 1 for j in range(together))
    if selector == "cascade":  # sets each sequence's draft length from its own acceptance
        assert mixed, "the batch never drafted rows to different depths in one pass"


def test_adaptive_verify_takes_the_batch_global_top_k_at_its_best_rate():
    """The batch's nodes ranked together by P: a sequence with likelier nodes gets more of the k, each within its
    budget and prefix-closed, and k is the prefix of that order with the most expected tokens per second (every
    prefix priced, as a brute force over k checks)."""
    from ecospec.engine.tree import DraftTree
    from ecospec.methods.adaptive_verify import global_top_k

    def chain(*probs):
        t, parent, p = DraftTree(), -1, 1.0
        for q in probs:
            p *= q
            parent = t.add(7, parent, p)
        return t

    trees = [chain(0.9, 0.9, 0.9, 0.9), chain(0.3, 0.5), chain(0.95, 0.2, 0.9)]
    # the order: P 0.95 (sequence 2), 0.9, 0.81, 0.729 (sequence 0, its budget of 3 then spent), 0.3 (1), 0.19,
    # 0.171 (2), 0.15 (1); each pick's block sizes (the batch pays for its longest)
    order = [(2, 0.95), (0, 0.9), (0, 0.81), (0, 0.729), (1, 0.3), (2, 0.19), (2, 0.171), (1, 0.15)]
    longest = [2, 2, 3, 4, 4, 4, 4, 4]
    # two tokens a sequence cost little more than one; three cost a lot
    batch = profile(1e-6, 0.01, batch={"3": {"1": [0.003, 8.0], "2": [0.0035, 9.0], "3": [0.02, 10], "4": [0.03, 11]}})
    drafted = 0.01 + 4 * 0.0003  # the loop's overhead and four tree levels at the profile's head pass
    seconds = [drafted + batch.t_batch(3, q) for q in [1, *longest]]
    n, _ = best_prefix([p for _, p in order], seconds, base=3)
    assert n == 2 and global_top_k(batch, trees, budget=3) == [[0], [], [0]]
    cheap = profile(1e-6, 0.01, batch={"3": {str(q): [0.003 + 0.0001 * q, 8.0] for q in range(1, 6)}})
    assert global_top_k(cheap, trees, budget=3) == [[0, 1, 2], [0, 1], [0, 1, 2]]  # every node, 3 at most each
    dear = profile(1e-6, 0.0, batch={"3": {str(q): [0.003 * q, 8.0] for q in range(1, 6)}})
    assert global_top_k(dear, trees, budget=3) == [[], [], []]  # every token costs an AR step: AR pays best


MID = profile(2e-4)  # a fully accepted tree would pay; EVICT's priced choice mostly verifies the root alone


@pytest.mark.parametrize("prof", [CHEAP, MID, DEAR], ids=["cheap", "mid", "dear"])
def test_adaptive_verify_is_evict_alone_and_lossless_in_a_batch(pair, prof):
    """Alone its first step is EVICT's. Where a step gives less than AR steps would (one that verifies its root
    alone always does) it drafts nothing for the next `FIRST_SKIP` steps (EVICT drafts on), and where even a fully
    accepted tree would lose to AR steps it never drafts. In a batch every sequence's tokens are AR's."""
    target, drafter, _ = pair
    gen = torch.Generator().manual_seed(9)
    prompts = [torch.randint(3, target.config.vocab_size, (n,), generator=gen) for n in (14, 9, 20)]
    kw = dict(drafter=drafter, gamma=6, max_new_tokens=30, eos_token_id=[], profile=prof)
    steps = lambda res: [(st.drafted_depth, st.verified, st.accepted) for st in res.steps]  # noqa: E731
    alone = steps(ecospec.generate(target, prompts[0][None], selector="adaptive_verify", **kw))
    evict = steps(ecospec.generate(target, prompts[0][None], selector="evict", **kw))
    if prof is CHEAP:  # steps pay: EVICT's first step, and it drafts on most
        assert alone[0] == evict[0] and sum(d > 0 for d, _, _ in alone) > len(alone) / 2
    elif prof is MID:
        assert best_gain(prof, 3, 6) > 0 and alone[0] == evict[0] == (3, 1, 1)
        assert all(d == 0 for d, _, _ in alone[1 : 1 + FIRST_SKIP]) and alone[1 + FIRST_SKIP][0] == 3
        assert all(d == 3 for d, _, _ in evict)
    else:
        assert best_gain(prof, 3, 6) <= 0 and all(d == 0 for d, _, _ in alone)
    got = ecospec.generate_batch(target, prompts, selector="adaptive_verify", **kw)
    for p, res in zip(prompts, got.results, strict=True):
        assert res.tokens == ecospec.generate(target, p[None], max_new_tokens=30, eos_token_id=[]).tokens
    speculating = sum(s.verified > s.sequences for s in got.steps) / len(got.steps)
    assert speculating >= 0.4 if prof is CHEAP else speculating < 0.2  # the profile decides how much it drafts


def test_adaptive_verify_backs_off_where_its_steps_gave_less_than_ar():
    """What a drafted step gave (its tokens over its drafting and verify pass, against AR steps), averaged half each
    step: below AR's, the next `FIRST_SKIP` steps draft nothing; a step well above keeps it drafting."""
    from ecospec.methods.adaptive_verify import VerifySession

    s = VerifySession(method("adaptive_verify"), 6, 3, 2, CHEAP)
    assert s.shape() == (3, 2)
    s.observe(accepted=5, verified=6)  # 5 tokens for about one AR step's time
    assert s.ratio > 1 and s.shape() == (3, 2)
    s.observe(accepted=1, verified=6)  # the average stays above AR's
    assert s.shape() == (3, 2)
    fresh = VerifySession(method("adaptive_verify"), 6, 3, 2, CHEAP)
    fresh.shape()
    fresh.observe(accepted=1, verified=6)  # one token for more than an AR step's time
    assert fresh.ratio < 1 and [fresh.shape()[0] for _ in range(FIRST_SKIP + 1)] == [0] * FIRST_SKIP + [3]


def test_adaptive_verify_prices_the_best_case_at_the_batch(pair):
    """The gate reads the batch's prices (`VerifyProfile.at_batch`): a tree that pays alone but whose every row
    token costs another batched pass drafts alone and never in the batch, and the batch's tokens stay AR's."""
    target, drafter, _ = pair
    per_token = {str(q): [0.03 if q == 1 else 0.04 * q, 8.0] for q in range(1, 7)}  # a row's token: a pass more
    prof = profile(1e-6, overhead=0.01, batch={"2": per_token, "3": per_token})
    assert best_gain(prof, 3, 6) > 0 >= best_gain(prof.at_batch(3), 3, 6)
    gen = torch.Generator().manual_seed(9)
    prompts = [torch.randint(3, target.config.vocab_size, (n,), generator=gen) for n in (14, 9, 20)]
    kw = dict(drafter=drafter, gamma=6, max_new_tokens=20, eos_token_id=[], profile=prof, selector="adaptive_verify")
    got = ecospec.generate_batch(target, prompts, **kw)
    assert all(s.verified == s.sequences for s in got.steps if s.sequences > 1)
    assert ecospec.generate(target, prompts[0][None], **kw).steps[0].drafted_depth == 3
    for p, res in zip(prompts, got.results, strict=True):
        assert res.tokens == ecospec.generate(target, p[None], max_new_tokens=20, eos_token_id=[]).tokens


def test_each_sequence_prices_the_batched_pass(pair):
    """At B > 1 a sequence's method prices its block as the batch's pass (`VerifyProfile.at_batch`): where the
    batch table makes every extra token a batch-wide AR pass, EVICT verifies the roots alone while sequences share
    the pass, yet speculates on the same prompt alone (batch-1 prices), and the tokens stay AR's."""
    target, drafter, _ = pair
    dear = {str(q): [0.03 * q, 8.0] for q in range(1, 7)}  # each token of a row costs another pass of 30 ms
    prof = profile(1e-6, overhead=0.01, batch={"2": dear, "3": dear})
    assert prof.at_batch(1) is prof and profile(1e-6).at_batch(3) == profile(1e-6)  # no table: batch-1 prices
    view = prof.at_batch(3)
    assert view.ar_step_s == pytest.approx(0.01 + 0.03) and view.t_step(0.0, 4) == pytest.approx(0.01 + 0.12)
    assert view.t_verify(2, prof.experts(2) + 1) == pytest.approx(0.06 + 1e-6 * 2)  # a row's extra expert
    shared = prof.at_batch(3, shared=True)  # one buffer for the batch: a row's choice sees the batch's experts
    assert shared.t_verify(2, 8.0) == pytest.approx(0.06) and shared.t_verify(2, 9.0) == pytest.approx(0.06 + 2e-6)
    gen = torch.Generator().manual_seed(9)
    prompts = [torch.randint(3, target.config.vocab_size, (n,), generator=gen) for n in (14, 9, 20)]
    kw = dict(drafter=drafter, selector="evict", gamma=6, max_new_tokens=30, eos_token_id=[], profile=prof)
    got = ecospec.generate_batch(target, prompts, **kw)
    shared = [s for s in got.steps if s.sequences > 1]
    assert shared and all(s.verified == s.sequences for s in shared)
    alone = ecospec.generate(target, prompts[0][None], **kw)
    assert sum(st.verified > 1 for st in alone.steps) > len(alone.steps) / 2
    for p, res in zip(prompts, got.results, strict=True):
        assert res.tokens == ecospec.generate(target, p[None], max_new_tokens=30, eos_token_id=[]).tokens


def test_ecospec_adaptive_shares_one_expert_buffer_across_the_batch(pair):
    """`batch_buffer="batch"`: each row's priced choice sees as loaded every root's experts and the earlier rows'
    picks (so an expert another sequence brings costs nothing); lossless, and each row still decides itself."""
    from ecospec.engine.tree import DraftTree
    from ecospec.methods._batch import shared_sessions

    seen = []

    class Spy:
        def choose(self, tree, experts, loaded, budget):
            seen.append(loaded)
            return list(range(min(budget, len(tree))))

    def chain(n):
        t, parent = DraftTree(), -1
        for _ in range(n):
            parent = t.add(5, parent, 0.5)
        return t

    experts = [[0b0001_0000, 0b0010_0000], [0b0100_0000], [0b1000_0000]]
    got = shared_sessions([Spy(), Spy(), Spy()], [chain(2), chain(1), chain(1)], experts, [0b1, 0b10, 0b100], 2)
    assert got == [[0, 1], [0], [0]]
    assert seen == [0b111, 0b0011_0111, 0b0111_0111]  # the roots, then each row's picks added
    target, drafter, _ = pair
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, target.config.vocab_size, (n,), generator=gen) for n in (14, 9, 20)]
    kw = dict(drafter=drafter, selector="ecospec_adaptive", predictor="oracle", gamma=6, max_new_tokens=24)
    batch = profile(2e-4, batch={"3": {str(q): [0.003 + 0.0002 * q, 10.0] for q in range(1, 7)}})
    res = ecospec.generate_batch(target, prompts, profile=batch, batch_buffer="batch", eos_token_id=[], **kw)
    for p, r in zip(prompts, res.results, strict=True):
        assert r.tokens == ecospec.generate(target, p[None], max_new_tokens=24, eos_token_id=[]).tokens
    assert any(s.verified > s.sequences for s in res.steps)


def test_a_batch_size_the_profile_did_not_measure_is_priced_on_the_line_in_batch_size():
    """Between measured batch sizes and beyond the largest, a pass is priced on the straight line in B through the
    nearest two (one sequence counting as measured); a head pass at the largest measured size below."""
    prof = profile(1e-6, batch={"2": {"1": [0.010, 6.0]}, "4": {"1": [0.014, 7.0]}, "8": {"1": [0.030, 9.0]}})
    prof = replace(prof, draft_by_batch={"2": 0.001, "8": 0.004})
    assert prof.t_batch(4, 1) == pytest.approx(0.014)
    assert prof.t_batch(6, 1) == pytest.approx(0.022)  # halfway between B = 4 and 8
    assert prof.t_batch(16, 1) == pytest.approx(0.030 + 8 * 0.004)  # the last two's slope, 4 ms a sequence
    assert prof.t_batch(3, 1) == pytest.approx(0.012)
    assert prof.t_draft(16, 2) == pytest.approx(0.008) and prof.t_draft(4, 1) == pytest.approx(0.001)
    assert prof.batch_experts(16, 1) == 9.0 and prof.batch_experts(3, 1) == 6.0
