"""EAGLE-3 head training: draft vocabulary, default config, the TTT mask (by hand and against the inference
drafter), learning on a tiny target, determinism, lossless SD with the trained head, checkpoint round trip."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import ecospec
from ecospec.drafters.eagle3 import Eagle3Drafter, Eagle3Head, init_random_weights
from ecospec.drafters.eagle3_checkpoint import load_eagle3, save_eagle3
from ecospec.drafters.eagle3_train import (
    count_tokens,
    default_feature_layers,
    default_head_config,
    draft_vocab_from_counts,
    evaluate_agreement,
    train_eagle3,
    ttt_visibility,
    unrolled_logits,
)
from ecospec.engine.tree import DraftTree
from ecospec.models import tiny_config, tiny_model

PRESET = "qwen3_moe-a"
TRAIN = dict(steps=300, lr=1e-2, batch_size=8, seq_len=32, ttt_steps=3, seed=0)


@torch.no_grad()
def greedy_sequences(target, n: int, prompt_len: int = 8, new: int = 40, seed: int = 0) -> torch.Tensor:
    """Random prompts continued greedily by the target: [n, prompt_len + new]."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, target.config.vocab_size, (n, prompt_len), generator=g)
    for _ in range(new):
        nxt = target(input_ids=ids, use_cache=False).logits[:, -1].argmax(-1)
        ids = torch.cat([ids, nxt[:, None]], 1)
    return ids


@pytest.fixture(scope="module")
def setup():
    target = tiny_model(PRESET, dtype=torch.float32)
    train = greedy_sequences(target, 200, seed=0)
    held_out = greedy_sequences(target, 16, seed=99)
    trained = train_eagle3(target, train, eval_sequences=held_out, **TRAIN)
    untrained = train_eagle3(target, train, eval_sequences=held_out, **{**TRAIN, "steps": 0})
    return SimpleNamespace(target=target, train=train, held_out=held_out, trained=trained, untrained=untrained)


# ---------------------------------------------------------------------------------------------------
# vocabulary, config, mask
# ---------------------------------------------------------------------------------------------------


def test_draft_vocab_from_counts():
    counts = torch.tensor([5, 0, 7, 7, 1, 3, 0, 3])
    d2t, t2d = draft_vocab_from_counts(counts, 4)
    # ranking 2 (7), 3 (7), 0 (5), 5 (3) / 7 (3): tie -> lower id 5; draft ids in ascending target order
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool
    assert (torch.arange(4) + d2t).tolist() == [0, 2, 3, 5]
    assert t2d.tolist() == [True, False, True, True, False, True, False, False]

    seqs = [torch.tensor([9, 9, 9, 4, 4, 1]), torch.tensor([4, 9, 6, 6, 6, 6, 6])]
    counts = count_tokens(seqs, 12)
    assert counts[6] == 5 and counts[9] == 4 and counts[4] == 3 and counts.sum() == 13
    d2t, t2d = draft_vocab_from_counts(counts, 3)
    ids = torch.arange(3) + d2t
    assert ids.tolist() == [4, 6, 9] and t2d[ids].all() and int(t2d.sum()) == 3
    full_d2t, full_t2d = draft_vocab_from_counts(counts, 12)
    assert (full_d2t == 0).all() and full_t2d.all()  # full vocabulary = identity mapping
    with pytest.raises(ValueError, match="draft_vocab_size"):
        draft_vocab_from_counts(counts, 13)


def test_default_head_config():
    expected = {1: (0, 0, 1), 2: (0, 1, 2), 3: (0, 1, 3), 4: (1, 2, 3), 5: (1, 2, 4), 6: (1, 3, 5)}
    expected |= {7: (2, 3, 4), 8: (2, 4, 5), 32: (2, 16, 29), 94: (2, 47, 91)}
    for n, aux in expected.items():
        assert default_feature_layers(n) == aux, n

    cfg = default_head_config(SimpleNamespace(config=tiny_config(PRESET)))
    assert (cfg.hidden_size, cfg.target_hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads) == (48, 48, 4, 2)
    assert cfg.head_dim == 12 and cfg.aux_hidden_layers == (0, 1, 2) and cfg.draft_vocab_size == cfg.vocab_size == 256
    assert default_head_config(SimpleNamespace(config=tiny_config("qwen3_moe-b"))).aux_hidden_layers == (1, 2, 3)
    mla = default_head_config(SimpleNamespace(config=tiny_config("deepseek_v3-a")), draft_vocab_size=100)
    assert mla.head_dim == 48 // 4 and mla.draft_vocab_size == 100  # MLA: head_dim from hidden / heads


def test_ttt_mask_by_hand():
    t, f = True, False
    causal = [[t, f, f, f], [t, t, f, f], [t, t, t, f], [t, t, t, t]]
    eye = [[t, f, f, f], [f, t, f, f], [f, f, t, f], [f, f, f, t]]
    assert ttt_visibility(4, 0).tolist() == causal
    assert ttt_visibility(4, 2).tolist() == [c + e + e for c, e in zip(causal, eye, strict=True)]
    # SafeAILab/EAGLE's variant: step 2 sees step-0 keys 0..i-2 only
    shifted = [[f, f, f, f], [f, f, f, f], [t, f, f, f], [t, t, f, f]]
    assert ttt_visibility(4, 2, eagle_shift=True).tolist() == [c + e + e for c, e in zip(shifted, eye, strict=True)]


def test_ttt_forward_matches_inference_drafter():
    """Unrolled step j at entry i is the depth-j node rooted at entry i: the drafter (begin + expand along a
    chain of teacher tokens) gives the same distributions. The EAGLE-shift mask does not."""
    target = tiny_model(PRESET, dtype=torch.float32)
    head = init_random_weights(Eagle3Head(default_head_config(target)), std=0.15, seed=3)
    window = greedy_sequences(target, 1, new=8, seed=5)  # [1, 16]
    steps = 3
    logits = unrolled_logits(head, target, window, steps)
    shifted = unrolled_logits(head, target, window, steps, eagle_shift=True)
    with torch.no_grad():
        hs = target(window, output_hidden_states=True).hidden_states
    feats = torch.cat([hs[k] for k in head.config.aux_hidden_layers], dim=-1)
    dv = head.config.draft_vocab_size
    max_shift_gap = 0.0
    for i in (0, 4, 9):
        drafter = Eagle3Drafter(head, target.get_input_embeddings())
        logp, ids = drafter.begin(window[:, : i + 2], feats[:, : i + 1], topk=dv)
        got = [torch.empty(dv).scatter_(0, ids, logp)]
        tree, parent = DraftTree(), -1
        for j in range(1, steps):
            parent = tree.add(int(window[0, i + 1 + j]), parent, 1.0)
            lp, ids = drafter.expand(tree, [parent], dv)
            got.append(torch.empty(dv).scatter_(0, ids[0], lp[0]))
        for j in range(steps):
            want = torch.log_softmax(logits[j][0, i], -1)
            torch.testing.assert_close(got[j], want, rtol=1e-4, atol=1e-4)
            max_shift_gap = max(max_shift_gap, float((torch.log_softmax(shifted[j][0, i], -1) - want).abs().max()))
    assert max_shift_gap > 1e-2


# ---------------------------------------------------------------------------------------------------
# training
# ---------------------------------------------------------------------------------------------------


def test_training_learns(setup):
    log = setup.trained.train_log
    assert len(log.loss) == TRAIN["steps"] and all(len(s) == 3 for s in log.step_losses)
    first, last = sum(log.loss[:20]) / 20, sum(log.loss[-20:]) / 20
    assert last < 0.6 * first, (first, last)
    before, after = log.agreement_untrained, log.agreement
    assert log.eval_windows == 16 and len(after) == 3
    assert after[0] > before[0] + 0.08 and after[0] > 3 * before[0], (before, after)
    assert all(a > b for a, b in zip(after, before, strict=True)), (before, after)
    assert setup.untrained.train_log.agreement == before  # steps=0: the same initial head
    assert evaluate_agreement(setup.trained, setup.target, setup.held_out[:, :32]) == after


def test_ttt_changes_training_and_is_deterministic():
    target = tiny_model(PRESET, dtype=torch.float32)
    seqs = greedy_sequences(target, 8, new=16)
    kw = dict(steps=4, lr=1e-2, batch_size=2, seq_len=12, seed=1)
    a = train_eagle3(target, seqs, ttt_steps=3, **kw)
    b = train_eagle3(target, seqs, ttt_steps=3, **kw)
    c = train_eagle3(target, seqs, ttt_steps=1, **kw)
    d = train_eagle3(target, seqs, ttt_steps=3, **{**kw, "seed": 2})
    sa, sb, sc, sd = (h.state_dict() for h in (a, b, c, d))
    assert all(torch.equal(sa[k], sb[k]) for k in sa)  # same seed, same head
    assert a.train_log.loss == b.train_log.loss
    assert not torch.equal(sa["midlayer.self_attn.q_proj.weight"], sc["midlayer.self_attn.q_proj.weight"])
    assert not torch.equal(sa["fc.weight"], sd["fc.weight"])
    assert len(c.train_log.step_losses[0]) == 1 and len(a.train_log.step_losses[0]) == 3
    # step 0 is computed identically before the first update, whatever ttt_steps
    assert a.train_log.step_losses[0][0] == pytest.approx(c.train_log.step_losses[0][0], rel=1e-6)


def test_trained_head_in_generate(setup):
    target, emb = setup.target, setup.target.get_input_embeddings()
    alphas = {}
    for name, head in (("untrained", setup.untrained), ("trained", setup.trained)):
        total = []
        for k in range(6):
            ids = setup.held_out[k : k + 1, :12]
            ar = ecospec.generate(target, ids, max_new_tokens=24, eos_token_id=[])
            sd = ecospec.generate(
                target,
                ids,
                drafter=Eagle3Drafter(head, emb),
                gamma=4,
                depth=3,
                topk=2,
                max_new_tokens=24,
                eos_token_id=[],
            )
            assert sd.tokens == ar.tokens, (name, k)
            total.append(sd.alpha)
        alphas[name] = sum(total) / len(total)
    assert alphas["trained"] > alphas["untrained"] + 0.1, alphas


@pytest.mark.parametrize("layout", ["eagle", "speculators"])
def test_reduced_vocab_save_load(setup, tmp_path, layout):
    target = setup.target
    head = train_eagle3(target, setup.train[:40], steps=10, lr=1e-2, batch_size=4, seq_len=16, draft_vocab_size=64)
    d2t, t2d = draft_vocab_from_counts(count_tokens(setup.train[:36], 256), 64)  # holdout: last 10%
    assert torch.equal(head.d2t, d2t) and torch.equal(head.t2d, t2d) and (head.d2t != 0).any()
    assert head.train_log.draft_vocab_coverage < 1.0
    save_eagle3(head, tmp_path, layout=layout)
    loaded = load_eagle3(tmp_path)
    assert loaded.config == head.config
    sd, sd2 = head.state_dict(), loaded.state_dict()
    assert sd.keys() == sd2.keys() and all(torch.equal(sd[k], sd2[k]) for k in sd)
    window = setup.held_out[:2, :20]
    for a, b in zip(unrolled_logits(head, target, window), unrolled_logits(loaded, target, window), strict=True):
        assert torch.equal(a, b)
    ids = setup.held_out[:1, :12]
    outs = [
        ecospec.generate(
            target, ids, drafter=Eagle3Drafter(h, target.get_input_embeddings()), max_new_tokens=12, eos_token_id=[]
        )
        for h in (head, loaded)
    ]
    assert outs[0].tokens == outs[1].tokens == ecospec.generate(target, ids, max_new_tokens=12, eos_token_id=[]).tokens
    assert [s.accepted for s in outs[0].steps] == [s.accepted for s in outs[1].steps]
