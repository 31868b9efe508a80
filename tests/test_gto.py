"""GTO (drafters/gto_train.py): branch values are expected accepted lengths (checked by enumerating outcomes), the
tree reward is their log-sum-exp, training trees are the decode loop's trees, the surrogate's log-likelihood is the
tree's own draft probability, gradients reach the trained head through branch tokens only (never the reference),
and a few hundred steps on a tiny random target raise the reward against the reference."""

from __future__ import annotations

import copy
import itertools
import math

import pytest
import torch

from ecospec.drafters.eagle3 import Eagle3Drafter, Eagle3Head, init_random_weights
from ecospec.drafters.eagle3_train import default_head_config, target_pass, train_eagle3
from ecospec.drafters.gto_train import (
    GtoSettings,
    _trees,
    accepted_branch,
    branch_logprobs,
    branch_values,
    group_advantages,
    gto_terms,
    target_tree_probs,
    train_gto,
    tree_reward,
)
from ecospec.engine.tree import DraftTree, grow_tree
from ecospec.models.loading import tiny_model


def small_tree() -> DraftTree:
    t = DraftTree()
    a, b = t.add(5, -1, 0.6), t.add(6, -1, 0.3)
    c = t.add(7, a, 0.4)
    t.add(8, a, 0.1)
    t.add(9, c, 0.2)
    t.add(10, b, 0.1)
    return t


def brute_force_accepted(probs: list[float]) -> float:
    """Expected accepted tokens of a chain by enumerating every outcome of independent accept coins (token u's
    coin comes up with probability probs[u]); the chain accepts its leading run of successes."""
    total = 0.0
    for outcome in itertools.product([True, False], repeat=len(probs)):
        p = math.prod(q if ok else 1 - q for ok, q in zip(outcome, probs, strict=True))
        run = next((u for u, ok in enumerate(outcome) if not ok), len(outcome))
        total += p * run
    return total


def test_branch_values_are_expected_accepted_lengths_and_the_reward_their_logsumexp():
    tree = small_tree()
    probs = [0.7, 0.2, 0.5, 0.9, 0.3, 0.6]
    values = branch_values(tree, probs)
    assert [path for path, _ in values] == [[0, 3], [0, 2, 4], [1, 5]]  # every root-to-leaf branch
    for path, value in values:
        assert value == pytest.approx(brute_force_accepted([probs[n] for n in path]), abs=1e-12)
    ls = [v for _, v in values]
    assert tree_reward(ls) == pytest.approx(math.log(sum(math.exp(v) for v in ls)), abs=1e-12)
    assert tree_reward(ls, eta=50.0) == pytest.approx(max(ls), abs=0.02)  # a soft maximum
    ok = [True, False, True, True, False, True]
    assert accepted_branch(tree, ok) == [0, 2] and accepted_branch(tree, [False] * 6) == []


def test_group_advantages_are_standardised_per_group():
    gains = torch.tensor([[1.0, 2.0, 3.0], [5.0, 5.0, 5.0]])
    adv = group_advantages(gains, 1e-6)
    assert torch.allclose(adv[0], torch.tensor([-1.224744, 0.0, 1.224744]), atol=1e-5)
    assert torch.equal(adv[1], torch.zeros(3))


@pytest.fixture(scope="module")
def setup():
    target = tiny_model("qwen3_moe-a", seed=0, dtype=torch.float64)
    head = init_random_weights(Eagle3Head(default_head_config(target, intermediate_size=64)), std=0.3).double()
    window = torch.randint(3, target.config.vocab_size, (24,), generator=torch.Generator().manual_seed(0))
    feats, _ = target_pass(target, window[None], head.config.aux_hidden_layers, head.dtype)
    return target, head, window, feats


def test_training_trees_are_the_decode_trees_and_the_branch_likelihood_their_draft_probability(setup):
    target, head, window, feats = setup
    positions = [2, 9, 15]
    trees = _trees(head, target, window, feats, positions, GtoSettings())
    branches, want = {}, {}
    for i, tree in zip(positions, trees, strict=True):
        drafter = Eagle3Drafter(head, target.get_input_embeddings())
        alone = grow_tree(*drafter.begin(window[None, : i + 2], feats[:, : i + 1], 2), drafter.expand, 3)
        assert alone.tokens == tree.tokens and alone.parents == tree.parents
        assert alone.probs == pytest.approx(tree.probs, abs=1e-12)
        deep = len(tree) - 1
        branches[i] = [tree.tokens[n] for n in tree.path(deep)]
        want[i] = math.log(tree.probs[deep])
    lp = branch_logprobs(head, target, window, feats, branches)
    for i in positions:
        assert float(lp[i].detach()) == pytest.approx(want[i], abs=1e-5)  # the unroll takes log-softmax in float32
    assert torch.count_nonzero(lp.detach()) == len(positions)  # entries without a branch stay 0


def test_target_tree_probs_are_the_targets_own(setup):
    target, head, window, feats = setup
    (tree,) = _trees(head, target, window, feats, [6], GtoSettings())
    (probs,), (greedy,) = target_tree_probs(target, window, [tree], [6])
    for node in range(len(tree)):
        ctx = window[:8].tolist() + [tree.tokens[n] for n in tree.path(node)[:-1]]
        with torch.no_grad():
            dist = torch.softmax(target(torch.tensor([ctx])).logits[0, -1].float(), -1)
        assert probs[node] == pytest.approx(float(dist[tree.tokens[node]]), abs=1e-5)
        assert greedy[node] == (int(dist.argmax()) == tree.tokens[node])


@pytest.fixture(scope="module")
def trained_setup():
    """A float32 target and a head trained on it briefly: its trees get accepted branches."""
    target = tiny_model("qwen3_moe-a", seed=0)
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(3, target.config.vocab_size, (64,), generator=g) for _ in range(40)]
    head = train_eagle3(
        target, seqs, default_head_config(target, intermediate_size=64), steps=60, lr=1e-2, batch_size=4, seq_len=32
    )
    return target, head, seqs, g


def test_gradients_reach_the_trained_head_through_branch_tokens_only(trained_setup):
    target, head, seqs, _ = trained_setup
    window = seqs[0][:32]
    feats, _ = target_pass(target, window[None], head.config.aux_hidden_layers, head.dtype)
    trained = copy.deepcopy(head)
    ref = copy.deepcopy(head)
    for p in ref.parameters():
        p.requires_grad_(False)
    with torch.no_grad():  # M != M0, or every advantage is 0
        for p in trained.parameters():
            p.add_(0.05 * p.std() * torch.randn(p.shape, generator=torch.Generator().manual_seed(1), dtype=p.dtype))
    loss, stats = gto_terms(
        trained, ref, target, window, feats, GtoSettings(groups=2, group_size=8), torch.Generator().manual_seed(0)
    )
    assert stats["accepted"] > 0
    loss.backward()
    assert all(p.grad is None for p in ref.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in trained.parameters())
    # a log-likelihood only depends on its own branch's tokens: another entry's branch changes nothing
    branches = {3: [int(window[5])], 10: [int(window[12]), int(window[13])]}
    a = branch_logprobs(trained, target, window, feats, branches)
    b = branch_logprobs(trained, target, window, feats, {**branches, 10: [int(window[2])]})
    assert float(a[3]) == float(b[3]) and float(a[10]) != float(b[10])


@pytest.mark.slow  # 18 s of training (make test-slow, CI)
def test_a_few_hundred_steps_raise_the_reward_against_the_reference(trained_setup):
    target, head, seqs, _ = trained_setup
    g = torch.Generator().manual_seed(5)
    head, start = copy.deepcopy(head), copy.deepcopy(head)
    s = GtoSettings(groups=2, group_size=8)
    held = [torch.randint(3, target.config.vocab_size, (32,), generator=g) for _ in range(6)]

    def reward(h) -> float:
        out = []
        for w in held:
            feats, _ = target_pass(target, w[None], h.config.aux_hidden_layers, h.dtype)
            trees = _trees(h, target, w, feats, list(range(28)), s)
            probs, _ = target_tree_probs(target, w, trees, list(range(28)))
            out += [tree_reward([v for _, v in branch_values(t, p)]) for t, p in zip(trees, probs, strict=True)]
        return sum(out) / len(out)

    trained, log = train_gto(head, target, seqs, steps=200, lr=1e-3, batch_size=2, seq_len=32, settings=s)
    assert reward(trained) > reward(start)
    assert sum(log.reward_gain[-50:]) > 0  # r(M) - r(M0) on the training trees, late in training


def test_gto_job_publishes_a_head_that_the_gto_methods_load(tmp_path, monkeypatch):
    """experiment=gto on a random tiny target (train-split prompts answered by the target), then method=gto and
    gto_ecospec find the published head in the store; before it exists the cell is refused with the command."""
    from omegaconf import OmegaConf
    from test_experiment import _compose

    from ecospec.experiment.config import ConfigError, validate
    from ecospec.experiment.dispatch import run_any

    monkeypatch.setenv("ECOSPEC_CACHE", str(tmp_path / "cache"))
    fast = ["model=tiny_random", "threads=1", "progress=false", f"out_dir={tmp_path}"]
    with pytest.raises(ConfigError, match="needs a GTO-trained EAGLE-3 head for model=tiny_random; make it with"):
        validate(_compose(*fast, "method=gto"))
    job = _compose(
        "experiment=gto",
        *fast,
        "gto.datasets=[humaneval]",
        "gto.num_prompts=4",
        "gto.response_tokens=8",
        "gto.steps=3",
        "gto.seq_len=16",
        "gto.groups=1",
        "gto.group_size=4",
        "gto.warmup_steps=1",
        "gto.save_every=2",
        "gto.lr=1e-3",
    )
    rec = run_any(OmegaConf.to_container(job, resolve=True), tmp_path / "gto")
    assert rec["status"] == "ok", rec.get("traceback")
    assert rec["summary"]["sequences"] == 4 and any((tmp_path / "cache").rglob("gto/head/config.json"))
    for method in ("gto", "gto_ecospec"):
        cfg = _compose(*fast, f"method={method}", "num_prompts=1", "max_new_tokens=8")
        cell = run_any(OmegaConf.to_container(cfg, resolve=True), tmp_path / method)
        assert cell["status"] == "ok", cell.get("traceback")
        assert cell["summary"]["matches_ar"] == 1.0 and cell["config"]["method"]["drafter"] == "gto"
