"""Lossless sampling: SD's distribution over the tokens of its first step equals the target's exact one.

Deterministic (fixed seeds), so it cannot flake; a control shows the test rejects a biased rule.
"""

import pytest
import torch
from conftest import prompt
from scipy.stats import chisquare

import ecospec
from ecospec.drafters.draft_model import DraftModelDrafter
from ecospec.engine.sampling import target_probs
from ecospec.models.loading import perturbed_copy, tiny_model

VOCAB, RUNS = 12, 800
CONTROL_RUNS = 250  # the biased rule fails at p ~ 1e-17 with 250 runs: no need for 800


@pytest.fixture(scope="module")
def small_vocab():
    target = tiny_model("qwen3_moe-a", seed=2, dtype=torch.float64, vocab_size=VOCAB)
    return target, perturbed_copy(target, scale=0.3, seed=4), prompt(6, VOCAB, seed=1)


def exact_joint(target, ids, temperature, top_p):
    """P(second and third new tokens = (a, b)) by enumeration, over the first new token (the prefill's, sampled
    from the target alone): the two tokens the first SD step decides, from one tree."""
    with torch.no_grad():
        p1 = target_probs(target(ids).logits[0, -1], temperature, top_p)
        joint = torch.zeros(VOCAB, VOCAB, dtype=torch.float64)
        for t in range(VOCAB):
            if p1[t] == 0:
                continue
            first = torch.cat([ids, torch.tensor([[t]])], 1)
            p2 = target_probs(target(first).logits[0, -1], temperature, top_p)
            for a in range(VOCAB):
                if p2[a] == 0:
                    continue
                ext = torch.cat([first, torch.tensor([[a]])], 1)
                joint[a] += p1[t] * p2[a] * target_probs(target(ext).logits[0, -1], temperature, top_p)
    return joint.flatten()


def pvalue(counts, expected):
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    return chisquare(obs[keep].numpy(), exp[keep].numpy()).pvalue


def sample_counts(target, ids, drafter, temperature, top_p, runs=RUNS, engine="eager", **method):
    counts = torch.zeros(VOCAB * VOCAB, dtype=torch.float64)
    multi = 0
    for seed in range(runs):
        res = ecospec.generate(
            target,
            ids,
            drafter=drafter,
            gamma=5,
            depth=3,
            topk=2,
            temperature=temperature,
            top_p=top_p,
            max_new_tokens=3,
            seed=seed,
            eos_token_id=[],
            engine=engine,
            **method,
        )
        a, b = res.tokens[1:3]  # both decided by the first SD step
        counts[a * VOCAB + b] += 1
        multi += res.steps[0].accepted > 1
    return counts, multi


@pytest.mark.parametrize(
    "temperature, top_p",
    # 16-23 s each: both in make test-slow (the default suite keeps the batched loop's chi-squared test below)
    [pytest.param(1.0, 1.0, marks=pytest.mark.slow), pytest.param(0.7, 0.9, marks=pytest.mark.slow)],
)
def test_sd_sampling_matches_target(small_vocab, temperature, top_p):
    target, draft, ids = small_vocab
    expected = exact_joint(target, ids, temperature, top_p) * RUNS
    counts, multi = sample_counts(target, ids, DraftModelDrafter(draft), temperature, top_p)
    assert multi > RUNS // 10, "drafts should often be accepted, otherwise the test checks little"
    assert pvalue(counts, expected) > 1e-3
    if temperature == 1.0:  # the enumeration itself, checked against AR sampling once (RUNS rows, one batch)
        res = ecospec.generate_batch(
            target, [ids[0]] * RUNS, temperature=1.0, max_new_tokens=3, seed=list(range(RUNS)), eos_token_id=[]
        )
        ar = torch.zeros(VOCAB * VOCAB, dtype=torch.float64)
        for r in res.results:
            ar[r.tokens[1] * VOCAB + r.tokens[2]] += 1
        assert pvalue(ar, expected) > 1e-3


@pytest.mark.compiled
def test_compiled_sd_sampling_matches_target(small_vocab):
    """The same chi-squared test through the compiled engine (its verify graph's logits, the host's acceptance)."""
    from ecospec.engine.compiled import prepare

    target, draft, ids = small_vocab
    expected = exact_joint(target, ids, 1.0, 1.0) * RUNS
    prepared = prepare(target, gamma=5, max_len=128)
    counts, multi = sample_counts(target, ids, DraftModelDrafter(draft), 1.0, 1.0, engine=prepared)
    assert multi > RUNS // 10
    assert pvalue(counts, expected) > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("selector", ["evict", "cascade", "ecospec_adaptive"])
def test_cost_model_methods_sample_the_target(small_vocab, selector):
    """The methods that truncate blocks or pause drafting by the verify-cost profile keep the target's distribution
    (a profile with a large per-step overhead, so that they speculate on most steps)."""
    from test_adaptive_methods import CHEAP

    target, draft, ids = small_vocab
    expected = exact_joint(target, ids, 1.0, 1.0) * RUNS
    method = dict(selector=selector, profile=CHEAP, predictor="oracle" if selector == "ecospec_adaptive" else None)
    counts, multi = sample_counts(target, ids, DraftModelDrafter(draft), 1.0, 1.0, **method)
    assert multi > RUNS // 10
    assert pvalue(counts, expected) > 1e-3


def test_control_biased_acceptance_is_detected(small_vocab, monkeypatch):
    """Accepting drafts with probability sqrt(p(x)) instead of p(x) must fail the same test."""
    from ecospec.engine import step

    target, draft, ids = small_vocab
    real = step.accept_sampling

    def biased(tokens, parents, ranks, logits, temperature, top_p, generator):
        return real(tokens, parents, ranks, logits * 0.5, temperature, top_p, generator)

    monkeypatch.setattr(step, "accept_sampling", biased)  # what every step's Block.accept calls
    expected = exact_joint(target, ids, 1.0, 1.0) * CONTROL_RUNS
    counts, _ = sample_counts(target, ids, DraftModelDrafter(draft), 1.0, 1.0, runs=CONTROL_RUNS)
    assert pvalue(counts, expected) < 1e-6


def test_batched_sd_sampling_matches_target_per_sequence(small_vocab):
    """generate_batch with 3 prompts of different lengths (16 copies each per batch, every row seeded on its own, one
    verify pass for the batch): each sequence's first two tokens follow the target's exact distribution for its
    own prompt."""
    target, draft, ids = small_vocab
    prompts = [ids[0], prompt(9, VOCAB, seed=2)[0], prompt(3, VOCAB, seed=3)[0]]
    counts = [torch.zeros(VOCAB * VOCAB, dtype=torch.float64) for _ in prompts]
    drafter, multi, copies = DraftModelDrafter(draft), 0, 16  # 16 copies of the 3 prompts per batch, own seeds
    for call in range(RUNS // copies):
        seeds = [call * copies + c for c in range(copies) for _ in prompts]
        res = ecospec.generate_batch(
            target,
            prompts * copies,
            drafter=drafter,
            gamma=4,
            depth=2,
            topk=2,
            temperature=1.0,
            max_new_tokens=3,
            seed=seeds,
            eos_token_id=[],
        )
        assert res.steps[0].sequences == 3 * copies
        for i, r in enumerate(res.results):
            a, b = r.tokens[1:3]
            counts[i % len(prompts)][a * VOCAB + b] += 1
            multi += r.steps[0].accepted > 1
    assert multi > len(prompts) * RUNS // 10, "drafts should often be accepted, otherwise the test checks little"
    for p, c in zip(prompts, counts, strict=True):
        assert pvalue(c, exact_joint(target, p[None], 1.0, 1.0) * RUNS) > 1e-3
