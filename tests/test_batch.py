"""The batched target forward: rows of different lengths, each with its own tree, in one pass, equal the
single-sequence forward row by row, before and after per-row cache compaction (float64, every family)."""

import random

import pytest
import torch
from conftest import FAMILY_PRESETS, prompt

from ecospec.engine.batch import RowBlock, compact_rows, forward_rows
from ecospec.engine.forward import attention_layout, cache_len, compact_cache, forward_block, new_cache
from ecospec.engine.tree import ancestor_mask
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
