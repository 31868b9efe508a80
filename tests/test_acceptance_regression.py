"""Acceptance regression (as vLLM's CI keeps one): on fixed held-out prompts with the released embedded default,
greedy, the per-position acceptance of EAGLE-3's tree, the EAGLE-3 chain and EcoSpec is pinned within 2 points, so
a change that quietly degrades drafting or selection fails here. Per position i: the share of steps that drafted at
depth >= i whose accepted path reached depth i (`experiment.metrics.acceptance_by_position`)."""

import pytest
import torch

import ecospec
from ecospec.experiment.metrics import acceptance_by_position, positions

# measured on the release (8 held-out prompts: 2 each of gsm8k, humaneval, math500, mtbench; 48 tokens; γ 6)
PINNED = {
    "confidence": [0.9127, 0.6587, 0.5000],
    "chain": [0.8859, 0.2752, 0.2349, 0.1409, 0.1074],
    "ecospec": [0.9127, 0.6508, 0.5159],
}


@pytest.fixture(scope="module")
def release():
    from ecospec.components import load_build
    from ecospec.tiny.build import paths
    from ecospec.tiny.evaluate import heldout_ids

    target, tokenizer, drafter, predictor = load_build(paths("full"))
    prompts = [p for ps in heldout_ids(tokenizer, ["gsm8k", "humaneval", "math500", "mtbench"], 2).values() for p in ps]
    torch.set_num_threads(1)
    ar = [ecospec.generate(target, ids, max_new_tokens=48).tokens for ids in prompts]
    return target, drafter, predictor, prompts, ar


@pytest.mark.parametrize("selector", list(PINNED))
def test_per_position_acceptance_is_pinned(release, selector):
    target, drafter, predictor, prompts, ar = release
    rows, same = [], 0
    for ids, ar_tokens in zip(prompts, ar, strict=True):
        kw = dict(gamma=6, depth=3, topk=2, max_new_tokens=48)
        res = ecospec.generate(
            target,
            ids,
            drafter=drafter,
            selector=selector,
            predictor=predictor if selector == "ecospec" else None,
            **kw,
        )
        rows.append(positions(res.steps))
        same += res.tokens == ar_tokens
    got = acceptance_by_position(rows)
    assert same == len(prompts)  # lossless on every prompt
    assert got == pytest.approx(PINNED[selector], abs=0.02), got
