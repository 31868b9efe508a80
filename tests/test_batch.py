"""Batches: the batched target forward (rows of different lengths, each with its own tree, in one pass, equal the
single-sequence forward row by row, before and after per-row compaction) and generate_batch (each sequence equals
generate() on its prompt alone); float64, every family."""

import random

import pytest
import torch
from conftest import FAMILY_PRESETS, batch_predictor, eagle3_drafter, prompt

import ecospec
from ecospec.drafters.draft_model import DraftModelDrafter
from ecospec.engine.batch import RowBlock, compact_rows, forward_rows
from ecospec.engine.forward import attention_layout, cache_len, compact_cache, forward_block, new_cache
from ecospec.engine.tree import ancestor_mask
from ecospec.models.adapters import moe_info
from ecospec.models.loading import tiny_model

LENGTHS = (12, 25, 17)  # longer than the GPT-OSS / Mixtral presets' sliding windows


def random_tree(rng: random.Random, n: int, vocab: int) -> tuple[list[int], list[int], list[int]]:
    """(tokens, parents, depths) of a random tree; parents precede children (-1 = the root)."""
    parents, depths = [], []
    for i in range(n):
        p = rng.randrange(-1, i)
        parents.append(p)
        depths.append(1 if p < 0 else depths[p] + 1)
    return [rng.randrange(3, vocab) for _ in range(n)], parents, depths


def tree_block(root: int, tokens, parents, depths) -> RowBlock:
    return RowBlock([root, *tokens], [0, *depths], ancestor_mask(parents))


def assert_rows_close(got, want):
    """float64 models whose routers take the softmax in float32 (HF): batching moves logits by ~1e-6, never the
    argmax; a wrong mask or position moves them by orders of magnitude more."""
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def single_tree_logits(target, layout, cache, root, tokens, parents, depths):
    n = cache_len(cache)
    qpos = torch.tensor([0, *depths]) + n
    vis = torch.cat([torch.ones(len(tokens) + 1, n, dtype=torch.bool), ancestor_mask(parents)], 1)
    ids = torch.tensor([[root, *tokens]])
    return forward_block(target, layout, cache, ids, qpos, torch.cat([torch.arange(n), qpos]), vis).logits[0]


@pytest.fixture(scope="module")
def sdpa_target():
    """A float64 Qwen3-MoE on SDPA (bool masks) instead of eager attention (additive masks)."""
    model = tiny_model("qwen3_moe-a", seed=0, dtype=torch.float64)
    model.set_attn_implementation("sdpa")
    return model


@pytest.mark.parametrize("preset", [*FAMILY_PRESETS, "qwen3_moe-a/sdpa"])
def test_rows_equal_single_sequences(models64, sdpa_target, preset):
    target = sdpa_target if preset.endswith("/sdpa") else models64(preset)[0]
    layout = attention_layout(target.config)
    vocab = target.config.vocab_size
    rng = random.Random(sum(map(ord, preset)))
    prompts = [prompt(n, vocab, seed=i)[0].tolist() for i, n in enumerate(LENGTHS)]

    # single sequences: prefill, a tree, compaction to an accepted path, a second tree
    singles, want = [], []
    for p in prompts:
        cache = new_cache()
        pos = torch.arange(len(p) - 1)
        forward_block(
            target, layout, cache, torch.tensor([p[:-1]]), pos, pos, torch.ones(len(pos), len(pos)).bool().tril()
        )
        singles.append(cache)
    trees = [random_tree(rng, rng.randrange(1, 7), vocab) for _ in prompts]
    want = [single_tree_logits(target, layout, c, p[-1], *t) for c, p, t in zip(singles, prompts, trees, strict=True)]

    # the batch: one prefill forward, one tree forward
    cache = new_cache()
    lengths = [0] * len(prompts)
    prefill = [
        RowBlock(p[:-1], list(range(len(p) - 1)), torch.ones(len(p) - 1, len(p) - 1).bool().tril()) for p in prompts
    ]
    forward_rows(target, layout, cache, lengths, prefill)
    lengths = [len(p) - 1 for p in prompts]
    start = cache_len(cache)
    out, real = forward_rows(
        target, layout, cache, lengths, [tree_block(p[-1], *t) for p, t in zip(prompts, trees, strict=True)]
    )
    for b, w in enumerate(want):
        assert real[b].sum() == len(w) and not real[b, len(w) :].any()
        assert_rows_close(out.logits[b, : len(w)], w)

    # accept a path per row (root + the path to a random node), compact, verify a second tree
    keeps = []
    for b, (tokens, parents, _) in enumerate(trees):
        node = rng.randrange(len(tokens))
        path = []
        while node >= 0:
            path.append(node + 1)  # block index: the root is 0
            node = parents[node]
        keep = [0, *reversed(path)][: rng.randrange(1, len(path) + 2)]
        keeps.append(keep)
        compact_cache(singles[b], lengths[b], keep)
    lengths = compact_rows(cache, lengths, start, keeps)
    assert lengths == [cache_len(c) for c in singles]
    trees = [random_tree(rng, rng.randrange(1, 7), vocab) for _ in prompts]
    roots = [rng.randrange(3, vocab) for _ in prompts]
    want = [single_tree_logits(target, layout, c, r, *t) for c, r, t in zip(singles, roots, trees, strict=True)]
    out, _ = forward_rows(
        target, layout, cache, lengths, [tree_block(r, *t) for r, t in zip(roots, trees, strict=True)]
    )
    for b, w in enumerate(want):
        assert_rows_close(out.logits[b, : len(w)], w)


def test_bad_rows(models64):
    target, _ = models64("qwen3_moe-a")
    layout = attention_layout(target.config)
    block = RowBlock([5], [0], torch.ones(1, 1, dtype=torch.bool))
    with pytest.raises(ValueError, match="2 lengths for 1 blocks"):
        forward_rows(target, layout, new_cache(), [0, 0], [block])
    with pytest.raises(ValueError, match="row 0 has 3 committed entries, the cache 0"):
        forward_rows(target, layout, new_cache(), [3], [block])


# -- generate_batch ---------------------------------------------------------------------------------------------

BATCH_LENGTHS = (6, 21, 13)


# every family's -a preset in the default suite, the -b ones behind `slow` (make test-slow, CI): test_engine's lossless
# greedy runs every preset at one sequence
BATCH_PRESETS = [p if p.endswith("-a") else pytest.param(p, marks=pytest.mark.slow) for p in FAMILY_PRESETS]


@pytest.mark.parametrize("preset", BATCH_PRESETS)
def test_generate_batch_equals_generate_per_prompt(models64, preset):
    """Greedy: every sequence's tokens and step records equal generate() on its prompt alone, for AR and SD with
    each selector; with one expert buffer for the batch the tokens still equal AR's (lossless)."""
    target, draft = models64(preset)
    vocab = target.config.vocab_size
    prompts = [prompt(n, vocab, seed=10 + i)[0] for i, n in enumerate(BATCH_LENGTHS)]
    drafter = DraftModelDrafter(draft)
    predictor = batch_predictor(target)
    ar = [ecospec.generate(target, p[None], max_new_tokens=12, eos_token_id=[]) for p in prompts]
    runs = [
        (None, "confidence", None),
        (drafter, "confidence", None),
        (drafter, "ecospec", predictor),
        (drafter, "global_cost", predictor),
        (drafter, "oracle", "oracle"),
    ]
    for d, selector, pred in runs:
        kw = dict(drafter=d, selector=selector, predictor=pred, gamma=4, depth=3, topk=2, max_new_tokens=12)
        got = ecospec.generate_batch(target, prompts, eos_token_id=[], **kw)
        for p, res, a in zip(prompts, got.results, ar, strict=True):
            alone = ecospec.generate(target, p[None], eos_token_id=[], **kw)
            assert res.tokens == alone.tokens == a.tokens
            assert [(s.accepted, s.verified, s.experts) for s in res.steps] == [
                (s.accepted, s.verified, s.experts) for s in alone.steps
            ]
            assert res.expert_load == alone.expert_load
        assert all(s.sequences <= len(prompts) for s in got.steps)
        assert max(s.sequences for s in got.steps) == len(prompts)
        if selector in ("ecospec", "oracle"):  # the only selectors that read the buffer mode
            shared = ecospec.generate_batch(target, prompts, eos_token_id=[], batch_buffer="batch", **kw)
            assert [r.tokens for r in shared.results] == [a.tokens for a in ar]


def test_generate_batch_pass_counts_and_leaving(models64):
    """E of a batched pass counts the union over its sequences (padding left out); a sequence that hits eos
    leaves the batch and the others go on."""
    target, draft = models64("qwen3_moe-a")
    vocab = target.config.vocab_size
    prompts = [prompt(n, vocab, seed=20 + i)[0] for i, n in enumerate(BATCH_LENGTHS)]
    alone = [ecospec.generate(target, p[None], max_new_tokens=10, eos_token_id=[]) for p in prompts]
    eos = alone[0].tokens[2]  # the first sequence stops at its 3rd token
    got = ecospec.generate_batch(target, prompts, drafter=DraftModelDrafter(draft), max_new_tokens=10, eos_token_id=eos)
    for res, a in zip(got.results, alone, strict=True):
        want = a.tokens[: a.tokens.index(eos) + 1] if eos in a.tokens else a.tokens
        assert res.tokens == want
    # a sequence whose first token (the prefill's) is eos never enters a verify pass
    decoding = [r for r in got.results if r.tokens[0] != eos]
    assert all(not r.steps for r in got.results if r not in decoding)
    assert got.steps[0].sequences == len(decoding) >= 2 and got.steps[-1].sequences < len(decoding)
    info = moe_info(target)
    for s in got.steps:
        assert max(1, info.top_k) <= min(s.experts) and max(s.experts) <= min(info.num_experts, s.verified * info.top_k)
    first = got.steps[0]
    assert first.verified == sum(r.steps[0].verified for r in decoding)
    assert all(e >= max(r.steps[0].experts[layer] for r in decoding) for layer, e in enumerate(first.experts))


def test_generate_batch_errors(models64):
    target, _ = models64("qwen3_moe-a")
    with pytest.raises(ValueError, match="no prompts"):
        ecospec.generate_batch(target, [])
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        ecospec.generate_batch(target, [[5, 6], []])
    with pytest.raises(ValueError, match="batch_buffer must be one of sequence, batch"):
        ecospec.generate_batch(target, [[5, 6]], batch_buffer="global")
    with pytest.raises(ValueError, match="gamma must be >= 2"):
        ecospec.generate_batch(target, [[5, 6]], gamma=1)


@pytest.mark.parametrize("preset, kind", [("qwen3_moe-a", "eagle3"), ("gpt_oss-b", "eagle3"), ("deepseek_v3-a", "mtp")])
def test_generate_batch_with_hidden_state_drafters(models64, preset, kind):
    """Drafters that read the target's hidden states (EAGLE-3, MTP) get each row's own features."""
    from ecospec.drafters.mtp import MtpDrafter, MtpHead, init_random_weights

    target, _ = models64(preset)
    if kind == "mtp":
        drafter = MtpDrafter(init_random_weights(MtpHead.for_target(target), std=0.1).double().eval(), target)
    else:
        drafter = eagle3_drafter(target)
    vocab = target.config.vocab_size
    prompts = [prompt(n, vocab, seed=30 + i)[0] for i, n in enumerate(BATCH_LENGTHS)]
    predictor = batch_predictor(target)
    ar = [ecospec.generate(target, p[None], max_new_tokens=10, eos_token_id=[]).tokens for p in prompts]
    for selector, pred in (
        ("confidence", None),
        ("ecospec", predictor),
        ("global_cost", predictor),
        ("oracle", "oracle"),
    ):
        kw = dict(drafter=drafter, selector=selector, predictor=pred, max_new_tokens=10, eos_token_id=[])
        got = ecospec.generate_batch(target, prompts, **kw)
        for p, res, a in zip(prompts, got.results, ar, strict=True):
            alone = ecospec.generate(target, p[None], **kw)
            assert res.tokens == alone.tokens == a
            assert [(s.accepted, s.experts) for s in res.steps] == [(s.accepted, s.experts) for s in alone.steps]
        if selector in ("ecospec", "oracle"):
            shared = ecospec.generate_batch(target, prompts, batch_buffer="batch", **kw)
            assert [r.tokens for r in shared.results] == ar


def test_drafters_and_predictor_run_once_per_level_for_the_whole_batch(models64):
    """One drafter forward per tree level and one predictor forward per step for the whole batch, whatever B."""
    from ecospec.predictor.model import ExpertPredictor

    target, draft = models64("qwen3_moe-a")
    vocab = target.config.vocab_size
    prompts = [prompt(n, vocab, seed=50 + i)[0] for i, n in enumerate(BATCH_LENGTHS)]
    drafters = {"draft_model": DraftModelDrafter(draft), "eagle3": eagle3_drafter(target)}
    calls = {}

    def count(key):
        calls[key] += 1

    real_decode = ExpertPredictor._decode

    def counted_decode(self, *a, **k):
        count("pred")
        return real_decode(self, *a, **k)

    for name, drafter in drafters.items():
        module = drafter.model if name == "draft_model" else drafter.head
        calls.update(draft=0, pred=0)
        handle = module.register_forward_hook(lambda *_: count("draft"))
        ExpertPredictor._decode = counted_decode
        try:
            got = ecospec.generate_batch(
                target,
                prompts,
                drafter=drafter,
                selector="ecospec",
                predictor=batch_predictor(target),
                depth=3,
                max_new_tokens=10,
                eos_token_id=[],
            )
        finally:
            handle.remove()
            ExpertPredictor._decode = real_decode
        assert got.steps[0].sequences == 3
        assert calls == {"draft": 3 * len(got.steps), "pred": len(got.steps)}, name


def test_generate_batch_sampling_follows_each_prompt_alone(models64):
    """T = 1: each row draws from its own generator seeded like generate(), so a row samples exactly what
    generate() samples for its prompt alone (whose sampling the distribution tests cover)."""
    target, draft = models64("mixtral-a")
    vocab = target.config.vocab_size
    prompts = [prompt(n, vocab, seed=40 + i)[0] for i, n in enumerate(BATCH_LENGTHS)]
    kw = dict(drafter=DraftModelDrafter(draft), temperature=1.0, top_p=0.9, max_new_tokens=12, eos_token_id=[])
    for seed in (0, 1):
        got = ecospec.generate_batch(target, prompts, seed=seed, **kw)
        want = [ecospec.generate(target, p[None], seed=seed, **kw).tokens for p in prompts]
        assert [r.tokens for r in got.results] == want


def test_one_loop_for_one_sequence_and_a_batch(models64):
    """`generate` and `generate_batch` are one loop: a method that keeps per-prompt state (the chain's session)
    runs through `generate_batch` on one prompt exactly as through `generate`, and at B > 1 every sequence's traces
    (blocks, accepted paths, routes) equal `generate`'s on its prompt alone."""
    target, draft = models64("qwen3_moe-a")
    vocab = target.config.vocab_size
    prompts = [prompt(n, vocab, seed=30 + i)[0] for i, n in enumerate(BATCH_LENGTHS)]
    kw = dict(drafter=DraftModelDrafter(draft), gamma=4, max_new_tokens=10, eos_token_id=[], trace=True)

    def traces(res):
        return [(s.trace.tokens, s.trace.parents, s.trace.path, s.trace.routes) for s in res.steps]

    chain = dict(kw, selector="chain", depth=3, topk=1)
    one = ecospec.generate_batch(target, prompts[:1], **chain).results[0]
    alone = ecospec.generate(target, prompts[0][None], **chain)
    assert one.tokens == alone.tokens and traces(one) == traces(alone)
    assert len(one.steps) < len(one.tokens) - 1  # it speculated: some step produced more than one token
    for p, res in zip(prompts, ecospec.generate_batch(target, prompts, **chain).results, strict=True):
        assert traces(res) == traces(ecospec.generate(target, p[None], **chain))

    got = ecospec.generate_batch(target, prompts, **kw)
    for p, res in zip(prompts, got.results, strict=True):
        assert traces(res) == traces(ecospec.generate(target, p[None], **kw))
