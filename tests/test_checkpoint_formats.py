"""Quantized targets in their released on-disk formats, written here and loaded through `load_target`.

* GPT-OSS (openai/gpt-oss-*): routed experts as MXFP4, `*_blocks` (uint8, two FP4 E2M1 codes per byte, 32 values
  per group along the input dimension) and `*_scales` (uint8 E8M0 exponents, bias 127); the rest bf16.
* DeepSeek-V3 and Qwen3-MoE `-FP8`: every linear weight as float8_e4m3fn `weight` plus a float32
  `weight_scale_inv` per (32 x 32) block (the releases use 128), routed experts one module per expert as in the
  releases; embeddings, lm_head, routers, norms and DeepSeek's score-correction bias unquantized.

The encoders below are ours (OCP MX and DeepSeek block-FP8 rules); the values a checkpoint represents are computed
from the codes the encoders choose, never by decoding the bytes, so a wrong layout on either side fails the
comparison with what transformers loads. Off a CUDA GPU transformers dequantizes both formats as it loads, which is
what `format_fork` says beforehand and `loaded_storage` records afterwards.

The last tests check the routing capture against every experts implementation transformers runs on CPU.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, PretrainedConfig, PreTrainedModel
from transformers.integrations.finegrained_fp8 import ALL_FP8_EXPERTS_FUNCTIONS
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

import ecospec
from ecospec.drafters.draft_model import DraftModelDrafter
from ecospec.engine.routing import RoutingCapture
from ecospec.models.adapters import moe_info
from ecospec.models.loading import load_target, perturbed_copy, tiny_config, tiny_model
from ecospec.models.storage import format_fork, loaded_storage

CONF = ecospec.conf_dir() / "model"
BLOCK = 32  # FP8 block edge here (the releases: 128); MXFP4 groups are 32 values in every release

# ----------------------------------------------------------------------------------------------------
# encoders
# ----------------------------------------------------------------------------------------------------

FP4_E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)  # magnitudes, codes 0-7
E4M3_MAX = 448.0


def mxfp4_encode(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """OCP MX (v1.0) encoding of `w` [..., n] in groups of 32 along the last dimension: the shared exponent is
    floor(log2(amax)) - 2 (E2M1's largest exponent), each value rounds to the nearest E2M1 magnitude (clipped at 6)
    with its sign in bit 3. Returns (blocks uint8 [..., n/32, 16], low nibble = even element; scales uint8
    [..., n/32] = exponent + 127; the float64 values the codes represent, shaped like `w`)."""
    *lead, n = w.shape
    groups = w.double().reshape(*lead, n // 32, 32)
    amax = groups.abs().amax(-1, keepdim=True)
    exponent = torch.floor(torch.log2(amax.clamp_min(2.0**-126))) - 2
    exponent = torch.where(amax > 0, exponent, torch.full_like(amax, -127)).clamp(-127, 127)
    scaled = groups / torch.exp2(exponent)
    magnitude = (scaled.abs().unsqueeze(-1) - FP4_E2M1).abs().argmin(-1)  # nearest, ties to the smaller code
    negative = scaled < 0
    codes = (negative.to(torch.uint8) << 3) | magnitude.to(torch.uint8)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    represented = torch.where(negative, -1.0, 1.0).double() * FP4_E2M1[magnitude] * torch.exp2(exponent)
    return blocks, (exponent.squeeze(-1) + 127).to(torch.uint8), represented.reshape(w.shape)


def fp8_block_encode(w: torch.Tensor, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DeepSeek-V3 block FP8 of a 2-D weight [out, in]: one float32 `scale_inv` = amax / 448 per (block x block)
    tile (a partial tile at the edges, ceil-divided as the releases do), `weight` = w / scale_inv in
    float8_e4m3fn. Returns (weight, scale_inv [ceil(out/b), ceil(in/b)], the float64 values represented)."""
    rows, cols = w.shape
    grid = (-(-rows // block), -(-cols // block))
    padded = torch.zeros(grid[0] * block, grid[1] * block, dtype=torch.float64)
    padded[:rows, :cols] = w.double()
    amax = padded.reshape(grid[0], block, grid[1], block).abs().amax(dim=(1, 3))
    scale_inv = (amax / E4M3_MAX).float().clamp_min(2.0**-100)
    per_value = scale_inv.double().repeat_interleave(block, 0).repeat_interleave(block, 1)[:rows, :cols]
    weight = (w.double() / per_value).to(torch.float8_e4m3fn)
    return weight, scale_inv, weight.double() * per_value


# ----------------------------------------------------------------------------------------------------
# checkpoint writers
# ----------------------------------------------------------------------------------------------------


@dataclass
class Checkpoint:
    """A written checkpoint and what it represents: `reference` holds, for every tensor of the HF model's state
    dict, the float64 value the stored codes (or bf16 / fp32 tensors) stand for."""

    path: Path
    preset: str
    overrides: dict
    method: str  # quantization_config.quant_method
    conf: str  # conf/model/<conf>.yaml: the dtype and device_map a run passes to load_target
    reference: dict[str, torch.Tensor]

    def reference_model(self) -> PreTrainedModel:
        """The same architecture (eager kernels) holding the represented values in float32."""
        model = tiny_model(self.preset, **self.overrides)
        model.load_state_dict({n: t.float() for n, t in self.reference.items()}, strict=True)
        return model


def _save(path: Path, config: PretrainedConfig, tensors: dict[str, torch.Tensor]) -> None:
    """config.json (bf16, as the releases declare) and one model.safetensors."""
    config.dtype = torch.bfloat16
    config.save_pretrained(path)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"), {"format": "pt"})


def write_gpt_oss_mxfp4(path: Path, preset: str = "gpt_oss-a", **overrides) -> Checkpoint:
    """openai/gpt-oss layout: `experts.{gate_up,down}_proj_{blocks,scales}` quantized along each projection's input
    dimension (HF holds them [E, in, out], the checkpoint [E, out, in/32, 16]); expert biases, attention (with its
    sinks), routers, norms, embeddings and lm_head in bf16; the release's `modules_to_not_convert`."""
    model = tiny_model(preset, **overrides)
    tensors, reference = {}, {}
    for name, t in model.state_dict().items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            blocks, scales, represented = mxfp4_encode(t.transpose(1, 2))
            tensors[f"{name}_blocks"], tensors[f"{name}_scales"] = blocks, scales
            reference[name] = represented.transpose(1, 2)
        else:
            tensors[name] = t.to(torch.bfloat16)
            reference[name] = tensors[name].double()
    config = tiny_config(preset, **overrides)
    not_converted = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]
    config.quantization_config = {"quant_method": "mxfp4", "modules_to_not_convert": not_converted}
    _save(path, config, tensors)
    return Checkpoint(path, preset, overrides, "mxfp4", "gptoss", reference)


def _fp8_kept(name: str) -> bool:
    """Tensors the FP8 releases keep unquantized: 1-D ones (norms, biases), embeddings, lm_head, routers."""
    return name.endswith(("embed_tokens.weight", "lm_head.weight", "mlp.gate.weight", "e_score_correction_bias"))


def _qwen3_not_converted(config: PretrainedConfig) -> list[str]:
    """Qwen3-*-FP8's `modules_to_not_convert`: lm_head, the final norm and, per layer, norms and the router."""
    per_layer = ["input_layernorm", "mlp.gate", "post_attention_layernorm", "self_attn.k_norm", "self_attn.q_norm"]
    layers = [f"model.layers.{i}.{m}" for i in range(config.num_hidden_layers) for m in per_layer]
    return ["lm_head", "model.embed_tokens", *layers, "model.norm"]


def write_block_fp8(path: Path, preset: str, conf: str, **overrides) -> Checkpoint:
    """DeepSeek-V3 / Qwen3-FP8 layout: routed experts unfused (`experts.{e}.{gate,up,down}_proj.weight` plus
    `weight_scale_inv`), every other 2-D linear weight block-FP8 too, the kept tensors bf16 (DeepSeek's score
    correction bias fp32, randomised so that it matters to routing)."""
    model = tiny_model(preset, **overrides)
    tensors, reference = {}, {}

    def put(name: str, w: torch.Tensor) -> torch.Tensor:
        if w.ndim == 2 and not _fp8_kept(name):
            tensors[name], tensors[f"{name}_scale_inv"], represented = fp8_block_encode(w)
            return represented
        tensors[name] = w.float() if name.endswith("e_score_correction_bias") else w.to(torch.bfloat16)
        return tensors[name].double()

    gen = torch.Generator().manual_seed(5)
    for name, t in model.state_dict().items():
        if name.endswith("e_score_correction_bias"):
            t = 0.1 * torch.randn(t.shape, generator=gen)
        if name.endswith("experts.gate_up_proj"):  # [E, 2I, H]: gate rows first
            prefix, inter = name.removesuffix("gate_up_proj"), t.shape[1] // 2
            gates = [put(f"{prefix}{e}.gate_proj.weight", t[e, :inter]) for e in range(t.shape[0])]
            ups = [put(f"{prefix}{e}.up_proj.weight", t[e, inter:]) for e in range(t.shape[0])]
            reference[name] = torch.stack([torch.cat(pair) for pair in zip(gates, ups, strict=True)])
        elif name.endswith("experts.down_proj"):
            prefix = name.removesuffix("down_proj")
            reference[name] = torch.stack([put(f"{prefix}{e}.down_proj.weight", t[e]) for e in range(t.shape[0])])
        else:
            reference[name] = put(name, t)
    config = tiny_config(preset, **overrides)
    config.quantization_config = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [BLOCK, BLOCK],
    }
    if config.model_type == "qwen3_moe":
        config.quantization_config["modules_to_not_convert"] = _qwen3_not_converted(config)
    _save(path, config, tensors)
    return Checkpoint(path, preset, overrides, "fp8", conf, reference)


# DeepSeek-V3 widths that 32 divides: q_b 4 x (8 + 32), kv_a 32 + 32, kv_b 4 x (8 + 8), o_proj 4 x 8 in
DEEPSEEK_32 = {
    "hidden_size": 64,
    "q_lora_rank": 32,
    "kv_lora_rank": 32,
    "qk_rope_head_dim": 32,
    "qk_nope_head_dim": 8,
    "v_head_dim": 8,
}

WRITERS = {
    "gpt_oss-mxfp4": lambda p: write_gpt_oss_mxfp4(p, hidden_size=64),  # 64: the experts' inputs group by 32
    "qwen3_moe-fp8": lambda p: write_block_fp8(p, "qwen3_moe-b", "qwen3"),  # every width a multiple of 32
    "deepseek_v3-fp8": lambda p: write_block_fp8(p, "deepseek_v3-a", "deepseek", **DEEPSEEK_32),
}
FORMATS = list(WRITERS)


def run_settings(conf: str) -> tuple[torch.dtype, str | None]:
    """(dtype, device_map) that conf/model/<conf>.yaml passes to load_target."""
    model = yaml.safe_load((CONF / f"{conf}.yaml").read_text())
    return getattr(torch, model["dtype"]), model.get("device_map") or None


def load_as_configured(ckpt: Checkpoint, dtype: torch.dtype | None = None) -> PreTrainedModel:
    """load_target the way a `source: hf` model is loaded: the conf's dtype (unless given) and device_map."""
    conf_dtype, device_map = run_settings(ckpt.conf)
    return load_target(str(ckpt.path), dtype=dtype or conf_dtype, device_map=device_map)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Checkpoint]:
    return {fmt: write(tmp_path_factory.mktemp(fmt)) for fmt, write in WRITERS.items()}


@pytest.fixture(scope="module")
def loaded32(checkpoints) -> dict[str, tuple[PreTrainedModel, list[str]]]:
    """Each checkpoint loaded in float32 (dequantized exactly), with the UserWarnings of that load."""
    out = {}
    for fmt, ckpt in checkpoints.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = load_as_configured(ckpt, torch.float32)
        out[fmt] = model, [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    return out


def expected_moe_layers(config: PretrainedConfig) -> list[int]:
    """The decoder layers with routed experts, from the config's own rules (not from the built model)."""
    layers = range(config.num_hidden_layers)
    if config.model_type == "deepseek_v3":
        return [i for i in layers if i >= config.first_k_dense_replace]
    if config.model_type == "qwen3_moe":
        step = config.decoder_sparse_step
        return [i for i in layers if i not in config.mlp_only_layers and (i + 1) % step == 0]
    return list(layers)


def prompts(n: int = 3, length: int = 20, vocab: int = 256) -> list[torch.Tensor]:
    """Prompts longer than GPT-OSS's 8-token window."""
    gen = torch.Generator().manual_seed(11)
    return [torch.randint(3, vocab, (1, length + 2 * i), generator=gen) for i in range(n)]


# ----------------------------------------------------------------------------------------------------
# the quantized checkpoints
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_checkpoint_is_in_the_release_format(checkpoints, fmt):
    """What the writers put on disk: quantized tensors where the releases have them, nothing fused that they
    ship unfused, and codes that are not the float weights they came from (so the comparisons below test the
    decoding, not a copy)."""
    ckpt = checkpoints[fmt]
    stored = load_file(str(ckpt.path / "model.safetensors"))
    config = AutoConfig.from_pretrained(ckpt.path)
    assert config.quantization_config["quant_method"] == ckpt.method
    if ckpt.method == "mxfp4":
        blocks = {n: t for n, t in stored.items() if n.endswith("_blocks")}
        assert len(blocks) == 2 * config.num_hidden_layers
        for name, t in blocks.items():
            scales = stored[name.replace("_blocks", "_scales")]
            assert t.dtype == scales.dtype == torch.uint8 and t.shape[-1] == 16 and t.shape[:-1] == scales.shape
        assert {t.dtype for n, t in stored.items() if n not in blocks and not n.endswith("_scales")} == {torch.bfloat16}
    else:
        fp8 = [n for n, t in stored.items() if t.dtype == torch.float8_e4m3fn]
        assert all(stored[f"{n}_scale_inv"].dtype == torch.float32 for n in fp8)
        assert any(".experts.0.up_proj." in n for n in fp8) and not any("gate_up_proj" in n for n in stored)
        assert not any(_fp8_kept(n) for n in fp8) and any("self_attn" in n for n in fp8)
    original = tiny_model(ckpt.preset, **ckpt.overrides).state_dict()
    experts = next(n for n in ckpt.reference if n.endswith("experts.down_proj"))
    assert not torch.equal(ckpt.reference[experts].float(), original[experts])


@pytest.mark.parametrize("fmt", FORMATS)
def test_loaded_weights_are_the_values_the_checkpoint_represents(checkpoints, loaded32, fmt):
    """float32: every parameter and buffer transformers loads equals the value our codes represent, exactly
    (an FP8 value times a float32 scale rounds once to float32; MXFP4 values are exact)."""
    ckpt, (model, _) = checkpoints[fmt], loaded32[fmt]
    state = model.state_dict()
    assert set(state) == set(ckpt.reference)
    for name, want in ckpt.reference.items():
        assert state[name].dtype == torch.float32, name
        assert torch.equal(state[name], want.float()), name
    st = loaded_storage(model)
    assert (st["experts"], st["stored"]) == ("dequantized to fp32", ckpt.method)


@pytest.mark.parametrize("fmt", FORMATS)
def test_load_target_says_the_format_fork_first(checkpoints, loaded32, fmt):
    """Off a CUDA GPU the stored format is not kept: format_fork has its line for these configs, and load_target
    emitted exactly that line."""
    ckpt, (_, said) = checkpoints[fmt], loaded32[fmt]
    config = AutoConfig.from_pretrained(ckpt.path)
    line = format_fork(config, "cpu", str(ckpt.path), dtype="fp32")  # loaded32: dequantized to fp32
    assert line is not None and f"in {ckpt.method}" in line and "a CUDA GPU" in line and "to fp32" in line
    assert said.count(line) == 1
    assert "partial" not in line  # every tiny width is a whole number of blocks
    # a GPU below the format's compute capability dequantizes too (an A100 for FP8, a V100 for MXFP4)
    old = (8, 0) if ckpt.method == "fp8" else (7, 0)
    on_old_gpu = format_fork(config, "cuda", str(ckpt.path), capability=old)
    assert on_old_gpu is not None and "compute capability >= " in on_old_gpu and "a CUDA GPU" not in on_old_gpu


@pytest.mark.parametrize("fmt", FORMATS)
def test_greedy_sd_equals_ar_on_the_dequantized_target(loaded32, fmt):
    """Greedy SD on the loaded (float32, dequantized) target returns AR's tokens, with drafts both accepted and
    rejected (a perturbed copy as the draft model), for the confidence and the EcoSpec selector."""
    target = loaded32[fmt][0]
    drafter = DraftModelDrafter(perturbed_copy(target, scale=0.1, seed=1))
    accepted = rejected = False
    for ids in prompts():
        ar = ecospec.generate(target, ids, max_new_tokens=16, eos_token_id=[])
        for selector, predictor in (("confidence", None), ("ecospec", "oracle")):
            sd = ecospec.generate(
                target,
                ids,
                drafter=drafter,
                selector=selector,
                predictor=predictor,
                gamma=4,
                depth=3,
                topk=2,
                max_new_tokens=16,
                eos_token_id=[],
            )
            assert sd.tokens == ar.tokens, (fmt, selector)
            accepted |= any(s.accepted > 1 for s in sd.steps)
            rejected |= any(s.accepted < s.verified for s in sd.steps)
    assert accepted and rejected


@pytest.mark.parametrize("fmt", FORMATS)
def test_bf16_load_is_recorded_as_dequantized(checkpoints, fmt):
    """The conf's own dtype (bfloat16): the weights are the represented values rounded to bf16 (norms GPT-OSS
    keeps in fp32 excepted), a decode runs, and env.storage says `dequantized to bf16` for the experts (and, for
    block FP8, the dense weights) with `stored` the checkpoint's format; the fork line came first."""
    ckpt = checkpoints[fmt]
    assert run_settings(ckpt.conf)[0] == torch.bfloat16
    line = format_fork(AutoConfig.from_pretrained(ckpt.path), "cpu", str(ckpt.path))
    with pytest.warns(UserWarning, match="dequantize them to bf16") as record:
        model = load_as_configured(ckpt)
    assert line in [str(w.message) for w in record]
    for name, p in model.state_dict().items():
        assert torch.equal(p, ckpt.reference[name].float().to(p.dtype)), name
    st = loaded_storage(model)
    dense = "bf16" if ckpt.method == "mxfp4" else "dequantized to bf16"
    assert (st["experts"], st["dense"], st["stored"]) == ("dequantized to bf16", dense, ckpt.method)
    assert list(st["devices"]) == ["cpu"]
    out = ecospec.generate(model, prompts(1)[0], max_new_tokens=4, eos_token_id=[])
    assert len(out.tokens) == 4


@pytest.mark.parametrize("fmt", FORMATS)
def test_routing_capture_sees_every_moe_layer(checkpoints, loaded32, fmt):
    """The router hooks of the loaded model cover exactly the config's MoE layers and record the experts that
    the same weights route to in an eager model built from our reference values."""
    ckpt, model = checkpoints[fmt], loaded32[fmt][0]
    layers = expected_moe_layers(model.config)
    info = moe_info(model)
    assert list(info.moe_layers) == layers
    ids = torch.randint(3, model.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad(), RoutingCapture(model) as cap:
        logits = model(ids).logits
        routes = cap.take()
    assert routes.shape == (len(layers), ids.numel(), info.top_k)
    assert all(routes[i].unique().numel() > info.top_k for i in range(len(layers)))  # input-dependent routing
    reference = ckpt.reference_model()
    with torch.no_grad(), RoutingCapture(reference) as cap:
        want_logits = reference(ids).logits
        want = cap.take()
    assert torch.equal(routes, want)
    torch.testing.assert_close(logits, want_logits, rtol=1e-4, atol=1e-4)


@pytest.mark.xfail(
    raises=(RuntimeError, AssertionError),
    strict=True,
    reason="transformers 5.24's FP8 dequantize assumes scale tiles divide the weight",
)
@pytest.mark.parametrize("kv_lora_rank", [128, 32])
def test_deepseek_partial_fp8_tile_dequantizes(tmp_path, kv_lora_rank):
    """DeepSeek-V3's kv_a_proj_with_mqa has 512 + 64 = 576 rows, 4.5 tiles of 128, so its scale_inv has 5 rows
    (the last tile partial). Off an FP8 GPU transformers dequantizes with a tile height of rows // scale rows:
    4.5 tiles (128 + 16 = 144 rows of 32-tiles) fail the load (a RuntimeError over the conversion's "not divisible
    by scale grid" ValueError), 1.5 tiles (32 + 16) load silently wrong (tiles of 24 rows). ecospec's own MTP
    loader (`dequantize_fp8`) gets both right."""
    overrides = {**DEEPSEEK_32, "kv_lora_rank": kv_lora_rank, "qk_rope_head_dim": 16, "qk_nope_head_dim": 8}
    ckpt = write_block_fp8(tmp_path, "deepseek_v3-a", "deepseek", **overrides)
    name = "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"
    assert ckpt.reference[name].shape[0] % BLOCK == 16  # a partial tile
    with pytest.warns(UserWarning, match="in fp8"):
        model = load_as_configured(ckpt, torch.float32)
    assert torch.equal(model.state_dict()[name], ckpt.reference[name].float())


def test_format_fork_names_the_fp8_weights_transformers_cannot_dequantize(tmp_path):
    """What the xfail above shows, said before the weights are read: the partial-block weights, found on meta."""
    from ecospec.models.storage import partial_blocks

    overrides = {**DEEPSEEK_32, "kv_lora_rank": 128, "qk_rope_head_dim": 16, "qk_nope_head_dim": 8}
    ckpt = write_block_fp8(tmp_path, "deepseek_v3-a", "deepseek", **overrides)
    config = AutoConfig.from_pretrained(ckpt.path)
    bad = partial_blocks(config)
    layers = config.num_hidden_layers
    assert bad == [f"model.layers.{i}.self_attn.kv_a_proj_with_mqa 144x{config.hidden_size}" for i in range(layers)]
    line = format_fork(config, "cpu")
    assert f"cannot dequantize {layers} weights whose last block is partial (e.g. {bad[0]})" in line
    assert "\n" not in line
    whole = write_block_fp8(tmp_path / "whole", "deepseek_v3-a", "deepseek", **DEEPSEEK_32)
    assert partial_blocks(AutoConfig.from_pretrained(whole.path)) == []


# ----------------------------------------------------------------------------------------------------
# experts implementations
# ----------------------------------------------------------------------------------------------------

CPU_IMPLEMENTATIONS = ("eager", "batched_mm", "grouped_mm")
# CUDA kernels fetched through the `kernels` package (DeepGEMM, SonicMoE); deepgemm_megamoe exists only for experts
# kept in FP8 (FP8Experts, which a dequantized load never builds)
GPU_ONLY = ("deepgemm", "deepgemm_megamoe", "sonicmoe")
RANDOM_PRESETS = ["qwen3_moe-b", "gpt_oss-b", "deepseek_v3-b", "mixtral-b"]  # the variants with most MoE layers


def transformers_implementations() -> set[str]:
    """The `experts_implementation` values from_pretrained accepts that transformers registers itself, for float
    and for FP8 experts (ecospec registers its own, e.g. the tiny build's `ecospec_sorted`, in the same registry)."""
    registries = (ALL_EXPERTS_FUNCTIONS, ALL_FP8_EXPERTS_FUNCTIONS)
    return {n for r in registries for n in r if r[n].__module__.startswith("transformers.")}


def test_every_transformers_experts_implementation_is_covered():
    """A new implementation in transformers must be sorted into CPU_IMPLEMENTATIONS or GPU_ONLY here."""
    offered = transformers_implementations() | {"eager"}
    assert offered == set(CPU_IMPLEMENTATIONS) | set(GPU_ONLY), offered


@pytest.fixture(scope="module")
def random_checkpoints(tmp_path_factory) -> dict[str, Path]:
    """The four families' random tiny presets saved as plain float32 checkpoints."""
    out = {}
    for preset in RANDOM_PRESETS:
        out[preset] = tmp_path_factory.mktemp(preset)
        tiny_model(preset).save_pretrained(out[preset])
    return out


def captured(model: PreTrainedModel, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(routes [moe layers, tokens, k], logits) of one forward."""
    with torch.no_grad(), RoutingCapture(model) as cap:
        logits = model(ids).logits
        return cap.take(), logits


@pytest.mark.parametrize("preset", RANDOM_PRESETS)
def test_routes_are_the_same_under_every_cpu_experts_implementation(random_checkpoints, preset):
    """load_target(..., experts_implementation=impl) runs impl (the config and env.storage say so) and the
    capture records the eager routes: in float32 in every MoE layer; in bf16 in the first MoE layer, whose input
    no expert kernel has touched (later layers see the kernels' rounding and may route differently)."""
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(3, 256, (4, 32), generator=gen)
    routes, logits, routes16 = {}, {}, {}
    for impl in CPU_IMPLEMENTATIONS:
        model = load_target(str(random_checkpoints[preset]), dtype=torch.float32, experts_implementation=impl)
        assert model.config._experts_implementation == impl
        assert loaded_storage(model)["experts_implementation"] == impl
        routes[impl], logits[impl] = captured(model, ids)
        routes16[impl] = captured(model.to(torch.bfloat16), ids)[0]
    layers = len(moe_info(model).moe_layers)
    assert routes["eager"].shape == (layers, ids.numel(), moe_info(model).top_k)
    for impl in CPU_IMPLEMENTATIONS[1:]:
        assert torch.equal(routes[impl], routes["eager"]), impl
        torch.testing.assert_close(logits[impl], logits["eager"], rtol=1e-4, atol=1e-4)
        assert torch.equal(routes16[impl][0], routes16["eager"][0]), impl


@pytest.mark.parametrize("impl", GPU_ONLY)
def test_gpu_only_experts_implementations_refuse_to_run_on_cpu(random_checkpoints, impl):
    """The CUDA-kernel implementations load but fail loudly on a CPU forward, rather than route differently."""
    if torch.cuda.is_available():
        pytest.skip("CPU behaviour")
    model = load_target(str(random_checkpoints["qwen3_moe-b"]), dtype=torch.bfloat16, experts_implementation=impl)
    with pytest.raises((ImportError, KeyError, ValueError, RuntimeError)):
        captured(model, torch.tensor([[3, 4, 5, 6]]))


def test_a_cell_on_the_mxfp4_checkpoint_records_and_costs_what_loaded(tmp_path):
    """`model=gptoss` as a cluster runs it (its dtype, device_map, the HF path), pointed at the tiny MXFP4 checkpoint:
    the record's env.storage says the experts were dequantized to bf16, and hbm_bytes_per_verify counts bf16 expert
    bytes (4x the packed MXFP4 bytes the checkpoint's facts.storage would give)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from ecospec.analysis.weight_bytes import model_cost, verify_hbm_bytes
    from ecospec.experiment.cell import run_cell
    from ecospec.experiment.config import cell_name
    from ecospec.models.byte_tokenizer import VOCAB_SIZE, byte_tokenizer

    ckpt = write_gpt_oss_mxfp4(tmp_path / "ckpt", hidden_size=64, vocab_size=VOCAB_SIZE)  # the tokenizer's ids
    byte_tokenizer().save_pretrained(ckpt.path)
    with initialize_config_dir(config_dir=str(CONF.parent), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                "model=gptoss",
                f"model.target={ckpt.path}",
                "~model.facts.hf_config",
                "model.chat_template=false",
                "+model.drafters.draft_model={path: perturbed}",
                "method=draft",
                "dataset=humaneval",
                "num_prompts=2",
                "max_new_tokens=8",
                f"out_dir={tmp_path}",
                "progress=false",
                "threads=1",
                "logger=none",
            ],
        )
    with pytest.warns(UserWarning, match="dequantize them to bf16"):
        rec = run_cell(cfg, tmp_path / cell_name(cfg))
    assert rec["status"] == "ok", rec.get("traceback")
    st = rec["env"]["storage"]
    assert (st["experts"], st["dense"], st["stored"]) == ("dequantized to bf16", "bf16", "mxfp4")
    model = OmegaConf.to_container(cfg.model, resolve=True)  # facts.storage: the checkpoint's mxfp4 experts
    e = rec["summary"]["experts_per_layer"]
    as_loaded = verify_hbm_bytes(model_cost(model, {"experts": "bf16", "dense": "bf16"}), e)
    as_stored = verify_hbm_bytes(model_cost(model, {"experts": "mxfp4", "dense": "bf16"}), e)
    assert rec["summary"]["hbm_bytes_per_verify"] == pytest.approx(as_loaded) and as_loaded > as_stored


def test_routes_of_the_kept_mxfp4_block_come_from_its_router_logits():
    """Kept MXFP4 (kernels + Triton + a GPU) swaps each GPT-OSS MLP for transformers' `Mxfp4GptOssMLP`, whose kernel
    path never calls the router module: the capture hooks the block and takes the top-k of the router logits it
    returns. The Triton routing cannot run here, so the block's router-calling (expert-parallel) branch runs the
    forward while the capture is set up as for the kernel path; its routes must equal the eager model's."""
    from transformers.integrations.mxfp4 import Mxfp4GptOssMLP

    from ecospec.engine.budget import ExpertBudget
    from ecospec.models.adapters import bypasses_router, moe_blocks

    model = tiny_model("gpt_oss-b")
    ids = prompts(2, 24)[0]
    want, _ = captured(model, ids)
    for layer in model.model.layers:
        layer.mlp = Mxfp4GptOssMLP(layer.mlp.router, layer.mlp.experts)
    assert all(bypasses_router(b) for b in moe_blocks(model))  # the kernel path: the router never runs
    with torch.no_grad(), RoutingCapture(model) as cap:
        assert cap.from_logits == [True] * len(want)
        for b in moe_blocks(model):
            b.experts._is_hooked = True  # run the forward through the router-calling branch (CPU)
        model(ids)
        got = cap.take()
    assert torch.equal(got.sort(-1).values, want.sort(-1).values)
    for b in moe_blocks(model):
        b.experts._is_hooked = False
    with pytest.raises(ValueError, match="no budget can re-route"):
        ExpertBudget(model, 8)
