"""Routing capture and expert-set summaries."""

from __future__ import annotations

import time

import pytest
import torch
from transformers import DynamicCache

import ecospec
from ecospec.engine.routing import RoutingCapture, expert_bitmasks, pass_counts
from ecospec.models import PRESETS, moe_info, routers, tiny_model


def unique_per_layer(routes, num_experts):
    """One pass's unique experts per layer, from the engine's one count."""
    return (pass_counts(routes, [routes.shape[1]], num_experts)[0] > 0).sum(-1)


def expert_counts(routes, num_experts):
    return pass_counts(routes, [routes.shape[1]], num_experts)[0]


def _ids(t: int, seed: int = 0, batch: int = 1) -> torch.Tensor:
    return torch.randint(3, 256, (batch, t), generator=torch.Generator().manual_seed(seed))


def _router_inputs(model, ids) -> list[torch.Tensor]:
    """Input of each MoE block (the post-attention RMSNorm output), [tokens, H], in moe_layers order."""
    info = moe_info(model)
    seen: dict[int, torch.Tensor] = {}
    handles = [
        model.model.layers[i].post_attention_layernorm.register_forward_hook(
            lambda mod, args, out, i=i: seen.__setitem__(i, out.detach().reshape(-1, out.shape[-1]))
        )
        for i in info.moe_layers
    ]
    try:
        with torch.no_grad():
            model(ids)
    finally:
        for h in handles:
            h.remove()
    return [seen[i] for i in info.moe_layers]


def _deepseek_by_hand(router, h: torch.Tensor) -> list[set[int]]:
    """DeepSeek-V3 grouped top-k, one token at a time with plain Python."""
    n, groups, keep, k = router.num_experts, router.num_group, router.topk_group, router.top_k
    size = n // groups
    scores = (h.double() @ router.weight.double().T).sigmoid() + router.e_score_correction_bias.double()
    out = []
    for row in scores.tolist():
        group_score = [sum(sorted(row[g * size : (g + 1) * size], reverse=True)[:2]) for g in range(groups)]
        kept = sorted(range(groups), key=lambda g: group_score[g], reverse=True)[:keep]
        candidates = [e for g in kept for e in range(g * size, (g + 1) * size)]
        out.append(set(sorted(candidates, key=lambda e: row[e], reverse=True)[:k]))
    return out


def _brute_force(model, ids) -> list[list[set[int]]]:
    family = moe_info(model).family
    result = []
    for router, h in zip(routers(model), _router_inputs(model, ids), strict=True):
        if family == "deepseek_v3":
            result.append(_deepseek_by_hand(router, h))
            continue
        logits = h.double() @ router.weight.double().T
        if family == "gpt_oss":
            logits = logits + router.bias.double()
        # softmax is monotone: the top-k of the probabilities is the top-k of the logits
        result.append([set(r) for r in logits.topk(router.top_k, dim=-1).indices.tolist()])
    return result


def _as_sets(routes: torch.Tensor) -> list[list[set[int]]]:
    return [[set(tok) for tok in layer] for layer in routes.tolist()]


def _deepseek_with_random_bias(preset: str):
    model = tiny_model(preset)
    gen = torch.Generator().manual_seed(7)
    for r in routers(model):  # make e_score_correction_bias matter (it is zero at init)
        r.e_score_correction_bias.copy_(torch.randn(r.num_experts, generator=gen) * 0.3)
    return model


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_capture_matches_brute_force(preset):
    model = _deepseek_with_random_bias(preset) if preset.startswith("deepseek") else tiny_model(preset)
    info = moe_info(model)
    ids = _ids(40)
    with torch.no_grad(), RoutingCapture(model) as cap:
        model(ids)
        routes = cap.take()
    assert routes.dtype == torch.long and routes.shape == (len(info.moe_layers), 40, info.top_k)
    assert int(routes.min()) >= 0 and int(routes.max()) < info.num_experts
    assert _as_sets(routes) == _brute_force(model, ids)


@pytest.mark.parametrize("preset", ["deepseek_v3-a", "deepseek_v3-b"])
def test_deepseek_grouping_and_bias_matter(preset):
    """Grouping and the correction bias change some choices: the brute-force check is not vacuous."""
    model = _deepseek_with_random_bias(preset)
    ids = _ids(40)
    with torch.no_grad(), RoutingCapture(model) as cap:
        model(ids)
        got = _as_sets(cap.take())
    ungrouped, unbiased = [], []
    for router, h in zip(routers(model), _router_inputs(model, ids), strict=True):
        scores = (h.double() @ router.weight.double().T).sigmoid()
        biased = scores + router.e_score_correction_bias.double()
        ungrouped.append([set(r) for r in biased.topk(router.top_k, dim=-1).indices.tolist()])
        unbiased.append([set(r) for r in scores.topk(router.top_k, dim=-1).indices.tolist()])
    assert got != ungrouped
    assert got != unbiased


@pytest.mark.parametrize("preset", ["qwen3_moe-b", "gpt_oss-a", "deepseek_v3-a", "mixtral-b"])
def test_capture_does_not_change_outputs(preset):
    model = tiny_model(preset)
    ids = _ids(24)
    with torch.no_grad():
        plain = model(ids).logits
        with RoutingCapture(model) as cap:
            hooked = model(ids).logits
        assert cap.take().shape[1] == 24
    assert torch.equal(plain, hooked)
    assert all(len(r._forward_hooks) == 0 for r in routers(model))  # removed on exit


def test_capture_with_grad_enabled():
    model = tiny_model("mixtral-a")
    with RoutingCapture(model) as cap:
        model(_ids(8)).logits.sum().backward()
        routes = cap.take()
    assert routes.shape == (2, 8, 2) and not routes.requires_grad


def test_take_concatenates_forwards_and_clears():
    model = tiny_model("gpt_oss-a")
    ids = _ids(30)
    with torch.no_grad(), RoutingCapture(model) as cap:
        model(ids)
        full = cap.take()
        assert cap.take().shape == (2, 0, 2)  # cleared
        cache = DynamicCache(config=model.config)
        model(ids[:, :20], cache=cache, use_cache=True)  # prompt longer than the sliding window (8)
        for t in range(20, 30):
            model(ids[:, t : t + 1], cache=cache, use_cache=True)
        chunked = cap.take()
    assert chunked.shape == full.shape == (2, 30, 2)
    assert _as_sets(chunked) == _as_sets(full)


def test_batch_is_batch_major():
    model = tiny_model("qwen3_moe-a")
    ids = _ids(12, batch=2)
    with torch.no_grad(), RoutingCapture(model) as cap:
        model(ids)
        both = cap.take()
        model(ids[:1])
        first = cap.take()
        model(ids[1:])
        second = cap.take()
    assert both.shape == (2, 24, 2)
    assert _as_sets(both) == _as_sets(torch.cat([first, second], dim=1))


def test_unique_per_layer_single_token_and_sequence():
    for preset in ("qwen3_moe-b", "deepseek_v3-a"):
        model = tiny_model(preset)
        info = moe_info(model)
        with torch.no_grad(), RoutingCapture(model) as cap:
            model(_ids(1))
            one = cap.take()
            model(_ids(9, seed=1))
            many = cap.take()
        assert one.shape == (len(info.moe_layers), 1, info.top_k)
        assert unique_per_layer(one, info.num_experts).tolist() == [info.top_k] * len(info.moe_layers)
        counts = unique_per_layer(many, info.num_experts)
        assert counts.shape == (len(info.moe_layers),)
        assert int(counts.max()) <= min(info.num_experts, 9 * info.top_k)
        assert counts.tolist() == [len({e for tok in layer for e in tok}) for layer in many.tolist()]


def test_expert_counts_by_hand():
    routes = torch.tensor([[[0, 1], [1, 2], [1, 0]], [[3, 2], [3, 0], [2, 3]]])  # [L=2, T=3, k=2]
    assert expert_counts(routes, 4).tolist() == [[2, 3, 1, 0], [1, 0, 2, 3]]


def test_generate_records_expert_load():
    """The load of a generation counts every verify-pass token's k experts in every MoE layer."""
    model = tiny_model("qwen3_moe-b")
    info = moe_info(model)
    res = ecospec.generate(model, _ids(12), drafter=None, max_new_tokens=6)
    load = torch.tensor(res.expert_load)
    assert load.shape == (info.num_moe_layers, info.num_experts)
    verified = sum(s.verified for s in res.steps)
    assert load.sum(dim=1).tolist() == [verified * info.top_k] * info.num_moe_layers
    assert ((load > 0).sum(dim=1) >= torch.tensor(res.steps[0].experts)).all()


def _bitmasks_by_hand(routes: torch.Tensor, n: int) -> list[int]:
    num_layers, tokens, _ = routes.shape
    out = []
    for t in range(tokens):
        bits = {layer * n + e for layer in range(num_layers) for e in routes[layer, t].tolist()}
        out.append(sum(1 << b for b in bits))
    return out


def test_expert_bitmasks_match_sets():
    model = tiny_model("mixtral-b")
    info = moe_info(model)
    with torch.no_grad(), RoutingCapture(model) as cap:
        model(_ids(17))
        routes = cap.take()
    masks = expert_bitmasks(routes, info.num_experts)
    assert masks == _bitmasks_by_hand(routes, info.num_experts)
    assert all(m.bit_count() == len(info.moe_layers) * info.top_k for m in masks)
    # odd sizes (L*N not a multiple of 8) and the union of a token set
    gen = torch.Generator().manual_seed(0)
    routes = torch.stack([torch.randperm(13, generator=gen)[:3] for _ in range(5 * 7)]).view(5, 7, 3)
    masks = expert_bitmasks(routes, 13)
    assert masks == _bitmasks_by_hand(routes, 13)
    union = 0
    for m in masks:
        union |= m
    per_layer = [(union >> (layer * 13)) & ((1 << 13) - 1) for layer in range(5)]
    assert [p.bit_count() for p in per_layer] == unique_per_layer(routes, 13).tolist()
    assert expert_bitmasks(routes[:, :0], 13) == []


def test_expert_bitmasks_full_size_is_fast():
    gen = torch.Generator().manual_seed(0)
    routes = torch.randint(0, 128, (94, 512, 8), generator=gen)  # Qwen3-235B shape, 512 tokens
    start = time.perf_counter()
    masks = expert_bitmasks(routes, 128)
    assert time.perf_counter() - start < 1.0
    assert len(masks) == 512
    assert masks[:3] == _bitmasks_by_hand(routes[:, :3], 128)


def test_step_traces_rebuild_the_sequence_routing():
    """The accepted paths of traced verify passes carry exactly the routes a plain forward over the final
    sequence gives (tree attention is exact), so SD records can feed the routing-overlap analysis."""
    model = tiny_model("qwen3_moe-b", dtype=torch.float64)
    from ecospec.drafters.draft_model import DraftModelDrafter
    from ecospec.models import perturbed_copy

    ids = _ids(10, seed=3)
    drafter = DraftModelDrafter(perturbed_copy(model, scale=0.05, seed=1))
    res = ecospec.generate(model, ids, drafter=drafter, gamma=4, depth=3, topk=2, max_new_tokens=12, trace=True)
    assert any(len(s.trace.path) > 1 for s in res.steps)  # some drafts were accepted
    per_step = [torch.tensor(s.trace.routes)[:, s.trace.path] for s in res.steps]  # [L, accepted, k]
    traced = torch.cat(per_step, dim=1)
    # the first root is the prefill's token, at position len(prompt)
    full = torch.cat([ids, torch.tensor([res.tokens])], dim=1)[:, : ids.shape[1] + traced.shape[1]]
    with torch.no_grad(), RoutingCapture(model) as cap:
        model(full)
        routes = cap.take()
    expected = routes[:, ids.shape[1] :]
    assert traced.shape == expected.shape
    assert torch.equal(traced.sort(dim=-1).values, expected.sort(dim=-1).values)
    assert all(s.trace is None for s in ecospec.generate(model, ids, max_new_tokens=3).steps)
