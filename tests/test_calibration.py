"""The draft head's calibration: temperature scaling recovers a known temperature, reliability is what it says, the
drafter applies one temperature or one per depth (lossless either way), and the model config's knob validates."""

from __future__ import annotations

import pytest
import torch

import ecospec
from ecospec.analysis.calibration import DraftSamples, collect, fit_temperature, fit_temperatures, nll, reliability
from ecospec.drafters.eagle3 import Eagle3Drafter, Eagle3Head, init_random_weights
from ecospec.drafters.eagle3_train import default_head_config
from ecospec.experiment.config import ConfigError, validate


def _samples(true_t: float, n: int = 4000, v: int = 50, depth: int = 3, seed: int = 0) -> DraftSamples:
    """Labels drawn from softmax(z / true_t): the logits z are off by the factor true_t."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, v, generator=g) * 3
    labels = torch.multinomial(torch.softmax(z / true_t, dim=-1), 1, generator=g)[:, 0]
    depths = torch.arange(n) % depth + 1
    return DraftSamples(z, labels, depths, torch.arange(n) // depth)


@pytest.mark.parametrize("true_t", [0.4, 1.0, 2.5])
def test_temperature_scaling_recovers_the_temperature_that_made_the_labels(true_t):
    s = _samples(true_t)
    t = fit_temperature(s)
    assert t == pytest.approx(true_t, rel=0.08)
    assert nll(s, t) <= min(nll(s, t * 1.2), nll(s, t / 1.2))
    assert all(x == pytest.approx(true_t, rel=0.15) for x in fit_temperatures(s))


def test_reliability_counts_unknown_rows_as_rejected_and_cumulates_along_the_chain():
    # two steps of depth 2: step 0 accepts both drafts, step 1 rejects the first (its second label unknown)
    z = torch.tensor([[5.0, 0.0], [0.0, 5.0], [5.0, 0.0], [5.0, 0.0]])
    s = DraftSamples(z, torch.tensor([0, 1, 1, -1]), torch.tensor([1, 2, 1, 2]), torch.tensor([0, 0, 1, 1]))
    r = reliability(s)
    p = float(torch.softmax(torch.tensor([5.0, 0.0]), 0)[0])
    assert r.count == [2, 1] and r.accuracy == [0.5, 1.0]
    assert r.confidence[0] == pytest.approx(p) and r.cum_confidence[1] == pytest.approx(p * p)
    assert r.cum_accuracy == [0.5, 0.5]  # step 1 never reaches depth 2
    assert r.ece == pytest.approx(abs(p - 2 / 3))  # one bin: 3 known rows, 2 right


@pytest.fixture(scope="module")
def head_and_target():
    from ecospec.models import tiny_model

    target = tiny_model("qwen3_moe-a")
    head = init_random_weights(Eagle3Head(default_head_config(target)), seed=1).eval()
    return target, head


def test_draft_temperature_per_depth_changes_probabilities_not_the_greedy_output(head_and_target):
    target, head = head_and_target
    ids = torch.randint(3, target.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
    ar = ecospec.generate(target, ids, max_new_tokens=16).tokens
    drafters = [Eagle3Drafter(head, target.get_input_embeddings(), temperature=t) for t in (1.0, 0.5, (0.3, 2.0))]
    logs = []
    for d in drafters:
        d.logits_log = []
        res = ecospec.generate(target, ids, drafter=d, gamma=4, depth=3, topk=2, max_new_tokens=16)
        assert res.tokens == ar  # lossless at any temperature
        logs.append(d.logits_log)
    first = [lg[0].reshape(-1, lg[0].shape[-1])[0] for lg in logs]  # depth 1 of step 1: the same state in all
    assert torch.allclose(first[1], first[0] / 0.5) and torch.allclose(first[2], first[0] / 0.3)
    out = torch.randn(1, head.config.hidden_size, generator=torch.Generator().manual_seed(2))
    raw = head.logits(out).float()
    for depth, t in ((1, 0.3), (2, 2.0), (5, 2.0)):  # past the tuple: its last temperature
        logp, _ = drafters[2]._topk_children(out, 4, depth)
        assert torch.allclose(logp, torch.log_softmax(raw / t, dim=-1).topk(4, dim=-1).values)
    with pytest.raises(ValueError, match="temperature"):
        Eagle3Drafter(head, target.get_input_embeddings(), temperature=0.0)


def test_collect_labels_each_depth_with_the_targets_token(head_and_target):
    target, head = head_and_target
    drafter = Eagle3Drafter(head, target.get_input_embeddings(), temperature=0.7)
    ids = torch.randint(3, target.config.vocab_size, (1, 10), generator=torch.Generator().manual_seed(1))
    s = collect(target, drafter, [ids], depth=3, max_new_tokens=20)
    assert drafter.temperature == 0.7 and drafter.logits_log is None  # restored
    ar = ecospec.generate(target, ids, max_new_tokens=20).tokens
    assert s.logits.shape[0] == 3 * (int(s.steps.max()) + 1) and (s.depths.view(-1, 3) == torch.tensor([1, 2, 3])).all()
    known = s.labels >= 0
    assert known.view(-1, 3)[:, 0].all()  # the root's child is always judged
    assert set(s.labels[known].tolist()) <= set(ar)  # every label is a token of the target's own output


def _cfg(*overrides: str):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ecospec.conf_dir()), version_base=None):
        return compose("config", overrides=["model=tiny_random", "method=eagle3", *overrides])


@pytest.mark.parametrize("bad", ["0", "-1.0", "hot", "true"])
def test_a_bad_draft_temperature_is_one_line(bad):
    for ok in ("null", "0.5", "2", "[0.3,0.5]"):
        validate(_cfg(f"+model.drafters.eagle3.temperature={ok}"), check_predictor=False)
    with pytest.raises(ConfigError, match="model.drafters.eagle3.temperature"):
        validate(_cfg(f"+model.drafters.eagle3.temperature={bad}"), check_predictor=False)
    with pytest.raises(ConfigError, match="calibrated"):  # only the tiny build has a fitted one
        validate(_cfg("+model.drafters.eagle3.temperature=calibrated"), check_predictor=False)
