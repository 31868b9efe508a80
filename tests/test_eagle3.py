"""EAGLE-3 head: checkpoint round trips (both layouts), refusal of bad checkpoints, tree vs sequential
drafting, KV-cache cropping across steps, norm_before_residual, RoPE position-shift invariance."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from ecospec.drafters.eagle3 import (
    Eagle3Config,
    Eagle3Drafter,
    Eagle3Head,
    KVCache,
    default_aux_hidden_layers,
    init_random_weights,
)
from ecospec.drafters.eagle3_checkpoint import CheckpointError, aux_layers_from_config, load_eagle3, save_eagle3
from ecospec.engine.tree import grow_tree

VOCAB, DRAFT_VOCAB, H, TARGET_H = 96, 40, 32, 24
AUX = (1, 2, 3)


def make_config(**overrides) -> Eagle3Config:
    kw = dict(
        hidden_size=H,
        intermediate_size=48,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=12,  # != H / heads = 8
        vocab_size=VOCAB,
        draft_vocab_size=DRAFT_VOCAB,
        target_hidden_size=TARGET_H,
        aux_hidden_layers=AUX,
        rms_norm_eps=1e-5,
        rope_theta=5000.0,
        max_position_embeddings=256,
    )
    kw.update(overrides)
    return Eagle3Config(**kw)


def make_head(seed: int = 0, has_embed_tokens: bool = False, **overrides) -> Eagle3Head:
    head = Eagle3Head(make_config(**overrides), has_embed_tokens=has_embed_tokens)
    init_random_weights(head, std=0.3, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    # non-trivial reduced vocab: draft id i -> a sorted random subset of target ids
    targets = torch.randperm(VOCAB, generator=g)[: head.config.draft_vocab_size].sort().values
    with torch.no_grad():
        head.d2t.copy_(targets - torch.arange(head.config.draft_vocab_size))
        head.t2d.zero_()
        head.t2d[targets] = True
    return head.double()


def embedding(seed: int = 7) -> torch.nn.Embedding:
    torch.manual_seed(seed)
    return torch.nn.Embedding(VOCAB, H).double()


def features(n: int, seed: int = 3, width: int = len(AUX) * TARGET_H) -> torch.Tensor:
    return torch.randn(1, n, width, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def tokens(n: int, seed: int = 4) -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, n), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------------------
# checkpoints
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["eagle", "speculators"])
@pytest.mark.parametrize("own_embed", [False, True])
def test_save_load_round_trip(tmp_path, layout, own_embed):
    head = make_head(has_embed_tokens=own_embed, norm_before_residual=True, aux_hidden_layers=(2, 5, 9))
    save_eagle3(head, tmp_path, layout=layout)
    loaded = load_eagle3(tmp_path)
    assert loaded.config == head.config
    assert loaded.config.head_dim == 12 and loaded.config.norm_before_residual
    assert loaded.config.aux_hidden_layers == (2, 5, 9)
    sd, sd2 = head.state_dict(), loaded.state_dict()
    assert sd.keys() == sd2.keys()
    for k in sd:
        assert sd2[k].dtype == sd[k].dtype, k
        assert torch.equal(sd[k], sd2[k]), k
    assert loaded.d2t.dtype == torch.int64 and loaded.t2d.dtype == torch.bool
    assert (loaded.d2t != 0).any()  # non-trivial mapping survived

    emb = embedding()
    outs = []
    for h in (head, loaded):
        d = Eagle3Drafter(h, None if own_embed else emb)
        outs.append(d.begin(tokens(9), features(8), topk=5))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])

    keys = load_file(tmp_path / "model.safetensors").keys()
    prefix = "midlayer." if layout == "eagle" else "layers.0."
    assert f"{prefix}self_attn.q_proj.weight" in keys and f"{prefix}hidden_norm.weight" in keys
    assert ("embed_tokens.weight" in keys) == own_embed
    cfg = json.loads((tmp_path / "config.json").read_text())
    if layout == "speculators":
        assert cfg["speculators_model_type"] == "eagle3"
        assert cfg["transformer_layer_config"]["head_dim"] == 12
        assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 5, 9]  # vLLM/speculators: HF indices
    else:
        assert cfg["draft_vocab_size"] == DRAFT_VOCAB and cfg["head_dim"] == 12
        # SpecForge convention: "output of layer id" = HF index - 1
        assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 4, 8]


def test_round_trip_variants(tmp_path):
    """Rope scaling, norm_before_fc and qk-norm survive both layouts and change nothing on reload."""
    head = make_head(
        norm_before_fc=True,
        qk_norm=True,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    )
    for layout in ("eagle", "speculators"):
        save_eagle3(head, tmp_path / layout, layout=layout)
        loaded = load_eagle3(tmp_path / layout)
        assert loaded.config == head.config
        a = Eagle3Drafter(head, embedding()).begin(tokens(7), features(6), 4)
        b = Eagle3Drafter(loaded, embedding()).begin(tokens(7), features(6), 4)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_load_casts_to_dtype(tmp_path):
    save_eagle3(make_head(), tmp_path)
    head = load_eagle3(tmp_path, dtype=torch.bfloat16)
    assert head.fc.weight.dtype == torch.bfloat16 and head.d2t.dtype == torch.int64
    logp, ids = Eagle3Drafter(head, embedding().to(torch.bfloat16)).begin(tokens(5), features(4), 3)
    assert logp.dtype == torch.float32 and ids.shape == (3,)


def _rewrite(path, drop=(), add=None, reshape=None):
    tensors = load_file(path / "model.safetensors")
    for k in drop:
        del tensors[k]
    for k, v in (add or {}).items():
        tensors[k] = v
    for k, shape in (reshape or {}).items():
        tensors[k] = torch.zeros(shape, dtype=tensors[k].dtype)
    save_file(tensors, str(path / "model.safetensors"))


@pytest.mark.parametrize("layout", ["eagle", "speculators"])
def test_bad_checkpoint_one_error_naming_all_keys(tmp_path, layout):
    save_eagle3(make_head(), tmp_path, layout=layout)
    p = "midlayer." if layout == "eagle" else "layers.0."
    _rewrite(
        tmp_path,
        drop=[f"{p}mlp.up_proj.weight", "d2t"],
        add={"layers.1.self_attn.q_proj.weight": torch.zeros(3, 3)},
        reshape={"fc.weight": (H, 2 * TARGET_H), f"{p}self_attn.k_proj.weight": (16, 2 * H)},
    )
    with pytest.raises(CheckpointError) as info:
        load_eagle3(tmp_path)
    err = info.value
    msg = str(err)
    assert isinstance(err, ValueError)
    for key in (f"{p}mlp.up_proj.weight", "d2t", "layers.1.self_attn.q_proj.weight", "fc.weight"):
        assert key in msg
    assert f"{p}self_attn.k_proj.weight: got [16, 64], expected [24, 64]" in msg
    assert "fc.weight: got [32, 48], expected [32, 72]" in msg
    assert "expected shape [48, 32]" in msg  # the missing up_proj with its expected shape
    assert len(err.missing) == 2 and len(err.unexpected) == 1 and len(err.misshaped) == 2


def test_missing_single_key(tmp_path):
    save_eagle3(make_head(), tmp_path)
    _rewrite(tmp_path, drop=["norm.weight"])
    with pytest.raises(CheckpointError, match=r"missing: norm\.weight \(expected shape \[32\]\)"):
        load_eagle3(tmp_path)


def test_unflagged_input_norm_is_refused(tmp_path):
    """A gpt-oss-style `input_norm.weight` without norm_before_fc would be silently ignored elsewhere."""
    save_eagle3(make_head(), tmp_path)
    _rewrite(tmp_path, add={"input_norm.weight": torch.ones(len(AUX) * TARGET_H)})
    with pytest.raises(CheckpointError, match="unexpected: input_norm.weight"):
        load_eagle3(tmp_path)


def test_pytorch_bin_and_ignorable_keys(tmp_path):
    head = make_head()
    save_eagle3(head, tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["midlayer.self_attn.rotary_emb.inv_freq"] = torch.ones(6)
    (tmp_path / "model.safetensors").unlink()
    torch.save(tensors, tmp_path / "pytorch_model.bin")
    loaded = load_eagle3(tmp_path)
    assert torch.equal(loaded.fc.weight, head.fc.weight)


def test_eagle_repo_style_config_needs_target(tmp_path):
    """yuhuili/EAGLE3-* style: flat Llama config, no layer ids, no head_dim -> default layers from target."""
    head = make_head(head_dim=8)
    save_eagle3(head, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    for k in ("ecospec_aux_hidden_layers", "eagle_config", "head_dim", "qk_norm", "norm_before_fc"):
        cfg.pop(k)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="target_config"):
        load_eagle3(tmp_path)
    from transformers import LlamaConfig

    target = LlamaConfig(num_hidden_layers=32, vocab_size=VOCAB, hidden_size=TARGET_H, num_attention_heads=4)
    loaded = load_eagle3(tmp_path, target_config=target)
    assert loaded.config.aux_hidden_layers == (2, 16, 29) == default_aux_hidden_layers(32)
    assert loaded.config.head_dim == 8
    assert load_eagle3(tmp_path, aux_hidden_layers=(3, 4, 5)).config.aux_hidden_layers == (3, 4, 5)
    with pytest.raises(CheckpointError, match="vocab_size"):
        load_eagle3(tmp_path, target_config={"num_hidden_layers": 32, "vocab_size": VOCAB + 1})


def test_aux_layer_conventions():
    def nested(ids):
        return aux_layers_from_config({"eagle_config": {"eagle_aux_hidden_state_layer_ids": ids}})

    # speculators / vLLM: top-level ids are HF hidden_states indices
    assert aux_layers_from_config({"eagle_aux_hidden_state_layer_ids": [2, 24, 45]}) == (2, 24, 45)
    # SpecForge / ModelOpt nested ids are layer outputs: +1 (SGLang rule: only when the first id is 1)
    assert nested([1, 23, 44]) == (2, 24, 45)
    assert nested([24, 30, 36]) == (24, 30, 36)
    # null = EAGLE default for the target's depth; our own explicit key wins over everything
    assert aux_layers_from_config({"eagle_aux_hidden_state_layer_ids": None}, 48) == (2, 24, 45)
    assert aux_layers_from_config({"eagle_aux_hidden_state_layer_ids": None}) is None
    ours = {"ecospec_aux_hidden_layers": [1, 2, 3], "eagle_aux_hidden_state_layer_ids": [7, 8, 9]}
    assert aux_layers_from_config(ours) == (1, 2, 3)


# ---------------------------------------------------------------------------------------------------
# drafting
# ---------------------------------------------------------------------------------------------------


def _sequential_child_logp(head, emb, prompt, feats, path_tokens):
    """Reference: plain causal, one entry at a time, no tree. Returns the log-probs after the path."""
    cache = KVCache()
    n = feats.shape[1]
    hidden = head.project(feats)
    out = head(hidden, emb(prompt[:, 1:]), torch.arange(n), cache)
    last = out[:, -1:]
    for d, tok in enumerate(path_tokens, start=1):
        last = head(last, emb(torch.tensor([[tok]])), torch.tensor([n - 1 + d]), cache)
    return torch.log_softmax(head.logits(last[0, -1]), dim=-1)


def _recording(expand):
    calls = []

    def wrapped(tree, beam, *topk):
        logp, ids = expand(tree, beam, *topk)
        calls.append((list(beam), logp, ids))
        return logp, ids

    return wrapped, calls


@pytest.mark.parametrize("norm_before_residual", [False, True])
def test_tree_matches_sequential(norm_before_residual):
    head = make_head(norm_before_residual=norm_before_residual)
    emb = embedding()
    prompt, feats = tokens(12), features(11)
    drafter = Eagle3Drafter(head, emb)
    root_logp, root_ids = drafter.begin(prompt, feats, topk=2)
    expand, calls = _recording(drafter.expand)
    tree = grow_tree(root_logp, root_ids, expand, depth=3)
    assert len(tree) == 2 + 2 * 4 and len(calls) == 2

    memo: dict[tuple[int, ...], torch.Tensor] = {}

    def seq(path_tokens: list[int]) -> torch.Tensor:
        key = tuple(path_tokens)
        if key not in memo:
            with torch.no_grad():
                memo[key] = _sequential_child_logp(head, emb, prompt, feats, path_tokens)
        return memo[key]

    vals, draft_ids = seq([]).topk(2)
    torch.testing.assert_close(root_logp, vals, atol=1e-10, rtol=0)
    assert torch.equal(root_ids, head.to_target_ids(draft_ids))
    for beam, logp, ids in calls:
        for row, node in enumerate(beam):
            vals, draft_ids = seq([tree.tokens[n] for n in tree.path(node)]).topk(2)
            torch.testing.assert_close(logp[row], vals, atol=1e-10, rtol=0)
            assert torch.equal(ids[row], head.to_target_ids(draft_ids))
    # cumulative probabilities of every node equal the product along its sequential path
    for node in range(len(tree)):
        path = tree.path(node)
        p = 1.0
        for depth, n in enumerate(path):
            draft_id = int(head.t2d[: tree.tokens[n]].sum())  # target id -> draft id (sorted map)
            p *= float(seq([tree.tokens[m] for m in path[:depth]])[draft_id].exp())
        assert tree.probs[node] == pytest.approx(p, rel=1e-9)


def test_expand_runs_missing_ancestors():
    """Expanding a deep node whose ancestors were never expanded gives the same result as the beam path."""
    head, emb = make_head(), embedding()
    prompt, feats = tokens(8), features(7)
    d1 = Eagle3Drafter(head, emb)
    tree = grow_tree(*d1.begin(prompt, feats, topk=2), d1.expand, depth=3)
    deep = [n for n in range(len(tree)) if tree.depths[n] == 3]
    expected = d1.expand(tree, deep)
    d2 = Eagle3Drafter(head, emb)
    d2.begin(prompt, feats, topk=2)
    got = d2.expand(tree, deep[::-1])
    torch.testing.assert_close(got[0], expected[0].flip(0), atol=1e-10, rtol=0)
    assert torch.equal(got[1], expected[1].flip(0))


def test_begin_across_steps_matches_fresh():
    head, emb = make_head(), embedding()
    n = 15
    toks, feats = tokens(n + 1), features(n)
    p = 6
    step = Eagle3Drafter(head, emb)
    tree = grow_tree(*step.begin(toks[:, : p + 1], feats[:, :p], topk=3), step.expand, depth=4)
    assert len(step.cache) > step.slots.n[0] == p  # tree entries are in the cache
    # step 2: the previous root and three accepted tokens get their hidden states; a new root follows
    q = p + 4
    logp, ids = step.begin(toks[:, p + 1 : q + 1], feats[:, p:q], topk=3)
    tree = grow_tree(logp, ids, step.expand, depth=2)
    assert len(tree) == 3 + 9
    logp, ids = step.begin(toks[:, q + 1 :], feats[:, q:], topk=3)
    assert len(step.cache) == step.slots.n[0] == n

    fresh = Eagle3Drafter(head, emb)
    logp_f, ids_f = fresh.begin(toks, feats, topk=3)
    torch.testing.assert_close(logp, logp_f, atol=1e-10, rtol=0)
    assert torch.equal(ids, ids_f)
    torch.testing.assert_close(step.cache.k, fresh.cache.k, atol=1e-10, rtol=0)

    step.reset()
    logp_r, _ = step.begin(toks, feats, topk=3)
    torch.testing.assert_close(logp_r, logp_f, atol=1e-12, rtol=0)


def _manual_single_position(head, feat, emb_vec):
    """Independent formula for one entry with an empty cache (attention over itself = its value)."""
    c = head.config
    layer = head.midlayer

    def rms(x, w):
        return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c.rms_norm_eps)

    hidden = feat @ head.fc.weight.T
    normed = rms(hidden, layer.hidden_norm.weight)
    residual = normed if c.norm_before_residual else hidden
    x = torch.cat([rms(emb_vec, layer.input_layernorm.weight), normed])
    v = (x @ layer.self_attn.v_proj.weight.T).view(c.num_key_value_heads, c.head_dim)
    attn = v.repeat_interleave(c.num_attention_heads // c.num_key_value_heads, dim=0).reshape(-1)
    h = residual + attn @ layer.self_attn.o_proj.weight.T
    m = layer.mlp
    y = rms(h, layer.post_attention_layernorm.weight)
    gated = torch.nn.functional.silu(y @ m.gate_proj.weight.T) * (y @ m.up_proj.weight.T)
    h = h + gated @ m.down_proj.weight.T
    return torch.log_softmax(rms(h, head.norm.weight) @ head.lm_head.weight.T, dim=-1)


def test_norm_before_residual_both_branches():
    emb = embedding()
    prompt, feats = tokens(2), features(1)
    results = {}
    for flag in (False, True):
        head = make_head(seed=5, norm_before_residual=flag)
        logp, ids = Eagle3Drafter(head, emb).begin(prompt, feats, topk=DRAFT_VOCAB)
        with torch.no_grad():
            ref = _manual_single_position(head, feats[0, 0], emb(prompt[0, 1]))
        vals, draft_ids = ref.topk(DRAFT_VOCAB)
        torch.testing.assert_close(logp, vals, atol=1e-10, rtol=0)
        assert torch.equal(ids, head.to_target_ids(draft_ids))
        results[flag] = logp
    assert (results[True] - results[False]).abs().max() > 1e-3


@pytest.mark.parametrize(
    "rope_scaling",
    [
        None,
        {"rope_type": "linear", "factor": 2.0},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ],
)
def test_position_shift_invariance(rope_scaling):
    """EAGLE numbers head entries from h_0's position, speculators from token 1's: equivalent under RoPE."""
    head = make_head(rope_scaling=rope_scaling)
    emb = embedding()
    prompt, feats = tokens(10), features(9)
    x, e = head.project(feats), emb(prompt[:, 1:])
    with torch.no_grad():
        a = head(x, e, torch.arange(9))
        b = head(x, e, torch.arange(9) + 1)
        c = head(x, e, torch.arange(9) * 2)
    torch.testing.assert_close(a, b, atol=1e-10, rtol=0)
    assert (a - c).abs().max() > 1e-6  # positions do matter, only their differences count


def test_with_tiny_moe_target():
    """End to end with a real (tiny) HF MoE target: features from hidden_states[aux], target embedding."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    tcfg = Qwen3MoeConfig(
        vocab_size=VOCAB,
        hidden_size=TARGET_H,
        intermediate_size=64,
        moe_intermediate_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts=8,
        num_experts_per_tok=2,
        head_dim=8,
    )
    target = Qwen3MoeForCausalLM(tcfg).eval()  # float32: grouped-mm experts reject float64
    head = make_head(hidden_size=TARGET_H, aux_hidden_layers=(1, 2, 4))
    drafter = Eagle3Drafter(head, target.get_input_embeddings())
    assert drafter.hidden_layers == (1, 2, 4) and drafter.vocab_size == VOCAB
    prompt = tokens(9)
    with torch.no_grad():
        hs = target(prompt[:, :-1], output_hidden_states=True).hidden_states
    feats = torch.cat([hs[i] for i in drafter.hidden_layers], dim=-1)
    tree = grow_tree(*drafter.begin(prompt, feats, topk=2), drafter.expand, depth=3)
    assert len(tree) == 10 and all(0 <= t < VOCAB for t in tree.tokens)
    assert all(bool(head.t2d[t]) for t in tree.tokens)  # only draft-vocab tokens are proposed


def test_a_head_that_drafted_in_generate_still_trains():
    """The decode loops run under torch.inference_mode; what the head caches there (its RoPE table) must not break a
    later training step (autograd cannot save an inference tensor for backward)."""
    import ecospec
    from ecospec.models.loading import tiny_model

    target = tiny_model("qwen3_moe-a", seed=0)
    h, v = target.config.hidden_size, target.config.vocab_size
    head = Eagle3Head(
        Eagle3Config(
            hidden_size=h,
            intermediate_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            vocab_size=v,
            draft_vocab_size=v,
            target_hidden_size=h,
            aux_hidden_layers=(1, 2),
        )
    )
    init_random_weights(head, std=0.3, seed=0)
    drafter = Eagle3Drafter(head, target.get_input_embeddings())
    ecospec.generate(target, torch.randint(3, v, (1, 8)), drafter=drafter, max_new_tokens=6)
    assert head.midlayer.self_attn._rope[0].is_inference()  # cached while drafting
    x = torch.randn(1, 4, h, requires_grad=True)
    head(x, torch.randn(1, 4, h), torch.arange(4)).sum().backward()
    assert x.grad is not None


def test_config_validation():
    with pytest.raises(ValueError):
        make_config(aux_hidden_layers=())
    with pytest.raises(ValueError):
        make_config(num_key_value_heads=3)
    with pytest.raises(ValueError):
        make_config(rope_scaling={"rope_type": "longrope"})
    assert make_config(rope_scaling={"type": "default"}).rope_scaling is None
    assert make_config(aux_hidden_layers=[2, 3, 4]).aux_hidden_layers == (2, 3, 4)
