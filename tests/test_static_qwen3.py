"""The compiled engine's Qwen3-MoE forward (engine/static_qwen3.py) against transformers' own: the same logits,
hidden states and routes over a static cache, for a prefill and for a tree block after it; compiled by inductor,
the same again (the AR step and a verify step)."""

import pytest
import torch

from ecospec.engine.forward import attention_layout, forward_block, new_cache
from ecospec.engine.routing import RoutingCapture
from ecospec.engine.static_qwen3 import StaticQwen3
from ecospec.engine.tree import ancestor_mask
from ecospec.models.loading import tiny_model

MAX_LEN = 48


def _block(prefix: int):
    """A 5-token tree block after `prefix` committed tokens: root, two children, a grandchild under each."""
    parents = [-1, 0, 0, 1, 2]
    depths = [0, 1, 1, 2, 2]
    tokens = torch.tensor([5, 9, 11, 17, 23])
    return tokens, torch.tensor(depths) + prefix, ancestor_mask([p - 1 for p in parents[1:]])


@pytest.mark.parametrize("preset", ["qwen3_moe-a", "qwen3_moe-b"])  # b: dense layers among the MoE ones
def test_static_forward_matches_transformers(preset):
    target = tiny_model(preset, seed=3, attn_implementation="sdpa")
    hidden = (1, 2, target.config.num_hidden_layers)
    static = StaticQwen3(target, MAX_LEN, hidden)
    prompt = torch.randint(3, target.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
    n = prompt.shape[1]
    layout = attention_layout(target.config, target)
    cache = new_cache()
    with torch.inference_mode(), RoutingCapture(target) as cap:
        ref = forward_block(target, layout, cache, prompt, torch.arange(n)[None], None, None, hidden=True)
        ref_routes = cap.take()
        logits, feats = static(prompt[0], torch.arange(n), torch.tensor(0), torch.ones(n, n, dtype=torch.bool).tril())
        torch.testing.assert_close(logits, ref.logits[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(feats, torch.cat([ref.hidden_states[i][0] for i in hidden], -1), atol=1e-5, rtol=0)
        assert torch.equal(static.routes[:, :n], ref_routes)

        tokens, pos, tree = _block(n)
        vis = torch.cat([torch.ones(len(tokens), n, dtype=torch.bool), tree], 1)
        ref = forward_block(target, layout, cache, tokens[None], pos[None], None, vis, hidden=True)
        ref_routes = cap.take()
        logits, feats = static(tokens, pos, torch.tensor(n), tree)
        torch.testing.assert_close(logits, ref.logits[0], atol=1e-5, rtol=1e-5)
        assert torch.equal(static.routes[:, : len(tokens)], ref_routes)
        assert torch.equal(logits.argmax(-1), ref.logits[0].argmax(-1))


def test_static_forward_refuses_other_families():
    with pytest.raises(ValueError, match="Qwen3-MoE targets only"):
        StaticQwen3(tiny_model("mixtral-a"), MAX_LEN)


def test_compiled_step_matches_uncompiled():
    """Inductor's graphs of the AR step (q = 1) and a verify step (q = 5) give the uncompiled forward's logits,
    routes and cache rows: the small compiled-vs-eager check of the default suite."""
    target = tiny_model("qwen3_moe-b", seed=4, num_hidden_layers=3)
    static = StaticQwen3(target, MAX_LEN)
    step = torch.compile(static, dynamic=False, fullgraph=True)
    prompt = torch.randint(3, target.config.vocab_size, (10,), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        static(prompt, torch.arange(10), torch.tensor(0), torch.ones(10, 10, dtype=torch.bool).tril())
        blocks = [(torch.tensor([7]), torch.tensor([10]), torch.ones(1, 1, dtype=torch.bool)), _block(10)]
        for tokens, pos, tree in blocks:
            start = torch.tensor(10)
            ref_logits, _ = static(tokens, pos, start, tree)
            ref_routes, ref_keys = static.routes[:, : len(tokens)].clone(), static.k_cache[:, :, 10:15].clone()
            static.k_cache[:, :, 10:].zero_()
            logits, _ = step(tokens, pos, start, tree)
            torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=1e-5)
            assert torch.equal(static.routes[:, : len(tokens)], ref_routes)
            torch.testing.assert_close(static.k_cache[:, :, 10:15], ref_keys, atol=1e-5, rtol=1e-5)
