"""The decode loop: lossless greedy SD for every family and selector, expert counts, errors."""

import pytest
import torch
from conftest import FAMILY_PRESETS, eagle3_drafter, prompt

import ecospec
from ecospec.drafters.draft_model import DraftModelDrafter
from ecospec.engine.forward import attention_layout, forward_block, new_cache
from ecospec.engine.tree import ancestor_mask, grow_tree
from ecospec.models.adapters import moe_info

SETTINGS = [(4, 3, 2), (2, 1, 1), (6, 4, 3)]  # (gamma, depth, topk)


def hf_greedy(target, ids, n):
    out = target.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, ids.shape[1] :].tolist()


@pytest.mark.parametrize("preset", FAMILY_PRESETS)
def test_lossless_greedy(models64, preset):
    target, draft = models64(preset)
    ids = prompt(24, target.config.vocab_size)  # longer than the GPT-OSS/Mixtral sliding windows
    n = 20
    ar = ecospec.generate(target, ids, max_new_tokens=n, eos_token_id=[])
    assert ar.tokens == hf_greedy(target, ids, n), "AR through the loop must equal HF greedy generate"
    assert all(s.accepted == 1 for s in ar.steps)
    drafter = DraftModelDrafter(draft)
    accepted_any = rejected_any = False
    for gamma, depth, topk in SETTINGS:
        for selector in ("confidence", "ecospec", "global_cost", "oracle"):
            predictor = None if selector == "confidence" else "oracle"
            sd = ecospec.generate(
                target,
                ids,
                drafter=drafter,
                selector=selector,
                predictor=predictor,
                gamma=gamma,
                depth=depth,
                topk=topk,
                max_new_tokens=n,
                eos_token_id=[],
            )
            assert sd.tokens == ar.tokens, (preset, gamma, depth, topk, selector)
            accepted_any |= any(s.accepted > 1 for s in sd.steps)
            rejected_any |= any(s.accepted < s.verified for s in sd.steps)
    assert accepted_any and rejected_any, "the perturbed drafter should get some drafts accepted and some rejected"


@pytest.mark.parametrize("preset", ["qwen3_moe-a", "deepseek_v3-a", "gpt_oss-a"])
def test_expert_counts(models64, preset):
    target, draft = models64(preset)
    info = moe_info(target)
    ids = prompt(12, target.config.vocab_size, seed=3)
    ar = ecospec.generate(target, ids, max_new_tokens=8, eos_token_id=[])
    assert all(e == info.top_k for s in ar.steps for e in s.experts)
    assert all(len(s.experts) == len(info.moe_layers) for s in ar.steps)
    sd = ecospec.generate(target, ids, drafter=DraftModelDrafter(draft), gamma=5, max_new_tokens=12, eos_token_id=[])
    cap = min(info.num_experts, 5 * info.top_k)
    assert all(info.top_k <= e <= cap for s in sd.steps for e in s.experts)
    assert any(e > info.top_k for s in sd.steps for e in s.experts)


@pytest.mark.parametrize("preset", ["gpt_oss-a", "deepseek_v3-a", "mixtral-b"])
def test_tree_logits_equal_sequential(models64, preset):
    """Every node's logits in one tree forward equal those of running its path token by token."""
    target, draft = models64(preset)
    layout = attention_layout(target.config)
    ids = prompt(20, target.config.vocab_size, seed=5)
    drafter = DraftModelDrafter(draft)
    tree = grow_tree(*drafter.begin(ids, None, 2), drafter.expand, 3)
    prefix = ids.shape[1] - 1
    root = int(ids[0, -1])

    def prefill():
        cache = new_cache()
        pos = torch.arange(prefix)
        forward_block(target, layout, cache, ids[:, :-1], pos, pos, torch.ones(prefix, prefix, dtype=torch.bool).tril())
        return cache

    cache = prefill()
    qpos = torch.tensor([0] + tree.depths) + prefix
    vis = torch.cat([torch.ones(len(tree) + 1, prefix, dtype=torch.bool), ancestor_mask(tree.parents)], 1)
    tree_logits = forward_block(
        target, layout, cache, torch.tensor([[root] + tree.tokens]), qpos, torch.cat([torch.arange(prefix), qpos]), vis
    ).logits[0]
    for node in range(len(tree)):
        path = [root] + [tree.tokens[i] for i in tree.path(node)]
        full = torch.cat([ids[:, :-1], torch.tensor([path])], 1)
        seq_logits = target(full).logits[0, -1]
        # Mixtral's and DeepSeek's routers take their softmax in float32, and the kernels that round it (one per
        # instruction set) differ in the last float32 bits: the float64 logits agree to float32's precision of the
        # routing weights. A wrong mask or position moves them by orders of magnitude more.
        torch.testing.assert_close(tree_logits[node + 1], seq_logits, rtol=1e-5, atol=1e-5)


def test_eos_stops_and_is_kept(models64):
    target, draft = models64("qwen3_moe-a")
    ids = prompt(10, target.config.vocab_size, seed=7)
    ar = ecospec.generate(target, ids, max_new_tokens=12, eos_token_id=[])
    eos = ar.tokens[5]
    first = ar.tokens.index(eos)
    sd = ecospec.generate(target, ids, drafter=DraftModelDrafter(draft), max_new_tokens=12, eos_token_id=eos)
    assert sd.tokens == ar.tokens[: first + 1]


def test_max_new_tokens_trims_overshoot(models64):
    target, draft = models64("mixtral-a", 0.02)
    ids = prompt(10, target.config.vocab_size, seed=8)
    for n in (1, 2, 3, 7):
        sd = ecospec.generate(
            target, ids, drafter=DraftModelDrafter(draft), gamma=6, depth=5, max_new_tokens=n, eos_token_id=[]
        )
        assert len(sd.tokens) == n


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(gamma=1), "gamma must be >= 2"),
        (dict(depth=0), "depth must be >= 1"),
        (dict(topk=0), "topk must be >= 1"),
        (dict(selector="best"), "unknown selector"),
        (dict(selector="ecospec"), "needs expert sets"),
        (dict(temperature=-1.0), "temperature"),
    ],
)
def test_bad_arguments(models64, kwargs, message):
    target, draft = models64("qwen3_moe-a")
    with pytest.raises(ValueError, match=message):
        ecospec.generate(target, prompt(5, 64), drafter=DraftModelDrafter(draft), **kwargs)


def test_vocab_mismatch(models64):
    from ecospec.models.loading import tiny_model

    target, _ = models64("qwen3_moe-a")
    other = tiny_model("qwen3_moe-a", vocab_size=target.config.vocab_size + 8, dtype=torch.float64)
    with pytest.raises(ValueError, match="vocabulary"):
        ecospec.generate(target, prompt(5, 64), drafter=DraftModelDrafter(other))


def test_unsupported_target():
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
    )
    with pytest.raises(ValueError, match="LlamaForCausalLM"):
        ecospec.generate(model, prompt(5, 64))


def test_eagle3_drafter_in_the_loop(models64):
    """Greedy SD with an EAGLE-3 head is lossless, and at every step the head saw exactly the target
    features a fresh head gets from one forward over the whole committed sequence."""
    from ecospec.drafters.eagle3 import Eagle3Drafter

    target, _ = models64("qwen3_moe-a")
    cfg = target.config
    drafter = eagle3_drafter(target)
    head, head_cfg = drafter.head, drafter.head.config
    roots = []
    real_begin = drafter.begin_rows

    def spy(new_tokens, new_hidden, topk, depth=None):
        out = real_begin(new_tokens, new_hidden, topk, depth)
        roots.append(out[0][0])  # one sequence: row 0
        return out

    drafter.begin_rows = spy
    ids = prompt(16, cfg.vocab_size, seed=11)
    ar = ecospec.generate(target, ids, max_new_tokens=12, eos_token_id=[])
    sd = ecospec.generate(target, ids, drafter=drafter, max_new_tokens=12, eos_token_id=[])
    assert sd.tokens == ar.tokens
    committed = ids.shape[1] + 1  # the prefill gives the first token
    for step, root_logp in zip(sd.steps, roots, strict=False):
        seq = torch.cat([ids, torch.tensor([ar.tokens])], 1)[:, :committed]
        with torch.no_grad():
            hs = target(seq[:, :-1], output_hidden_states=True).hidden_states
        feats = torch.cat([hs[i] for i in head_cfg.aux_hidden_layers], dim=-1)
        fresh = Eagle3Drafter(head, target.get_input_embeddings())
        torch.testing.assert_close(fresh.begin(seq, feats, 2)[0], root_logp, rtol=1e-6, atol=1e-6)
        committed += step.accepted


@pytest.mark.parametrize("preset", ["qwen3_moe-b", "deepseek_v3-a", "gpt_oss-a"])
def test_oracle_sets_equal_verified_routing(models64, monkeypatch, preset):
    """The oracle's expert sets (its own pass over the whole candidate tree) equal what the target's
    routers chose for the root and the selected nodes during verification."""
    import ecospec.engine.loop as loop
    import ecospec.methods._session as session
    from ecospec.engine.routing import expert_bitmasks

    target, draft = models64(preset)
    oracle, chosen = [], []
    real_oracle, real_pick = loop.RouterOracle.predict_rows, session.pick

    def spy_oracle(*args):
        out = real_oracle(*args)
        oracle.append(out)
        return out

    def spy_pick(*args):
        out = real_pick(*args)
        chosen.append(out)
        return out

    monkeypatch.setattr(loop.RouterOracle, "predict_rows", spy_oracle)
    monkeypatch.setattr(session, "pick", spy_pick)  # what the method's session chooses with
    ids = prompt(20, target.config.vocab_size, seed=13)
    res = ecospec.generate(
        target,
        ids,
        drafter=DraftModelDrafter(draft),
        selector="oracle",
        predictor="oracle",
        gamma=4,
        max_new_tokens=16,
        eos_token_id=[],
        trace=True,
    )
    n = moe_info(target).num_experts
    verified = [expert_bitmasks(torch.tensor(st.trace.routes), n) for st in res.steps]  # each verify pass's routes
    assert len(oracle) == len(chosen) == len(verified) > 3
    for (root_masks, node_masks), nodes, ver in zip(oracle, chosen, verified, strict=True):
        assert len(root_masks) == len(node_masks) == 1  # one sequence: one row
        assert ver[0] == root_masks[0]
        assert ver[1:] == [node_masks[0][i] for i in nodes]


def test_recurrent_drafter_levels_and_row_slots():
    from ecospec.engine.rows import RowSlots
    from ecospec.engine.tree import DraftTree, missing_levels

    tree = DraftTree()
    a, b = tree.add(5, -1, 0.6), tree.add(6, -1, 0.3)  # depth 1
    c = tree.add(7, a, 0.4)  # depth 2
    d = tree.add(8, c, 0.2)  # depth 3
    assert missing_levels(tree, [d, b], done={}) == [[a, b], [c], [d]]
    assert missing_levels(tree, [d], done={a: None, c: None}) == [[d]]

    slots = RowSlots(2)
    qpos, vis = slots.commit([3, 1])  # row 1 has two padded slots
    assert qpos.tolist() == [[0, 1, 2], [0, 1, 2]] and slots.n == [3, 1]
    assert vis[0].tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    assert vis[1].tolist() == [[1, 0, 0], [0, 1, 0], [0, 0, 1]]  # padding sees only itself
    qpos, vis = slots.commit([1, 2])
    assert qpos.tolist() == [[3, 4], [1, 2]]
    assert vis[1].tolist() == [[1, 0, 0, 1, 0], [1, 0, 0, 1, 1]]  # committed slot 0 and its own block
    qpos, vis = slots.tree([[4, 4], [2, 2]], [[[], []], [[], []]])  # level 1 at slots 5, 6
    qpos, vis = slots.tree([[5], [3]], [[[5]], [[6]]])  # level 2: row 0 under slot 5, row 1 under slot 6
    assert vis[:, 0].int().tolist() == [[1, 1, 1, 1, 0, 1, 0, 1], [1, 0, 0, 1, 1, 0, 1, 1]]
    assert slots.crop() == 5 and slots.width == 5
    slots.keep_rows([1])
    assert slots.n == [3] and slots.valid.tolist() == [[True, False, False, True, True]]


def test_adaptive_draft_stop_ends_the_tree_at_the_first_unconfident_level():
    """grow_tree(stop=...) keeps the level whose best child falls below `stop`, then drafts no further."""
    calls = []

    def expand(tree, beam, k):
        calls.append(len(tree))
        p = 0.9 if len(calls) == 1 else 0.3  # level 2 is confident, level 3 is not
        return torch.log(torch.tensor([[p]] * len(beam))), torch.tensor([[7 + len(calls)]] * len(beam))

    root = (torch.log(torch.tensor([0.8])), torch.tensor([5]))
    assert len(grow_tree(*root, expand, depth=6)) == 6 and len(calls) == 5  # off: the fixed tree
    calls.clear()
    tree = grow_tree(*root, expand, depth=6, stop=0.5)
    assert tree.tokens == [5, 8, 9] and tree.depths == [1, 2, 3] and len(calls) == 2
    calls.clear()
    assert len(grow_tree(*root, expand, depth=6, stop=0.85)) == 1 and not calls  # the root's child is below


def test_adaptive_draft_stop_is_lossless(models64):
    target, draft = models64("mixtral-a", 0.05)
    ids = prompt(10, target.config.vocab_size, seed=9)
    ar = ecospec.generate(target, ids, max_new_tokens=24, eos_token_id=[])
    run = dict(drafter=DraftModelDrafter(draft), gamma=6, depth=5, topk=1, max_new_tokens=24, eos_token_id=[])
    fixed = ecospec.generate(target, ids, **run)
    stopped = ecospec.generate(target, ids, draft_stop=0.6, **run)
    assert stopped.tokens == fixed.tokens == ar.tokens
    assert sum(s.verified for s in stopped.steps) < sum(s.verified for s in fixed.steps)
    assert [s.verified for s in ecospec.generate(target, ids, draft_stop=0.0, **run).steps] == [
        s.verified for s in fixed.steps
    ]
