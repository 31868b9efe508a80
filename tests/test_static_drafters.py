"""The compiled engine's EAGLE-3 draft steps and expert-predictor pass against their eager forms, step by step
(float64: no reduction-order flips), through the shapes a decode meets: the prompt (γ at a time through the native
head, uncompiled through inductor's graphs), blocks of 1..γ accepted tokens, adaptive drafting that stops early, and
trees grown otherwise than `grow_tree` grows them."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config

from ecospec.drafters.eagle3 import Eagle3Config, Eagle3Drafter, Eagle3Head, init_random_weights
from ecospec.engine.static_eagle3 import CompiledEagle3, prepare_drafter
from ecospec.engine.static_predictor import CompiledPredictor, prepare_predictor
from ecospec.engine.tree import grow_tree
from ecospec.models.loading import tiny_model
from ecospec.predictor import ExpertPredictor

pytestmark = pytest.mark.compiled

GAMMA, DEPTH, TOPK = 5, 3, 2


def _drafter(variant: str) -> Eagle3Drafter:
    extra = {} if variant == "plain" else {"qk_norm": True, "norm_before_fc": True, "draft_vocab_size": 48}
    head = Eagle3Head(
        Eagle3Config(
            **{
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 8,
                "vocab_size": 64,
                "draft_vocab_size": 64,
                "target_hidden_size": 16,
                "aux_hidden_layers": (0, 1, 2),
                **extra,
            }
        ),
        has_embed_tokens=True,
    )
    init_random_weights(head, std=0.3, seed=1)
    if variant != "plain":  # a draft vocabulary of its own: draft id + d2t = target id
        with torch.no_grad():
            head.d2t.copy_(torch.arange(48) % 7)
    temperature = 1.0 if variant == "plain" else (0.7, 1.3)
    return Eagle3Drafter(head.double(), temperature=temperature)


def _steps(seed: int, feature: int, vocab: int, n: int = 12):
    """(tokens [1, m + 1], features [1, m, F]) of the prompt, then of n steps of 1..γ accepted tokens."""
    g = torch.Generator().manual_seed(seed)
    sizes = [17] + [1 + (i * 3) % GAMMA for i in range(n)]
    return [
        (torch.randint(0, vocab, (1, m + 1), generator=g), torch.randn(1, m, feature, generator=g, dtype=torch.float64))
        for m in sizes
    ]


def _trees_equal(a, b) -> None:
    assert a.tokens == b.tokens and a.parents == b.parents and a.depths == b.depths
    assert a.probs == pytest.approx(b.probs, rel=1e-12)


@pytest.mark.parametrize("native", [None, False])  # the CPU's native head; inductor's graphs (the head elsewhere)
@pytest.mark.parametrize("variant", ["plain", "qk_norm-mapped-temperatures"])
def test_compiled_eagle3_drafts_the_eager_trees(variant, native):
    eager = _drafter(variant)
    compiled = prepare_drafter(eager, gamma=GAMMA, depth=DEPTH, topk=TOPK, max_len=128, native=native)
    assert isinstance(compiled, CompiledEagle3) and compiled.static.native is (native is None)
    assert prepare_drafter(compiled, gamma=GAMMA, depth=DEPTH, topk=TOPK, max_len=128, native=native) is compiled
    feature = eager.head.config.feature_size
    sizes = set()
    for stop in (None, 0.2):  # adaptive drafting: some trees stop before the graph's last level
        eager.reset()
        compiled.reset()
        compiled.levels.update(drafted=0, one_by_one=0)
        for tokens, hidden in _steps(0 if stop is None else 1, feature, 64):
            trees = []
            for d in (eager, compiled):
                logp, ids = d.begin(tokens, hidden, TOPK)
                trees.append(grow_tree(logp, ids, d.expand, DEPTH, stop))
            _trees_equal(*trees)
            sizes.add(len(trees[0]))
        if stop is None:  # one graph drafted every tree: no level ran one by one, but the uncompiled prompt's
            # (the native head takes a prompt of up to CATCH_UP γ blocks γ at a time, and drafts its tree too)
            prompt = 0 if compiled.static.native else DEPTH - 1
            assert compiled.levels == {"drafted": 13 * (DEPTH - 1) - prompt, "one_by_one": prompt}
    assert TOPK + (DEPTH - 1) * TOPK**2 in sizes and min(sizes) < TOPK + (DEPTH - 1) * TOPK**2


def test_native_head_drafts_the_eager_trees_in_float32():
    """float32, where the native head's log-softmax takes its exponentials a vector at a time: the eager drafter's
    trees, their probabilities to float32's rounding."""
    eager = _drafter("plain")
    eager.head.float()
    compiled = prepare_drafter(eager, gamma=GAMMA, depth=DEPTH, topk=TOPK, max_len=128)
    assert compiled.static.native and compiled.static.k_cache.dtype == torch.float32
    for tokens, hidden in _steps(4, eager.head.config.feature_size, 64):
        trees = []
        for d in (eager, compiled):
            logp, ids = d.begin(tokens, hidden.float(), TOPK)
            trees.append(grow_tree(logp, ids, d.expand, DEPTH))
        a, b = trees
        assert a.tokens == b.tokens and a.parents == b.parents and a.depths == b.depths
        assert a.probs == pytest.approx(b.probs, rel=1e-4)


def test_compiled_eagle3_follows_a_tree_grown_otherwise():
    """A beam the graph did not choose (a caller's own growth): the levels from there on run one by one, with the
    eager drafter's results."""
    eager = _drafter("plain")
    compiled = prepare_drafter(eager, gamma=GAMMA, depth=DEPTH, topk=TOPK, max_len=128)
    for tokens, hidden in _steps(2, eager.head.config.feature_size, 64, n=4):
        outs = []
        for d in (eager, compiled):
            d.reset() if tokens.shape[1] > GAMMA + 1 else None
            logp, ids = d.begin(tokens, hidden, TOPK)
            tree = grow_tree(logp, ids, d.expand, 2)  # levels 1 and 2 as grown
            lowest = sorted(range(TOPK, len(tree)), key=lambda i: tree.probs[i])[:TOPK]  # not the grown beam
            outs.append((tree, d.expand(tree, lowest, TOPK), d.expand(tree, [0], TOPK)))
        (t_e, a_e, b_e), (t_c, a_c, b_c) = outs
        assert compiled.levels["one_by_one"] > 0
        _trees_equal(t_e, t_c)
        for x, y in (a_e, a_c), (b_e, b_c):
            assert torch.equal(x[1], y[1])
            torch.testing.assert_close(x[0], y[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("native", [None, False])  # the CPU's native pass; inductor's graph (elsewhere)
def test_compiled_predictor_predicts_the_eager_experts(native):
    target = tiny_model("qwen3_moe-a", seed=0, dtype=torch.float64)
    torch.manual_seed(0)
    backbone = Qwen3Config(
        vocab_size=8,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=512,
        initializer_range=0.2,
        attn_implementation="sdpa",
    )
    eager = ExpertPredictor.from_target(target, backbone, dtype=torch.float64)
    compiled = prepare_predictor(eager, gamma=GAMMA, depth=DEPTH, topk=TOPK, max_len=128, native=native)
    assert isinstance(compiled, CompiledPredictor) and compiled.static.native is (native is None)
    assert prepare_predictor("oracle", gamma=GAMMA, depth=DEPTH, topk=TOPK, max_len=128) == "oracle"
    drafter = _drafter("plain")
    assert target.config.vocab_size >= 64  # the head's tokens are the target's
    for stop in (None, 0.3):  # full trees and smaller ones (padded with dummies)
        eager.reset()
        compiled.reset()
        drafter.reset()
        for tokens, hidden in _steps(3, drafter.head.config.feature_size, 64):
            logp, ids = drafter.begin(tokens, hidden, TOPK)
            tree = grow_tree(logp, ids, drafter.expand, DEPTH, stop)
            assert compiled.predict(tokens, tree) == eager.predict(tokens, tree)
