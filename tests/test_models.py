"""Family adapters, tiny presets and loading."""

from __future__ import annotations

import pytest
import torch
from transformers import DeepseekV3Config, LlamaConfig, LlamaForCausalLM, Qwen3MoeConfig

from ecospec.engine.forward import attention_layout
from ecospec.models import (
    PRESETS,
    UnsupportedModelError,
    config_moe_info,
    load_target,
    moe_info,
    perturbed_copy,
    routers,
    tiny_config,
    tiny_model,
)

FAMILIES = {"qwen3_moe", "gpt_oss", "deepseek_v3", "mixtral"}


def _expected_moe_layers(cfg) -> tuple[int, ...]:
    n = cfg.num_hidden_layers
    if cfg.model_type == "qwen3_moe":
        return tuple(i for i in range(n) if i not in cfg.mlp_only_layers and (i + 1) % cfg.decoder_sparse_step == 0)
    if cfg.model_type == "deepseek_v3":
        return tuple(range(cfg.first_k_dense_replace, n))
    return tuple(range(n))


def _expected_expert_params(cfg) -> int:
    h = cfg.hidden_size
    if cfg.model_type == "gpt_oss":  # gate_up [H, 2I] + bias [2I], down [I, H] + bias [H]
        i = cfg.intermediate_size
        return 3 * h * i + 2 * i + h
    i = cfg.intermediate_size if cfg.model_type == "mixtral" else cfg.moe_intermediate_size
    return 3 * h * i


def test_presets_cover_every_family_twice():
    counts = {f: sum(p.startswith(f + "-") for p in PRESETS) for f in FAMILIES}
    assert all(c >= 2 for c in counts.values()), counts


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_preset_moe_info(preset):
    model = tiny_model(preset)
    cfg = model.config
    info = moe_info(model)
    assert info.family == cfg.model_type == preset.split("-")[0]
    assert info.num_layers == cfg.num_hidden_layers
    assert info.moe_layers == _expected_moe_layers(cfg)
    assert info.num_experts == (cfg.num_experts if cfg.model_type == "qwen3_moe" else cfg.num_local_experts)
    assert info.top_k == cfg.num_experts_per_tok
    assert info.expert_params == _expected_expert_params(cfg)
    if cfg.model_type == "deepseek_v3":
        shared = 3 * cfg.hidden_size * cfg.moe_intermediate_size * cfg.n_shared_experts
        assert info.shared_expert_params == shared
    else:
        assert info.shared_expert_params == 0
    total = sum(p.numel() for p in model.parameters())
    assert info.expert_params * info.num_experts * len(info.moe_layers) + info.dense_params == total
    assert info.total_params == total
    assert len(routers(model)) == len(info.moe_layers)
    # config_moe_info builds the same model on the meta device
    assert config_moe_info(cfg) == info


def test_dense_layers_are_excluded():
    assert moe_info(tiny_model("qwen3_moe-b")).moe_layers == (1, 3)
    assert moe_info(tiny_model("deepseek_v3-a")).moe_layers == (1, 2)
    assert moe_info(tiny_model("deepseek_v3-b")).moe_layers == (2, 3)
    sparse_step = tiny_model("qwen3_moe-a", decoder_sparse_step=2, num_hidden_layers=4)
    assert moe_info(sparse_step).moe_layers == (1, 3)


def test_attention_layouts():
    """Sliding windows per family, as the engine's masks apply them (see engine/forward.py)."""
    g = attention_layout(tiny_config("gpt_oss-a"))
    assert g.by_type and g.windows == {"full_attention": None, "sliding_attention": 8}
    assert attention_layout(tiny_config("gpt_oss-b")).windows["sliding_attention"] == 16
    m = attention_layout(tiny_config("mixtral-b"))
    assert not m.by_type and m.windows == {"sliding_attention": 12}
    assert attention_layout(tiny_config("mixtral-a")).windows == {"full_attention": None}
    assert attention_layout(tiny_config("qwen3_moe-a")).windows == {"full_attention": None}
    # Qwen3 ignores sliding_window unless use_sliding_window
    assert attention_layout(tiny_config("qwen3_moe-a", sliding_window=10)).windows == {"full_attention": None}
    q = attention_layout(tiny_config("qwen3_moe-a", sliding_window=10, use_sliding_window=True))
    assert q.windows == {"sliding_attention": 10}
    assert attention_layout(tiny_config("deepseek_v3-a")).windows == {"full_attention": None}


def test_full_size_configs_on_meta():
    # Qwen3-235B-A22B and DeepSeek-V3 shapes: counted without allocating anything
    qwen = Qwen3MoeConfig(
        vocab_size=151936,
        hidden_size=4096,
        intermediate_size=12288,
        moe_intermediate_size=1536,
        num_hidden_layers=94,
        num_attention_heads=64,
        num_key_value_heads=4,
        head_dim=128,
        num_experts=128,
        num_experts_per_tok=8,
    )
    info = config_moe_info(qwen)
    assert info.num_experts == 128 and info.top_k == 8 and len(info.moe_layers) == 94
    assert 234.5e9 < info.total_params < 235.5e9
    assert 21.5e9 < info.active_params < 22.5e9
    ds = config_moe_info(DeepseekV3Config())
    assert ds.moe_layers == tuple(range(3, 61))
    assert 670e9 < ds.total_params < 672e9
    assert ds.shared_expert_params == ds.expert_params  # one shared expert of the routed size


def test_unsupported_model():
    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    llama = LlamaForCausalLM(cfg)
    with pytest.raises(UnsupportedModelError, match="LlamaForCausalLM.*supported.*Qwen3MoeForCausalLM"):
        moe_info(llama)
    with pytest.raises(UnsupportedModelError):
        routers(llama)
    with pytest.raises(UnsupportedModelError, match="llama"):
        config_moe_info(cfg)


def test_unknown_preset():
    with pytest.raises(ValueError, match="available presets: .*mixtral-a"):
        tiny_model("nope")


def test_tiny_model_determinism_and_overrides():
    ids = torch.tensor([[1, 5, 9, 200, 17, 3]])
    a, b, c = (tiny_model("mixtral-a", seed=s) for s in (3, 3, 4))
    with torch.no_grad():
        la, lb, lc = a(ids).logits, b(ids).logits, c(ids).logits
    assert torch.equal(la, lb)
    assert not torch.allclose(la, lc)
    assert not a.training and a.config._attn_implementation == "eager"
    state = torch.random.get_rng_state()
    tiny_model("mixtral-a", seed=5)
    assert torch.equal(state, torch.random.get_rng_state())  # global RNG untouched
    m = tiny_model("mixtral-a", num_experts_per_tok=3)
    assert moe_info(m).top_k == 3
    assert tiny_model("qwen3_moe-a", dtype=torch.bfloat16).model.embed_tokens.weight.dtype == torch.bfloat16


def test_tiny_logits_are_not_flat():
    model = tiny_model("qwen3_moe-a")
    ids = torch.randint(3, 256, (1, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(ids).logits[0]
    top2 = logits.topk(2, dim=-1).values
    assert logits.std() > 0.5
    assert (top2[:, 0] - top2[:, 1]).median() > 0.05


def test_perturbed_copy():
    model = tiny_model("deepseek_v3-a")
    ids = torch.randint(3, 256, (1, 48), generator=torch.Generator().manual_seed(0))
    draft = perturbed_copy(model, scale=0.05, seed=1)
    again = perturbed_copy(model, scale=0.05, seed=1)
    with torch.no_grad():
        lt, ld, la = model(ids).logits[0], draft(ids).logits[0], again(ids).logits[0]
    assert torch.equal(ld, la)
    agree = (lt.argmax(-1) == ld.argmax(-1)).float().mean().item()
    assert 0.0 < agree < 1.0
    # original untouched, norms (constant at init) kept
    for (n, p), q in zip(model.named_parameters(), draft.parameters(), strict=True):
        if p.std() == 0:
            assert torch.equal(p, q), n
    assert any(not torch.equal(p, q) for p, q in zip(model.parameters(), draft.parameters(), strict=True))


@pytest.mark.parametrize("preset", ["qwen3_moe-a", "gpt_oss-a", "deepseek_v3-a", "mixtral-b"])
def test_load_target_round_trip(preset, tmp_path):
    model = tiny_model(preset)
    model.save_pretrained(tmp_path)
    loaded = load_target(str(tmp_path), dtype=torch.float32, attn_implementation="eager")
    assert type(loaded) is type(model) and not loaded.training
    assert moe_info(loaded) == moe_info(model)
    ids = torch.randint(3, 256, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5)


def test_load_target_unsupported(tmp_path):
    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    with pytest.raises(UnsupportedModelError, match="llama"):
        load_target(str(tmp_path))


def test_loaded_storage_says_what_runs_not_what_was_stored():
    """env.storage: the loaded formats, the implementations, the bytes per device; a quantized checkpoint whose
    weights loaded as floats says `dequantized to ...` (what transformers does without its kernels)."""
    import torch

    from ecospec.models import tiny_model
    from ecospec.models.storage import loaded_storage

    m = tiny_model("qwen3_moe-a")
    st = loaded_storage(m)
    total = sum(p.numel() * p.element_size() for p in m.parameters())
    assert (st["experts"], st["dense"], st["stored"]) == ("fp32", "fp32", None)
    assert st["devices"] == {"cpu": total} and st["attn_implementation"] == "eager"
    m = m.to(torch.bfloat16)
    assert (loaded_storage(m)["experts"], loaded_storage(m)["dense"]) == ("bf16", "bf16")
    m.config.quantization_config = {"quant_method": "mxfp4"}  # GPT-OSS-style: experts stored mxfp4, dense bf16
    assert (loaded_storage(m)["experts"], loaded_storage(m)["dense"]) == ("dequantized to bf16", "bf16")
    m.config.quantization_config = {"quant_method": "fp8", "weight_block_size": [32, 32]}  # block-FP8: everything
    assert (loaded_storage(m)["experts"], loaded_storage(m)["dense"]) == ("dequantized to bf16", "dequantized to bf16")
    layer = m.model.layers[0].mlp.experts
    layer.down_proj.data = layer.down_proj.data.to(torch.float8_e4m3fn)  # kept in FP8 where its kernels run
    assert loaded_storage(m)["experts"] == "fp8" and loaded_storage(m)["stored"] == "fp8"


def test_a_quantized_format_that_will_not_be_kept_is_said_before_loading(tmp_path):
    """A checkpoint whose MXFP4 / FP8 weights transformers would dequantize here gets one line naming what happens
    and the two ways out, before any weights are read; a plain checkpoint gets none."""
    import warnings

    import pytest
    from transformers import AutoConfig

    from ecospec.models import tiny_model
    from ecospec.models.loading import load_target
    from ecospec.models.storage import format_fork, loaded_storage

    cfg = AutoConfig.for_model("qwen3_moe")
    assert format_fork(cfg, "cpu") is None  # nothing quantized: nothing to say
    cfg.quantization_config = {"quant_method": "mxfp4"}
    line = format_fork(cfg, "cpu", "openai/gpt-oss-120b")
    assert "\n" not in line and "dequantize them to bf16" in line and "a CUDA GPU" in line
    assert "pip install -e .[gpu]" in line and "--kernels no" in line
    cfg.quantization_config = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    assert "its weights in fp8" in format_fork(cfg, "cpu")
    m = tiny_model("qwen3_moe-a")
    m.save_pretrained(tmp_path / "plain")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a plain checkpoint loads without the warning
        load_target(str(tmp_path / "plain"))
    cfg = AutoConfig.from_pretrained(tmp_path / "plain")
    cfg.quantization_config = {"quant_method": "mxfp4"}
    cfg.save_pretrained(tmp_path / "plain")
    with pytest.warns(UserWarning, match="dequantize them to bf16"):  # said before the weights are read
        model = load_target(str(tmp_path / "plain"))
    st = loaded_storage(model)  # the record says what ran: the stored format was not kept
    assert st["stored"] == "mxfp4" and st["experts"] == "dequantized to fp32" and st["dense"] == "fp32"
