"""The compiled engine's Qwen3-MoE forward (engine/static_qwen3.py) against transformers' own: the same logits,
hidden states and routes over a static cache, for a prefill and for a tree block after it; compiled by inductor,
the same again (the AR step and a verify step)."""

import pytest
import torch
from conftest import batch_predictor, eagle3_drafter

from ecospec.engine.forward import attention_layout, forward_block, new_cache
from ecospec.engine.graphs import inductor_cache
from ecospec.engine.routing import RoutingCapture
from ecospec.engine.static_qwen3 import (
    StaticQwen3,
    attention_over_mask,
    cpu_kernels,
    experts_in_tensor_ops,
)
from ecospec.engine.tree import ancestor_mask
from ecospec.models.loading import tiny_model

MAX_LEN = 48


def _block(prefix: int):
    """A 5-token tree block after `prefix` committed tokens: root, two children, a grandchild under each."""
    parents = [-1, 0, 0, 1, 2]
    depths = [0, 1, 1, 2, 2]
    tokens = torch.tensor([5, 9, 11, 17, 23])
    return tokens, torch.tensor(depths) + prefix, ancestor_mask([p - 1 for p in parents[1:]])


@pytest.mark.kernels  # the first test of the C++ kernels builds them: a minute from an empty ECOSPEC_CACHE
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


@pytest.mark.kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("width", [64, 24])  # 64: the kernel's register tiles; 24: widths they do not divide
def test_routed_experts_op_matches_transformers(dtype, width):
    """`ecospec::moe_experts` (the C++ kernel on the CPU) and its tensor-op form for other devices give
    transformers' expert loop's output for blocks of 1 to 9 tokens, experts shared between tokens or not, and an
    expert named by every choice of several tokens."""
    from transformers.models.qwen3_moe.configuration_qwen3_moe import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    cpu_kernels()
    assert torch._C._dispatch_has_kernel_for_dispatch_key(
        "ecospec::moe_experts", "CPU"
    )  # the C++ kernel, not the fallback
    cfg = Qwen3MoeConfig(hidden_size=width, moe_intermediate_size=width + 8, num_experts=12, hidden_act="silu")
    experts = Qwen3MoeExperts(cfg).to(dtype)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in experts.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) / 6)
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {"atol": 1e-5, "rtol": 1e-5}
    for t in (1, 2, 3, 6, 9):
        x = torch.randn(t, width, generator=gen).to(dtype)
        ids = torch.stack([torch.randperm(12, generator=gen)[:4] for _ in range(t)])
        if t > 2:
            ids[1] = ids[0]  # two tokens routed alike: each expert's rows for both in one pass
        if t == 9:
            ids[2:] = ids[2, 0]  # one expert for every choice of 7 tokens (as forced routing makes it): 28 slots
        w = torch.rand(t, 4, generator=gen).to(dtype)
        with torch.no_grad():
            ref = experts(x, ids, w)
            got = torch.ops.ecospec.moe_experts(x, ids, w, experts.gate_up_proj, experts.down_proj)
            torch.testing.assert_close(got, ref, **tol)
            torch.testing.assert_close(
                experts_in_tensor_ops(x, ids, w, experts.gate_up_proj, experts.down_proj), ref, **tol
            )
    with pytest.raises(RuntimeError, match="out of range"):
        torch.ops.ecospec.moe_experts(x, ids + 12, w, experts.gate_up_proj, experts.down_proj)


@pytest.mark.kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [32, 20])  # 32: the kernel's register tiles; 20: widths they do not divide
def test_block_attention_op_matches_attention_over_a_mask(dtype, head_dim):
    """`ecospec::block_attention` (the C++ kernel, which reads only the slots that hold keys) gives attention over
    the whole static cache through the mask of the visible slots: a batch of three sequences at their own starts (the
    cache's first slot, its middle, a block that ends at its last slot) under their own trees, blocks of 1 to 9
    queries, grouped query heads."""
    cpu_kernels()
    assert torch._C._dispatch_has_kernel_for_dispatch_key("ecospec::block_attention", "CPU")
    gen = torch.Generator().manual_seed(2)
    slots, rows = 40, 3
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {"atol": 1e-5, "rtol": 1e-5}
    for heads, kv in ((4, 2), (2, 1), (3, 3)):
        k_cache = torch.randn(rows, kv, slots, head_dim, generator=gen).to(dtype)
        v_cache = torch.randn(rows, kv, slots, head_dim, generator=gen).to(dtype)
        for q_len in (1, 2, 5, 9):
            q = torch.randn(rows, q_len, heads, head_dim, generator=gen).to(dtype).transpose(1, 2)  # as the step
            trees = [
                ancestor_mask([int(torch.randint(-1, j, (), generator=gen)) for j in range(q_len - 1)])
                for _ in range(rows)
            ]
            start = torch.tensor([0, 17, slots - q_len])
            args = (q, k_cache, v_cache, start, torch.stack(trees), head_dim**-0.5)
            torch.testing.assert_close(torch.ops.ecospec.block_attention(*args), attention_over_mask(*args), **tol)
    with pytest.raises(RuntimeError, match="overruns"):
        torch.ops.ecospec.block_attention(q, k_cache, v_cache, start + 1, torch.stack(trees), 1.0)


@pytest.mark.kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "preset,overrides",
    [("qwen3_moe-a", {}), ("qwen3_moe-b", {"attention_bias": True})],  # b: dense layers, biased projections
)
def test_native_step_matches_the_static_forward(preset, overrides, dtype):
    """The native step (one C++ call, the CPU's compiled target) gives the tensor-code forward's logits, hidden
    states, routes and cache rows for two sequences at their own starts under their own trees, an AR block and a
    tree block; its compaction moves the same cache rows; with forced routing it reads the forced experts."""
    target = tiny_model(preset, seed=5, num_hidden_layers=3, **overrides).to(dtype)
    hidden = (0, 2, target.config.num_hidden_layers)
    ref = StaticQwen3(target, MAX_LEN, hidden, rows=2, native=False)
    nat = StaticQwen3(target, MAX_LEN, hidden, rows=2)
    assert nat.native and not ref.native
    gen = torch.Generator().manual_seed(2)
    prompts = torch.randint(3, target.config.vocab_size, (2, 12), generator=gen)
    tol = {"atol": 1e-5, "rtol": 1e-5}
    tokens, depths, tree = _block(0)
    starts = torch.tensor([12, 9])  # the second sequence's prompt is 9 tokens long: its block starts earlier
    with torch.inference_mode():
        for static in (ref, nat):
            static(
                prompts,
                torch.arange(12).expand(2, 12),
                torch.zeros(2, dtype=torch.long),
                torch.ones(12, 12, dtype=torch.bool).tril().expand(2, 12, 12),
            )
        blocks = [
            (prompts[:, 11:12], starts[:, None], torch.ones(2, 1, 1, dtype=torch.bool)),
            (torch.stack([tokens, tokens.flip(0)]), starts[:, None] + depths, torch.stack([tree, tree])),
        ]
        for toks, pos, tr in blocks:
            want, want_feats = ref(toks, pos, starts, tr)
            got, got_feats = nat.native_step(toks, pos, starts, tr)
            torch.testing.assert_close(got, want, **tol)
            torch.testing.assert_close(got_feats, want_feats, **tol)
            q = toks.shape[1]
            assert torch.equal(nat.routes[:, : 2 * q], ref.routes[:, : 2 * q])
            for a, b in zip(nat.k_cache + nat.v_cache, ref.k_cache + ref.v_cache, strict=True):
                torch.testing.assert_close(a, b, **tol)
        src = torch.tensor([[0, 2, 4, 3, 1], [0, 1, 3, 2, 4]])
        ref.compact(src, starts)
        nat.native_compact(src, starts)
        for a, b in zip(nat.k_cache + nat.v_cache, ref.k_cache + ref.v_cache, strict=True):
            torch.testing.assert_close(a, b, **tol)
    forced = StaticQwen3(target, MAX_LEN, rows=1, forced_routing=True)
    unforced = StaticQwen3(target, MAX_LEN, rows=1, forced_routing=True, native=False)
    ids = torch.randint(0, target.config.num_experts, forced.forced_ids.shape, generator=gen)
    for static in (forced, unforced):
        static.forced_ids.copy_(ids)
    with torch.inference_mode():
        args = (
            prompts[:1],
            torch.arange(12)[None],
            torch.zeros(1, dtype=torch.long),
            torch.ones(1, 12, 12, dtype=torch.bool).tril(),
        )
        torch.testing.assert_close(forced.native_step(*args)[0], unforced(*args)[0], **tol)
        assert torch.equal(forced.routes, unforced.routes)
        assert torch.equal(forced.routes[:, :12], ids[:, :12])


def test_static_forward_refuses_other_families():
    with pytest.raises(ValueError, match="Qwen3-MoE targets only"):
        StaticQwen3(tiny_model("mixtral-a"), MAX_LEN)


@pytest.mark.compiled
def test_compiled_step_matches_uncompiled():
    """Inductor's graphs of the AR step (q = 1) and a verify step (q = 5) give the uncompiled forward's logits,
    routes and cache rows."""
    target = tiny_model("qwen3_moe-b", seed=4, num_hidden_layers=3)
    static = StaticQwen3(target, MAX_LEN)
    inductor_cache()  # the engine's cache per instruction set: torch's default one mixes them
    step = torch.compile(static, dynamic=False, fullgraph=True)
    prompt = torch.randint(3, target.config.vocab_size, (10,), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        static(prompt, torch.arange(10), torch.tensor(0), torch.ones(10, 10, dtype=torch.bool).tril())
        blocks = [(torch.tensor([7]), torch.tensor([10]), torch.ones(1, 1, dtype=torch.bool)), _block(10)]
        for tokens, pos, tree in blocks:
            start = torch.tensor(10)
            ref_logits, _ = static(tokens, pos, start, tree)
            keys = lambda: torch.stack(static.k_cache + static.v_cache)[..., 10:15, :]  # noqa: E731
            ref_routes, ref_keys = static.routes[:, : len(tokens)].clone(), keys().clone()
            for cache in static.k_cache + static.v_cache:
                cache[..., 10:, :].zero_()
            static.routes.zero_()
            logits, _ = step(tokens, pos, start, tree)
            torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=1e-5)
            assert torch.equal(static.routes[:, : len(tokens)], ref_routes)
            torch.testing.assert_close(keys(), ref_keys, atol=1e-5, rtol=1e-5)


@pytest.mark.compiled  # a cold compile of its two graphs is the default suite's longest test
def test_compiled_engine_decodes_as_the_eager_one():
    """`engine=compiled` through the loop, AR and SD with a draft model under every selector, gives the eager
    engine's tokens, accepted lengths and unique experts per verify pass (float64: no reduction-order flips)."""
    if torch.backends.cpu.get_cpu_capability() == "DEFAULT":  # make test-other-isa on an AVX2 machine
        pytest.skip("with ATEN_CPU_CAPABILITY=default, inductor (torch 2.13) emits at::vec code its headers lack")
    import ecospec
    from ecospec.drafters.draft_model import DraftModelDrafter
    from ecospec.engine.compiled import prepare
    from ecospec.models.loading import perturbed_copy

    target = tiny_model("qwen3_moe-b", seed=0, dtype=torch.float64, num_hidden_layers=3)
    drafter = DraftModelDrafter(perturbed_copy(target, scale=0.1, seed=1))
    ids = torch.randint(3, target.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(2))
    prepared = prepare(target, gamma=4, max_len=64)
    runs = [dict()] + [
        dict(drafter=drafter, selector=s, predictor=None if s == "confidence" else "oracle", gamma=4)
        for s in ("confidence", "ecospec", "oracle")
    ]
    for kw in runs:
        eager = ecospec.generate(target, ids, max_new_tokens=20, eos_token_id=[], **kw)
        compiled = ecospec.generate(target, ids, max_new_tokens=20, eos_token_id=[], engine=prepared, **kw)
        assert compiled.tokens == eager.tokens, kw
        assert [s.accepted for s in compiled.steps] == [s.accepted for s in eager.steps], kw
        assert [s.experts for s in compiled.steps] == [s.experts for s in eager.steps], kw
    assert any(s.accepted > 1 for s in compiled.steps)


@pytest.mark.compiled
def test_compiled_batch_decodes_each_sequence_as_the_eager_one():
    """`engine=compiled` at B > 1 (a target prepared for 4 rows, 3 prompts of other lengths, one sequence ending
    at an end-of-sequence token early): each sequence's tokens, accepted lengths and the batched passes' unique
    experts equal the eager engine's, for AR and SD with a draft model (blocks of other sizes per row, padded) and the
    oracle (its look-up pass per row); a finished sequence stays as a masked row."""
    if torch.backends.cpu.get_cpu_capability() == "DEFAULT":  # make test-other-isa on an AVX2 machine
        pytest.skip("with ATEN_CPU_CAPABILITY=default, inductor (torch 2.13) emits at::vec code its headers lack")
    import ecospec
    from ecospec.drafters.draft_model import DraftModelDrafter
    from ecospec.engine.compiled import prepare
    from ecospec.models.loading import perturbed_copy

    target = tiny_model("qwen3_moe-b", seed=0, dtype=torch.float64, num_hidden_layers=3)
    drafter = DraftModelDrafter(perturbed_copy(target, scale=0.1, seed=1))
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, target.config.vocab_size, (n,), generator=gen) for n in (16, 9, 13)]
    prepared = prepare(target, gamma=4, max_len=64, rows=4)
    eos = ecospec.generate(target, prompts[1][None], max_new_tokens=20, eos_token_id=[]).tokens[4]
    runs = [dict()] + [
        dict(drafter=drafter, selector=s, predictor=None if s == "confidence" else "oracle", gamma=4)
        for s in ("confidence", "oracle")
    ]
    for kw in runs:
        eager = ecospec.generate_batch(target, prompts, max_new_tokens=20, eos_token_id=[eos], **kw)
        compiled = ecospec.generate_batch(target, prompts, max_new_tokens=20, eos_token_id=[eos], engine=prepared, **kw)
        for e, c in zip(eager.results, compiled.results, strict=True):
            assert c.tokens == e.tokens, kw
            assert [s.accepted for s in c.steps] == [s.accepted for s in e.steps], kw
        assert [s.experts for s in compiled.steps] == [s.experts for s in eager.steps], kw
        assert len({len(r.tokens) for r in compiled.results}) > 1  # sequences finished at different steps
    assert any(s.accepted > 1 for r in compiled.results for s in r.steps)


def test_compiled_engine_refusals():
    import ecospec

    mixtral = tiny_model("mixtral-a")
    with pytest.raises(ValueError, match="Qwen3-MoE targets only"):
        ecospec.generate(mixtral, torch.tensor([[5, 6, 7]]), engine="compiled")
    with pytest.raises(ValueError, match="unknown engine"):
        ecospec.generate(mixtral, torch.tensor([[5, 6, 7]]), engine="fast")
    qwen = tiny_model("qwen3_moe-a")
    with pytest.raises(ValueError, match="expert budget"):
        ecospec.generate(qwen, torch.tensor([[5, 6, 7]]), engine="compiled", expert_budget=2)


def test_compiled_engine_refused_without_its_toolchain(monkeypatch):
    """No C++ compiler (CXX names none that works) or no ninja: one line naming what is missing, never eager."""
    import torch._inductor.config as inductor_config
    from torch.utils import cpp_extension

    import ecospec

    qwen, ids = tiny_model("qwen3_moe-a"), torch.tensor([[5, 6, 7]])
    # inductor's config is a proxy object, not a module: monkeypatch (pytest >= 9.2) would delete the attribute on
    # undo, so the change goes through torch's own temporary patch, which restores it
    with inductor_config.patch({"cpp.cxx": (None, "/nonexistent/bin/g++")}):
        with pytest.raises(ValueError, match="needs a C\\+\\+ compiler .*/nonexistent/bin/g\\+\\+") as e:
            ecospec.generate(qwen, ids, max_new_tokens=2, engine="compiled")
        assert "\n" not in str(e.value)
    assert inductor_config.cpp.cxx != (None, "/nonexistent/bin/g++")
    with monkeypatch.context() as m:
        m.setattr(cpp_extension, "is_ninja_available", lambda: False)
        with pytest.raises(ValueError, match="needs ninja") as e:
            ecospec.generate(qwen, ids, max_new_tokens=2, engine="compiled")
        assert "\n" not in str(e.value)


@pytest.mark.compiled
def test_compiled_engine_with_an_eagle3_head():
    """An EAGLE-3 head reads the target's hidden states from the compiled verify step: the eager engine's tokens,
    α and E, greedy and (same seed) sampled."""
    import ecospec

    target = tiny_model("qwen3_moe-a", seed=0, dtype=torch.float64)
    cfg = target.config
    drafter = eagle3_drafter(target)
    ids = torch.randint(3, cfg.vocab_size, (1, 16), generator=torch.Generator().manual_seed(11))
    for temperature in (0.0, 1.0):
        kw = dict(drafter=drafter, gamma=4, max_new_tokens=16, eos_token_id=[], temperature=temperature, seed=3)
        eager = ecospec.generate(target, ids, **kw)
        compiled = ecospec.generate(target, ids, engine="compiled", **kw)
        assert compiled.tokens == eager.tokens, temperature
        assert [(s.accepted, s.experts) for s in compiled.steps] == [(s.accepted, s.experts) for s in eager.steps]


@pytest.mark.compiled
def test_compiled_batch_with_an_eagle3_head_and_a_predictor():
    """At B > 1 the compiled target feeds each row's hidden states to the EAGLE-3 head and a learned predictor (a
    native copy of each per sequence, `engine.per_row`): each sequence's tokens, α and the passes' E equal the eager
    engine's, greedy and (same seeds) sampled, and with a sequence that stops early (the others' copies stay with
    their sequences)."""

    import ecospec
    from ecospec.engine.compiled import prepare
    from ecospec.engine.per_row import PerRow

    target = tiny_model("qwen3_moe-a", seed=0, dtype=torch.float64)
    cfg = target.config
    drafter = eagle3_drafter(target)
    predictor = batch_predictor(target)
    gen = torch.Generator().manual_seed(11)
    prompts = [torch.randint(3, cfg.vocab_size, (n,), generator=gen) for n in (16, 7, 11)]
    prepared = prepare(target, gamma=4, max_len=64, rows=3, hidden_layers=drafter.hidden_layers)
    parts = prepared.prepare_parts(drafter, predictor, gamma=4, depth=3, topk=2, predicted=True)
    assert all(isinstance(p, PerRow) and len(p.parts) == 3 and p.static.native for p in parts)
    stop = None
    for temperature, selector, pred, eos in (
        (0.0, "confidence", None, []),
        (0.0, "ecospec", predictor, []),
        (1.0, "ecospec", predictor, []),
        (0.0, "ecospec", predictor, "stop"),
    ):
        kw = dict(
            drafter=drafter,
            selector=selector,
            predictor=pred,
            gamma=4,
            max_new_tokens=16,
            eos_token_id=[stop] if eos else [],
            temperature=temperature,
            seed=[3, 4, 5],
        )
        eager = ecospec.generate_batch(target, prompts, **kw)
        compiled = ecospec.generate_batch(target, prompts, engine=prepared, **kw)
        for e, c in zip(eager.results, compiled.results, strict=True):
            assert c.tokens == e.tokens, (temperature, selector, eos)
            assert [s.accepted for s in c.steps] == [s.accepted for s in e.steps]
        assert [s.experts for s in compiled.steps] == [s.experts for s in eager.steps]
        if stop is None:  # the middle sequence's 4th token, new to it there: it stops before the others
            tokens = eager.results[1].tokens
            stop = next(t for i, t in enumerate(tokens[3:], 3) if t not in tokens[:i])
        elif eos:
            lengths = [len(r.tokens) for r in compiled.results]
            assert lengths[1] < 16 and min(lengths) < max(lengths), lengths


@pytest.mark.compiled
def test_every_block_size_runs_one_verify_graph_that_costs_its_tokens():
    """Blocks of 2 .. γ tokens run one verify graph whose block size is a symbol (`prepare`): after the warm-up has
    called every size, dynamo holds one compiled entry for it and one for the AR step (a size that recompiled
    would add one); each size's logits equal the uncompiled forward's on the same block, and on the release a
    2-token block costs less than a 6-token one (median of 30 passes each, interleaved)."""
    import statistics
    import time

    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    from ecospec.components import load_build
    from ecospec.engine.compiled import prepare
    from ecospec.tiny.build import paths

    torch.set_num_threads(1)
    target = load_build(paths("full"))[0]
    prep = prepare(target, gamma=6, max_len=512, native=False)  # inductor's graphs: the engine's on a GPU
    assert prep.sizes == (1, 2, 3, 4, 5, 6)
    assert len({id(prep.steps[q]) for q in range(2, 7)}) == 1 and prep.steps[1] is not prep.steps[2]
    ids = torch.arange(3, 40)
    blocks = {q: ([5 + j for j in range(q)], [-1, *range(q - 1)], list(range(q))) for q in range(2, 7)}
    times = {2: [], 6: []}
    with torch.inference_mode():
        for q, block in blocks.items():
            prep.prefill_one(ids)
            got, _ = prep.verify_one(*block)
            n = len(ids)
            tree = torch.ones(q, q, dtype=torch.bool).tril()
            want, _ = prep.static(torch.tensor(block[0]), torch.arange(n, n + q), torch.tensor(n), tree)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        for step in (prep.steps[1], prep.steps[2]):
            assert len(_debug_get_cache_entry_list(step._torchdynamo_orig_callable.__func__.__code__)) == 1
        prep.prefill_one(ids)
        for _ in range(30):
            for q in (2, 6):
                t0 = time.perf_counter()
                prep.verify_one(*blocks[q])
                times[q].append(time.perf_counter() - t0)
    assert statistics.median(times[2]) < statistics.median(times[6]), {
        q: statistics.median(t) for q, t in times.items()
    }
