"""DeepSeek MTP drafter: lossless greedy SD with real acceptance, hidden/token alignment in the loop, tree vs
sequential drafting, concat order, checkpoint round trips (single file, sharded index), refusal of bad
checkpoints, FP8 block dequantisation."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from conftest import prompt
from safetensors.torch import load_file, save_file

import ecospec
from ecospec.drafters.mtp import MtpDrafter, MtpHead, init_random_weights
from ecospec.drafters.mtp_checkpoint import CheckpointError, dequantize_fp8, load_mtp, save_mtp
from ecospec.engine.tree import DraftTree, grow_tree
from ecospec.models.loading import tiny_model

PRESETS = ["deepseek_v3-a", "deepseek_v3-b"]
SETTINGS = [(4, 3, 2), (2, 1, 1), (6, 4, 3)]  # (gamma, depth, topk)


def _fit(head: MtpHead, target, seqs: torch.Tensor, steps: int = 30, lr: float = 1e-2) -> MtpHead:
    """Teacher-forced training on the target's own greedy text (entry i: h_i, t_{i+1} -> t_{i+2}), enough
    for the head to memorise those continuations: a useful drafter on prompts it was trained on."""
    with torch.no_grad():
        hidden = target(seqs, output_hidden_states=True).hidden_states[target.config.num_hidden_layers]
    opt = torch.optim.Adam(head.parameters(), lr=lr)
    positions = torch.arange(seqs.shape[1] - 2)
    for _ in range(steps):
        logits, _ = head(seqs[:, 1:-1], hidden[:, :-2], positions)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), seqs[:, 2:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return head.eval()


@pytest.fixture(scope="module")
def trained():
    """preset -> (float64 target, head trained on the greedy continuations of `prompts`, prompts [6, 10])."""
    cache = {}

    def get(preset: str):
        if preset not in cache:
            target = tiny_model(preset, dtype=torch.float64)
            prompts = torch.cat([prompt(10, 256, seed=s) for s in range(6)])
            seqs = target.generate(prompts, max_new_tokens=30, do_sample=False, eos_token_id=None, pad_token_id=0)
            head = _fit(init_random_weights(MtpHead.for_target(target), std=0.1), target, seqs)
            cache[preset] = (target, head, prompts)
        return cache[preset]

    return get


@pytest.mark.parametrize("preset", PRESETS)
def test_lossless_greedy_with_acceptance(trained, preset):
    target, head, prompts = trained(preset)
    cases = [(prompts[:1], s, sel) for s in SETTINGS for sel in ("confidence", "ecospec", "oracle")]
    cases.append((prompt(10, 256, seed=99), SETTINGS[0], "confidence"))  # a prompt the head never saw
    accepted_any = rejected_any = False
    ar = {}
    for ids, (gamma, depth, topk), selector in cases:
        key = tuple(ids[0].tolist())
        if key not in ar:
            ar[key] = ecospec.generate(target, ids, max_new_tokens=20, eos_token_id=[]).tokens
        sd = ecospec.generate(
            target,
            ids,
            drafter=MtpDrafter(head, target),
            selector=selector,
            predictor=None if selector == "confidence" else "oracle",
            gamma=gamma,
            depth=depth,
            topk=topk,
            max_new_tokens=20,
            eos_token_id=[],
        )
        assert sd.tokens == ar[key], (preset, gamma, depth, topk, selector)
        accepted_any |= sd.alpha > 1
        rejected_any |= any(s.accepted < s.verified for s in sd.steps)
    assert accepted_any and rejected_any


@pytest.mark.parametrize("preset", PRESETS)
def test_root_distribution_matches_fresh_head(trained, preset):
    """At every SD step the drafter's root children equal those of a fresh head fed one full target forward
    over the committed sequence (catches any off-by-one between hidden states and tokens across steps,
    including steps where several drafted tokens were accepted)."""
    target, head, prompts = trained(preset)
    drafter = MtpDrafter(head, target)
    roots = []
    real_begin = drafter.begin_rows

    def spy(new_tokens, new_hidden, topk, depth=None):
        out = real_begin(new_tokens, new_hidden, topk, depth)
        roots.append((out[0][0], out[1][0]))  # one sequence: row 0
        return out

    drafter.begin_rows = spy
    ids = prompts[1:2]
    sd = ecospec.generate(target, ids, drafter=drafter, gamma=4, depth=3, topk=2, max_new_tokens=16, eos_token_id=[])
    assert max(s.accepted for s in sd.steps) >= 3  # multi-token steps happened
    full = torch.cat([ids, torch.tensor([sd.tokens])], 1)
    committed = ids.shape[1] + 1  # the prefill gives the first token
    layer = target.config.num_hidden_layers
    assert drafter.hidden_layers == (layer,)
    for step, (logp, tok) in zip(sd.steps, roots, strict=True):
        seq = full[:, :committed]
        with torch.no_grad():
            hidden = target(seq[:, :-1], output_hidden_states=True).hidden_states[layer]
        fresh_logp, fresh_tok = MtpDrafter(head, target).begin(seq, hidden, 2)
        # not bit-exact: norms, RoPE, router and attention softmax of transformers' DeepSeek code run in
        # float32 even for a float64 model, and cached vs one-shot target forwards round differently
        torch.testing.assert_close(logp, fresh_logp, rtol=1e-5, atol=1e-5)
        assert torch.equal(tok, fresh_tok)
        committed += step.accepted


def test_hidden_index_is_after_final_norm():
    """hidden_states[num_hidden_layers] (what the drafter asks for) is the last layer's output after model.norm."""
    target = tiny_model("deepseek_v3-a", dtype=torch.float64)
    ids = prompt(7, 256)
    seen = {}
    hook = target.model.layers[-1].register_forward_hook(lambda m, a, out: seen.setdefault("raw", out))
    with torch.no_grad():
        hs = target(ids, output_hidden_states=True).hidden_states
    hook.remove()
    assert len(hs) == target.config.num_hidden_layers + 1
    torch.testing.assert_close(hs[-1], target.model.norm(seen["raw"]), rtol=0, atol=0)
    assert not torch.allclose(hs[-1], seen["raw"])


def _sequential_child_logp(head, prompt_ids, hidden, path_tokens):
    """Reference: one entry at a time through a plain causal cache, chaining the head's own output."""
    from transformers import DynamicCache

    cache = DynamicCache()
    n = hidden.shape[1]
    logits, out = head(prompt_ids[:, 1:], hidden, torch.arange(n), cache)
    logits, last = logits[:, -1:], out[:, -1:]
    for d, tok in enumerate(path_tokens, start=1):
        logits, last = head(torch.tensor([[tok]]), last, torch.tensor([n - 1 + d]), cache)
    return torch.log_softmax(logits[0, -1], dim=-1)


def test_tree_matches_sequential(trained):
    target, head, prompts = trained("deepseek_v3-a")
    ids = prompts[2:3, :9]
    with torch.no_grad():
        hidden = target(ids[:, :-1], output_hidden_states=True).hidden_states[-1]
    drafter = MtpDrafter(head, target)
    calls = []

    def expand(tree, beam, k):
        out = drafter.expand(tree, beam, k)
        calls.append((list(beam), *out))
        return out

    tree = grow_tree(*drafter.begin(ids, hidden, 2), expand, depth=3)
    assert len(tree) == 2 + 2 * 4 and len(calls) == 2
    tol = dict(rtol=0, atol=1e-6)  # float32 internals of transformers' DeepSeek layer (see above)
    with torch.no_grad():
        ref = _sequential_child_logp(head, ids, hidden, [])
        torch.testing.assert_close(torch.tensor(tree.probs[:2], dtype=torch.float64).log(), ref.topk(2).values, **tol)
        for beam, logp, tok in calls:
            for row, node in enumerate(beam):
                path = [tree.tokens[n] for n in tree.path(node)]
                vals, want = _sequential_child_logp(head, ids, hidden, path).topk(2)
                torch.testing.assert_close(logp[row], vals, **tol)
                assert torch.equal(tok[row], want)


def test_concat_order_embedding_first():
    """eh_proj's first H input columns read enorm(embedding), the last H read hnorm(hidden)."""
    target = tiny_model("deepseek_v3-b", dtype=torch.float64)
    head = init_random_weights(MtpHead.for_target(target), seed=3)
    h = target.config.hidden_size
    ids = torch.tensor([[5, 9, 11]])
    hid_a, hid_b = torch.randn(2, 1, 3, h, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    pos = torch.arange(3)
    with torch.no_grad():
        head.eh_proj.weight[:, h:] = 0  # hidden ignored: output depends on tokens only
        torch.testing.assert_close(head(ids, hid_a, pos)[1], head(ids, hid_b, pos)[1], rtol=0, atol=0)
        head.eh_proj.weight.normal_(generator=torch.Generator().manual_seed(1))
        head.eh_proj.weight[:, :h] = 0  # tokens ignored
        torch.testing.assert_close(head(ids, hid_a, pos)[1], head(ids + 1, hid_a, pos)[1], rtol=0, atol=0)
        assert (head(ids, hid_a, pos)[1] - head(ids, hid_b, pos)[1]).abs().max() > 1e-3


def test_drafter_errors():
    target = tiny_model("deepseek_v3-a", dtype=torch.float64)
    head = init_random_weights(MtpHead(target.config).double())
    with pytest.raises(ValueError, match="tie"):
        MtpDrafter(head).begin(prompt(4, 256), torch.zeros(1, 3, 48, dtype=torch.float64), 2)
    drafter = MtpDrafter(head, target)
    with pytest.raises(ValueError, match="width"):
        drafter.begin(prompt(4, 256), torch.zeros(1, 3, 47, dtype=torch.float64), 2)
    with pytest.raises(ValueError, match="hidden"):
        drafter.begin(prompt(4, 256), None, 2)
    with pytest.raises(RuntimeError, match="before begin"):
        tree = DraftTree()
        tree.add(7, -1, 0.5)
        drafter.expand(tree, [0])


# ---------------------------------------------------------------------------------------------------
# checkpoints
# ---------------------------------------------------------------------------------------------------


def _same_head(a: MtpHead, b: MtpHead, target) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    ids = prompt(9, 256, seed=4)
    with torch.no_grad():
        hidden = target(ids[:, :-1], output_hidden_states=True).hidden_states[-1]
    la, ta = MtpDrafter(a, target).begin(ids, hidden, 3)
    lb, tb = MtpDrafter(b, target).begin(ids, hidden, 3)
    assert torch.equal(la, lb) and torch.equal(ta, tb)


@pytest.mark.parametrize("preset", PRESETS)
def test_round_trip_single_file(tmp_path, preset):
    target = tiny_model(preset, dtype=torch.float64)
    head = init_random_weights(MtpHead.for_target(target), seed=2)
    save_mtp(head, tmp_path)
    keys = load_file(tmp_path / "model.safetensors").keys()
    n = target.config.num_hidden_layers
    assert all(k.startswith(f"model.layers.{n}.") for k in keys)
    assert f"model.layers.{n}.mlp.experts.0.gate_proj.weight" in keys and f"model.layers.{n}.enorm.weight" in keys
    assert not any("embed_tokens" in k or "shared_head.head" in k for k in keys)  # shared with the target
    loaded = load_mtp(tmp_path, target.config)  # dtype: as stored (float64)
    assert loaded.dtype == torch.float64 and loaded.embed_tokens is None and loaded.shared_head.head is None
    _same_head(head, loaded, target)
    assert load_mtp(tmp_path).config.num_hidden_layers == n  # config.json of the directory


def test_round_trip_sharded_reads_only_mtp_shards(tmp_path):
    """A sharded checkpoint whose index also lists main-model shards: only the MTP shards are opened."""
    target = tiny_model("deepseek_v3-a", dtype=torch.float64)
    head = MtpHead(target.config, has_embed_tokens=True, has_lm_head=True).double()
    init_random_weights(head, seed=5)
    save_mtp(head, tmp_path, shards=3)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == 3
    (tmp_path / "model-main.safetensors").write_bytes(b"not a safetensors file: must never be opened")
    index["weight_map"].update({"model.embed_tokens.weight": "model-main.safetensors"})
    index["weight_map"].update({f"model.layers.{i}.mlp.gate.weight": "model-main.safetensors" for i in range(3)})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    loaded = load_mtp(tmp_path, target.config)
    assert loaded.embed_tokens is not None and loaded.shared_head.head is not None  # own copies win
    _same_head(head, loaded, target)
    bf16 = load_mtp(tmp_path, target.config, dtype=torch.bfloat16)
    assert bf16.eh_proj.weight.dtype == torch.bfloat16
    assert bf16.decoder.mlp.gate.weight.dtype == torch.float32  # router kept in float32, as transformers does


def test_bad_checkpoint_one_error_naming_all_keys(tmp_path):
    target = tiny_model("deepseek_v3-a", dtype=torch.float64)
    save_mtp(init_random_weights(MtpHead.for_target(target)), tmp_path)
    n = target.config.num_hidden_layers
    p = f"model.layers.{n}."
    tensors = load_file(tmp_path / "model.safetensors")
    for k in ("enorm.weight", "mlp.experts.3.up_proj.weight", "mlp.gate.e_score_correction_bias"):
        del tensors[p + k]
    tensors[p + "self_attn.q_proj.weight"] = torch.zeros(4, 4)
    tensors[p + "eh_proj.weight"] = torch.zeros(48, 48)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError) as info:
        load_mtp(tmp_path, target.config)
    err, msg = info.value, str(info.value)
    assert len(err.missing) == 3 and len(err.unexpected) == 1 and len(err.misshaped) == 1
    for key in ("enorm.weight (expected shape [48])", "mlp.experts.3.up_proj.weight (expected shape [32, 48])"):
        assert p + key in msg
    assert p + "mlp.gate.e_score_correction_bias" in msg and p + "self_attn.q_proj.weight" in msg
    assert f"{p}eh_proj.weight: got [48, 48], expected [48, 96]" in msg
    with pytest.raises(CheckpointError, match=r"no `model\.layers\.7\.\*` tensors"):
        load_mtp(tmp_path, target.config, layer=7)


def test_dequantize_fp8_by_hand():
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(5, 7, generator=g) * 3).to(torch.float8_e4m3fn)
    scale = torch.rand(3, 4, generator=g) + 0.5  # blocks of 2 x 2, the last row/column partial
    got = dequantize_fp8(w, scale, (2, 2))
    want = torch.empty(5, 7)
    for i in range(5):
        for j in range(7):
            want[i, j] = float(w[i, j].float()) * float(scale[i // 2, j // 2])
    assert got.dtype == torch.float32 and torch.equal(got, want)
    with pytest.raises(ValueError, match="does not tile"):
        dequantize_fp8(w, scale[:, :3], (2, 2))


def _quantize(w: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Test-side block FP8 quantisation: scale = block amax / 448 (e4m3 max)."""
    out, inp = w.shape
    bo, bi = -(-out // block), -(-inp // block)
    padded = torch.zeros(bo * block, bi * block, dtype=torch.float32)
    padded[:out, :inp] = w.float()
    amax = padded.abs().reshape(bo, block, bi, block).amax(dim=(1, 3)).clamp_min(1e-12)
    scale = amax / 448.0
    q = (w.float() / scale.repeat_interleave(block, 0).repeat_interleave(block, 1)[:out, :inp]).to(torch.float8_e4m3fn)
    return q, scale


def test_fp8_checkpoint_is_dequantised(tmp_path):
    target = tiny_model("deepseek_v3-a", dtype=torch.float64)
    cfg = target.config
    quant = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [16, 16]}
    cfg_q = type(cfg).from_dict({**cfg.to_dict(), "quantization_config": quant})
    save_mtp(init_random_weights(MtpHead.for_target(target), seed=7), tmp_path)
    p = f"model.layers.{cfg.num_hidden_layers}."
    tensors = load_file(tmp_path / "model.safetensors")
    quantised = [k for k in tensors if ("self_attn" in k or "experts" in k) and k.endswith("proj.weight")]
    expected = {}
    for k in quantised:
        q, scale = _quantize(tensors[k], 16)
        tensors[k], tensors[k + "_scale_inv"] = q, scale
        expected[k] = dequantize_fp8(q, scale, (16, 16))
    save_file(tensors, str(tmp_path / "model.safetensors"))
    loaded = load_mtp(tmp_path, cfg_q, dtype=torch.float64)
    assert loaded.dtype == torch.float64
    state = loaded.state_dict()
    torch.testing.assert_close(
        state["decoder.self_attn.q_a_proj.weight"], expected[p + "self_attn.q_a_proj.weight"].double(), rtol=0, atol=0
    )
    up5 = state["decoder.mlp.experts.gate_up_proj"][5, cfg.moe_intermediate_size :]
    torch.testing.assert_close(up5, expected[p + "mlp.experts.5.up_proj.weight"].double(), rtol=0, atol=0)
    assert torch.equal(state["eh_proj.weight"], tensors[p + "eh_proj.weight"])  # unquantised tensors untouched
    # an FP8 tensor without its scale is refused, with the others
    del tensors[p + "self_attn.o_proj.weight_scale_inv"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"self_attn\.o_proj\.weight_scale_inv"):
        load_mtp(tmp_path, cfg_q)
