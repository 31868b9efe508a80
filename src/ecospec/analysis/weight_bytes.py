"""The weight bytes a step's passes read: the verify pass (HBM bytes, target efficiency), the drafter's and the
predictor's passes (always *modeled*).

Accounting (`verify_hbm_bytes`): a pass reads each of the E unique routed experts of every MoE layer once, and
every other weight once: E x MoE layers x one expert's bytes + the dense bytes. Dense = attention, dense MLP
layers, shared experts, norms, routers and lm_head. The input embedding table is left out: a pass gathers only
its tokens' rows (with tied embeddings the table is read in full as lm_head and counted once). KV cache and
activations are not counted. Bytes are those of the checkpoint's storage formats (`facts.storage` of the model
config): bf16 2 B/param; fp8 1 B/param + a float32 scale per 128x128 block (DeepSeek-V3 / Qwen3-FP8 layout);
mxfp4 4 bits/param + one E8M0 scale byte per 32 values (OCP MX). Quantized checkpoints keep lm_head, routers
and embeddings in bf16 (`storage.other`). Expert biases (gpt-oss: 8,640 of an expert's 24.9M parameters) are
counted at the expert format. GB = 1e9 bytes.

Against the EcoSpec paper (Table 2, from its own E values; `tests/test_cost.py`):

* Qwen3-235B-A22B, bf16: 23.7 -> 98.85 GB (paper 99.3, -0.5 %), 20.5 -> 87.49 GB (88.1, -0.7 %).
* DeepSeek-V3.1, fp8: 31.4 -> 97.45 GB (97.3, +0.2 %), 31.2 -> 96.94 GB (96.8, +0.1 %). One expert is
  44,040,192 params = 44.04 MB of fp8 values, as in Figure 1(c); its 2,688 block scales add 10.75 kB (44.05 MB).
* GPT-OSS-120B: this accounting (mxfp4 experts 13.22 MB, bf16 rest) gives 8.62 / 8.14 GB, not the paper's
  6.0 / 5.5 GB. The paper's numbers are every weight at 4 bits, with no block scales and the bf16 attention and
  lm_head counted as if 4-bit too, over the same weights (no input embedding: the release's 5.1B-active
  convention): (E x 36 x 24,891,840 + 1,548,424,512) x 0.5 B = 5.97 / 5.52 GB (-0.5 % / +0.4 %);
  ``model_cost("gptoss", storage={"experts": "fp4", "dense": "fp4", "other": "fp4"})`` reproduces it.
  Ruled out: mxfp4 experts alone (5.53 / 5.05 GB, -8 %), including the input embedding (6.26 / 5.81 GB, +4 /
  +6 %), counting the 4-bit scales (6.34 / 5.87 GB, +6 / +7 %), per-GPU shares of a TP-4 split (2.4 GB or
  6.3 GB).

The overlap paper's "TE pred." (its Table 1) is `target_efficiency` of per-GPU, per-layer sizes in MiB:
C_expert = one expert's bytes / TP and C_dense = one decoder layer's attention bytes / TP.

Parameters are counted from the target's HF config (`analysis.model_config`; `ecospec.models.param_count`, exact: its
tests hold it equal to the model built on the meta device).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ecospec.analysis.model_config import config_mapping, facts_of, load_model_config, release_dir
from ecospec.drafters.registry import kind as drafter_kind
from ecospec.models.param_count import count_params, dense_decoder_params, head_dim, moe_layer_params

FORMATS: dict[str, tuple[float, int, int]] = {
    "fp64": (8, 0, 0),  # tests that need exact equality (a random model in float64)
    "fp32": (4, 0, 0),
    "bf16": (2, 0, 0),
    "fp16": (2, 0, 0),
    "fp8": (1, 128 * 128, 4),  # e4m3 values, a float32 scale_inv per 128x128 block
    "mxfp4": (0.5, 32, 1),  # e2m1 values, an E8M0 scale per 32 values
    "fp4": (0.5, 0, 0),  # bare 4-bit values: the nominal width the EcoSpec paper uses for GPT-OSS
}
_QUANTIZED = ("fp8", "mxfp4", "fp4")
_DTYPE_FORMATS = {"float64": "fp64", "float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
STORAGE_KEYS = ("experts", "dense", "other")  # routed experts; the rest but `other`; lm_head, routers, embeddings


def expert_bytes(params: float, storage: str, block: int | None = None) -> float:
    """Bytes of `params` weights stored as `storage` (see FORMATS), block scales included. `block` is the number
    of values per scale (default 128x128 for fp8, 32 for mxfp4); parameter counts are assumed to be whole blocks.
    Used for experts and for the dense part alike."""
    if storage not in FORMATS:
        raise ValueError(f"unknown storage format {storage!r}; allowed: {', '.join(FORMATS)}")
    width, per_scale, scale_bytes = FORMATS[storage]
    per_scale = block or per_scale
    return params * width + (params / per_scale * scale_bytes if scale_bytes else 0.0)


@dataclass(frozen=True)
class ModelCost:
    """Parameter counts and stored bytes of a target; `dense_*` is everything that is not a routed expert."""

    name: str
    num_layers: int
    moe_layers: int
    num_experts: int  # N
    top_k: int  # k
    expert_params: int  # one routed expert
    expert_bytes: float  # one routed expert, as stored
    dense_params: int  # every non-routed-expert parameter (incl. embeddings, lm_head, shared experts)
    embedding_params: int  # the input embedding table when untied: gathered by rows, not read per pass
    other_params: int  # lm_head (the tied table) + router weights, stored as storage['other']
    dense_bytes: float  # the non-expert bytes one pass reads (dense_params minus embedding_params, as stored)
    shared_expert_params: int  # per MoE layer (DeepSeek), included in dense_params
    storage: dict

    @property
    def total_params(self) -> int:
        return self.dense_params + self.num_experts * self.moe_layers * self.expert_params

    @property
    def active_params(self) -> int:
        """Parameters one token touches: dense part (both embedding tables) + k routed experts per MoE layer."""
        return self.dense_params + self.top_k * self.moe_layers * self.expert_params


def _storage(model: Mapping, facts: Mapping, storage: Mapping | None) -> dict:
    if storage is None:
        storage = facts.get("storage")
    if storage is None:
        dtype = model.get("dtype") or "bfloat16"
        if dtype not in _DTYPE_FORMATS:
            raise ValueError(f"model {model.get('name')!r}: dtype {dtype!r} has no storage format; set facts.storage")
        storage = dict.fromkeys(STORAGE_KEYS, _DTYPE_FORMATS[dtype])
    out = dict(storage)
    out.setdefault("other", "bf16" if out["dense"] in _QUANTIZED else out["dense"])
    for key in STORAGE_KEYS:
        if out.get(key) not in FORMATS:
            raise ValueError(f"storage.{key}={out.get(key)!r}; allowed: {', '.join(FORMATS)}")
    return out


def loaded_formats(storage: Mapping | None) -> dict | None:
    """The cost model's formats ({experts, dense}) of what a record says ran: its `env.storage` (`models.storage`:
    'fp8', 'mxfp4', 'bf16', 'fp32' or 'dequantized to bf16' ...), so bytes follow the loaded weights, not the
    checkpoint's (an MXFP4 checkpoint dequantized where its kernels are missing reads bf16 experts). None when the
    storage says nothing usable (a vLLM record, an old record)."""
    out = {}
    for key in ("experts", "dense"):
        value = str((storage or {}).get(key) or "").removeprefix("dequantized to ")
        if value not in FORMATS:
            return None
        out[key] = value
    return out


def model_cost(model: str | Mapping, storage: Mapping | None = None) -> ModelCost:
    """Counts and bytes of a target: `model` is a conf/model name or a model config mapping; `storage`
    ({experts, dense[, other]} formats) replaces the config's `facts.storage`."""
    model = load_model_config(model) if isinstance(model, str) else model
    facts = facts_of(model)
    config = config_mapping(model, facts)
    store = _storage(model, facts, storage)
    info = count_params(config)
    table = config["vocab_size"] * config["hidden_size"]
    tied = bool(config.get("tie_word_embeddings"))
    other = table + info.num_moe_layers * info.num_experts * config["hidden_size"]  # lm_head + router weights
    embedding = 0 if tied else table
    rest = info.dense_params - embedding - other  # attention, dense MLPs, shared experts, norms, biases
    return ModelCost(
        name=model.get("name", ""),
        num_layers=info.num_layers,
        moe_layers=info.num_moe_layers,
        num_experts=info.num_experts,
        top_k=info.top_k,
        expert_params=info.expert_params,
        expert_bytes=expert_bytes(info.expert_params, store["experts"]),
        dense_params=info.dense_params,
        embedding_params=embedding,
        other_params=other,
        dense_bytes=expert_bytes(rest, store["dense"]) + expert_bytes(other, store["other"]),
        shared_expert_params=info.shared_expert_params,
        storage=store,
    )


def as_cost(model: str | Mapping | ModelCost) -> ModelCost:
    """`model` itself when it is a ModelCost, else `model_cost(model)`."""
    return model if isinstance(model, ModelCost) else model_cost(model)


def verify_hbm_bytes(model: str | Mapping | ModelCost, experts_per_layer: float) -> float:
    """Estimated HBM weight bytes one verify pass reads: E x MoE layers x expert bytes + dense bytes."""
    c = as_cost(model)
    return experts_per_layer * c.moe_layers * c.expert_bytes + c.dense_bytes


def target_efficiency(c_expert: float, c_dense: float, k: float, unique: float) -> float:
    """(c_dense + k c_expert) / (c_dense + unique c_expert): the cost of one token's pass relative to a verify
    pass that activates `unique` experts per layer (the overlap paper's "TE pred."; any consistent unit)."""
    return (c_dense + k * c_expert) / (c_dense + unique * c_expert)


def target_efficiency_shares(moe_share: float, moe_scale: float, dense_scale: float = 1.0) -> float:
    """1 / ((1 − moe_share) · dense_scale + moe_share · moe_scale): TE when MoE layers take `moe_share` of a
    one-token pass's cost and a verify pass scales the MoE part by `moe_scale` and the rest by `dense_scale` (the
    overlap paper's Table 11 corrections). With the weight shares, k·c_expert / (c_dense + k·c_expert), and
    moe_scale = unique / k it is `target_efficiency`."""
    return 1.0 / ((1.0 - moe_share) * dense_scale + moe_share * moe_scale)


# -- the rest of a step: drafting and prediction ------------------------------------------------------------------

EAGLE3_DRAFT_VOCAB = 32000  # the reduced draft vocabulary of the public EAGLE-3 heads; a derived head's lm_head


@dataclass(frozen=True)
class StepParts:
    """Weight bytes of a step's passes besides the verify pass: each draft pass, and the predictor's pass (0 for
    a method that calls none). Input embeddings are gathered by rows and not counted, as in `verify_hbm_bytes`.
    `source` says where the shapes come from: the release's files, `facts` of conf/model, or derived."""

    draft: tuple[float, ...] = ()
    predictor: float = 0.0
    source: str = ""


def safetensors_bytes(path: Path, skip: tuple[str, ...] = ()) -> dict[str, float]:
    """{tensor name: stored bytes} from a safetensors file's header (no tensor read, no torch); names starting
    with any of `skip` left out."""
    import json
    import struct

    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return {
        k: float(v["data_offsets"][1] - v["data_offsets"][0])
        for k, v in header.items()
        if k != "__metadata__" and not k.startswith(skip)
    }


def eagle3_head_bytes(shape: Mapping, storage: str = "bf16") -> tuple[float, float]:
    """(first pass, each later pass) bytes of an EAGLE-3 head (`drafters.eagle3.Eagle3Head`): the fc over the
    target's aux hidden states (first pass only), one decoder layer whose attention reads [embedding, hidden]
    (2H wide), the final norm and the lm_head over the draft vocabulary. `shape`: hidden_size, intermediate_size,
    num_attention_heads, num_key_value_heads, head_dim, draft_vocab_size, target_hidden_size, aux_layers (3)."""
    h, i = shape["hidden_size"], shape["intermediate_size"]
    q, kv = shape["num_attention_heads"] * shape["head_dim"], shape["num_key_value_heads"] * shape["head_dim"]
    attention = 2 * h * q + 2 * (2 * h * kv) + q * h
    layer = attention + 3 * h * i + 3 * h  # q/k/v/o, gate/up/down, three norms
    later = layer + h + h * shape["draft_vocab_size"]  # + final norm and lm_head
    fc = shape.get("aux_layers", 3) * shape.get("target_hidden_size", h) * h
    return expert_bytes(fc + later, storage), expert_bytes(later, storage)


def derived_eagle3_shape(config: Mapping) -> dict:
    """An EAGLE-3 head's shape where its own is not at hand: one decoder layer at the target's hidden size, heads
    and dense MLP width, an fc over three hidden states, an lm_head over `EAGLE3_DRAFT_VOCAB` (derived, labelled so).
    `config`: the target's HF config mapping (`config_mapping`)."""
    h, heads = config["hidden_size"], config["num_attention_heads"]
    return {
        "hidden_size": h,
        "intermediate_size": config["intermediate_size"],
        "num_attention_heads": heads,
        "num_key_value_heads": config.get("num_key_value_heads") or heads,
        "head_dim": head_dim(config),
        "draft_vocab_size": min(EAGLE3_DRAFT_VOCAB, config["vocab_size"]),
        "target_hidden_size": h,
    }


def _lm_bytes(hf_config: Mapping, storage: str, extra: float = 0.0, lm_head: bool = True) -> float:
    """Bytes one pass of a dense decoder (a draft LM, a predictor's backbone) reads: its layers and final norm, its
    lm_head if `lm_head` (tied or not, read once), plus `extra` parameters, at `storage`; the input embedding is
    gathered by rows and not counted. Counted from the config (`param_count.dense_decoder_params`), else on the meta
    device."""
    params = dense_decoder_params(hf_config)
    if params is None:
        params = _meta_decoder_params(hf_config)
    if lm_head:
        params += hf_config["vocab_size"] * hf_config["hidden_size"]
    return expert_bytes(params + extra, storage)


def _meta_decoder_params(hf_config: Mapping) -> int:
    import torch
    from transformers import AutoConfig, AutoModel
    from transformers.initialization import no_init_weights

    kwargs = dict(hf_config)
    config = AutoConfig.for_model(kwargs.pop("model_type"), **kwargs)
    config._attn_implementation = "eager"
    with torch.device("meta"), no_init_weights():
        base = AutoModel.from_config(config)
    return sum(p.numel() for n, p in base.named_parameters() if "embed_tokens" not in n)


def _mtp_bytes(model: Mapping, c: ModelCost) -> float:
    """One pass of DeepSeek's MTP module: one MoE decoder layer of the target (its non-expert part and one token's
    k routed experts), eh_proj over [embedding, hidden] and the shared lm_head (derived from the target's facts)."""
    config = config_mapping(model, facts_of(model))
    rest = moe_layer_params(config)
    h = config["hidden_size"]
    return (
        expert_bytes(rest + 2 * h * h + 2 * h, c.storage["dense"])
        + c.top_k * c.expert_bytes
        + expert_bytes(config["vocab_size"] * h, c.storage["other"])
    )


def drafter_pass_bytes(model: Mapping, drafter: str) -> tuple[float, float, str]:
    """(first pass, each later pass, source) bytes of one pass of drafter kind `drafter` for conf/model `model`, by
    what its kind says a pass reads (`DrafterKind.weights`): the release's files (model=tiny), `facts.drafters.<kind>`
    (a shape), or derived from the target's facts (`facts.drafters.<kind>: derived`, or no facts)."""
    record = drafter_kind(drafter)
    facts = facts_of(model)
    given = (facts.get("drafters") or {}).get(record.shape_of or drafter)
    release = release_dir(model)
    if record.weights == "head":
        if release is not None:
            stage = drafter_kind(record.shape_of or drafter).build_stage
            files = safetensors_bytes(release / stage / "head" / "model.safetensors", skip=("embed", "d2t", "t2d"))
            fc = sum(v for k, v in files.items() if k.startswith(("fc.", "input_norm.")))
            total = sum(files.values())
            return total, total - fc, "the release's head"
        if isinstance(given, Mapping):
            first, later = eagle3_head_bytes(given, given.get("storage", "bf16"))
            return first, later, "facts"
        shape = derived_eagle3_shape(config_mapping(model, facts))
        return (*eagle3_head_bytes(shape, model_cost(model).storage["other"]), "derived from the target's facts")
    if record.weights == "mtp":
        b = _mtp_bytes(model, model_cost(model))
        return b, b, "derived from the target's facts"
    if record.weights == "lm":
        if ((model.get("drafters") or {}).get(drafter) or {}).get("path") == "perturbed":  # the target's copy
            c = model_cost(model)
            b = verify_hbm_bytes(c, c.top_k)
            return b, b, "a copy of the target"
        if isinstance(given, Mapping):
            b = _lm_bytes(given, given.get("storage", "bf16"))
            return b, b, "facts"
        raise ValueError(f"model {model.get('name')!r}: facts.drafters.{drafter} has no shape of its draft LM")
    raise ValueError(f"drafter kind {drafter!r} says nothing of the weights a pass reads (DrafterKind.weights)")


def predictor_pass_bytes(model: Mapping) -> tuple[float, str]:
    """(bytes, source) of one expert-predictor pass (`predictor.model.ExpertPredictor`: projection from the
    target's hidden size, the backbone without its embedding, the head to L x N logits): the release's files
    (model=tiny), else the backbone's shape from `facts.predictor_backbone` or a backbone config mapping."""
    release = release_dir(model)
    if release is not None:
        files = safetensors_bytes(release / "predictor" / "final" / "model.safetensors", skip=("embed.",))
        return sum(files.values()), "the release's predictor"
    facts = facts_of(model)
    backbone = facts.get("predictor_backbone") or (model.get("predictor") or {}).get("backbone")
    if not isinstance(backbone, Mapping):
        raise ValueError(
            f"model {model.get('name')!r}: facts.predictor_backbone has no shape of the predictor's backbone"
        )
    c, target = model_cost(model), config_mapping(model, facts)
    hidden = backbone["hidden_size"]
    extra = target["hidden_size"] * hidden + hidden + (hidden + 1) * c.moe_layers * c.num_experts  # projection and head
    shape = {k: v for k, v in backbone.items() if k != "storage"}
    return _lm_bytes(shape, backbone.get("storage", "bf16"), extra, lm_head=False), "facts"


def step_parts(model: Mapping, drafter: str | None, passes: int, predictor: bool) -> StepParts:
    """The draft passes (`passes` of `drafter`: a tree's depth, a chain's γ − 1) and the predictor's pass (methods
    that call it) of one step, in weight bytes; AR (no drafter) has neither."""
    if drafter is None:
        return StepParts()
    first, later, source = drafter_pass_bytes(model, drafter)
    draft = (first, *([later] * (passes - 1))) if passes > 0 else ()
    pred = 0.0
    if predictor:
        pred, psource = predictor_pass_bytes(model)
        source = source if psource == source else f"drafter: {source}; predictor: {psource}"
    return StepParts(draft=tuple(draft), predictor=pred, source=source)
