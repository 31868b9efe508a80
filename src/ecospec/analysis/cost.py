"""Cost model of a verify pass: HBM weight bytes, target efficiency and a roofline latency (always *modeled*).

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

Model configs: a `conf/model` name is read from ``ecospec.conf_dir() / "model" / "<name>.yaml"`` (package data,
so a wheel install has them), or pass the config mapping. The HF config comes from ``facts.hf_config``, else from
the tiny preset (source random), the build budget's recipe (source tiny) or ``AutoConfig.from_pretrained(target)``
(source hf); parameters are counted from its fields (`ecospec.models.param_count`, exact: its tests hold it equal to
the model built on the meta device).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

import numpy as np

from ecospec import conf_dir
from ecospec.analysis.hardware import HARDWARE, Hardware
from ecospec.models.param_count import count_params, counts_complete, dense_decoder_params, head_dim, moe_layer_params
from ecospec.tiny.budgets import get_budget

# storage format -> (bytes per value, default values per scale, bytes per scale)
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


def load_model_config(name: str) -> dict:
    """`conf/model/<name>.yaml` as a plain dict (no Hydra): a fresh copy each call, parsed once per file version
    (a report reads each model's several times)."""
    path = conf_dir() / "model" / f"{name}.yaml"
    if not path.exists():
        have = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise FileNotFoundError(f"no model config {path}; have: {', '.join(have) or 'none'}")
    stat = path.stat()
    return copy.deepcopy(_parsed_config(str(path), stat.st_mtime_ns, stat.st_size))


@cache
def _parsed_config(path: str, mtime_ns: int, size: int) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(path), resolve=True)


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


def facts_of(model: Mapping) -> dict:
    """`facts` of a model config; a config without the key (e.g. an older record's) borrows conf/model's."""
    if "facts" in model:
        return model["facts"] or {}
    path = conf_dir() / "model" / f"{model.get('name')}.yaml"
    return (load_model_config(model["name"]).get("facts") or {}) if path.exists() else {}


def config_mapping(model: Mapping, facts: Mapping) -> dict:
    """The target's HF config as a plain mapping (`PretrainedConfig.to_dict()`'s fields), without transformers
    where it is complete as written: `facts.hf_config` when it names every field the count reads (config.json may
    leave class defaults out), or the tiny recipe's arguments; `hf_config(...).to_dict()` otherwise."""
    written = facts.get("hf_config")
    if written and counts_complete(written):
        return dict(written)
    if not written and model.get("source") == "tiny":
        budget = get_budget(model.get("budget", "full"))
        return budget.target.hf_config(budget.corpus.vocab_size)
    return hf_config(model, facts).to_dict()


def hf_config(model: Mapping, facts: Mapping):
    """The target's transformers config from a conf/model mapping and its `facts` (no weights, no download where
    facts or the tiny recipe have it)."""
    from transformers import AutoConfig

    if facts.get("hf_config"):
        kwargs = dict(facts["hf_config"])
        return AutoConfig.for_model(kwargs.pop("model_type"), **kwargs)
    source = model.get("source")
    if source == "random":
        from ecospec.models import tiny_config
        from ecospec.models.byte_tokenizer import VOCAB_SIZE

        return tiny_config(model["preset"], vocab_size=VOCAB_SIZE)
    if source == "tiny":  # the requested BPE vocab: a build's tokenizer fills it on the full-size corpus
        from ecospec.tiny.target import target_config

        budget = get_budget(model.get("budget", "full"))
        return target_config(budget.target, budget.corpus.vocab_size)
    if source == "hf" and model.get("target"):
        return AutoConfig.from_pretrained(model["target"])
    raise ValueError(f"model {model.get('name')!r}: no facts.hf_config and no preset, tiny budget or HF target")


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


def _cost(model: str | Mapping | ModelCost) -> ModelCost:
    return model if isinstance(model, ModelCost) else model_cost(model)


def verify_hbm_bytes(model: str | Mapping | ModelCost, experts_per_layer: float) -> float:
    """Estimated HBM weight bytes one verify pass reads: E x MoE layers x expert bytes + dense bytes."""
    c = _cost(model)
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


def _hardware(hardware: str | Hardware) -> Hardware:
    if isinstance(hardware, Hardware):
        return hardware
    if hardware not in HARDWARE:
        raise ValueError(f"unknown hardware {hardware!r}; profiles: {', '.join(HARDWARE)}")
    return HARDWARE[hardware]


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


def _release_dir(model: Mapping) -> Path | None:
    if model.get("source") != "tiny":
        return None
    from ecospec.tiny.layout import RELEASE_DIR

    return RELEASE_DIR


def drafter_pass_bytes(model: Mapping, drafter: str) -> tuple[float, float, str]:
    """(first pass, each later pass, source) bytes of one pass of `drafter` (eagle3, gto, mtp, draft_model) for
    conf/model `model`: the release's files (model=tiny), `facts.drafters.<kind>` (a shape), or derived from the
    target's facts (`facts.drafters.<kind>: derived`, or no facts)."""
    facts = facts_of(model)
    given = (facts.get("drafters") or {}).get("eagle3" if drafter == "gto" else drafter)
    release = _release_dir(model)
    if drafter in ("eagle3", "gto"):
        if release is not None:
            files = safetensors_bytes(release / "drafter" / "head" / "model.safetensors", skip=("embed", "d2t", "t2d"))
            fc = sum(v for k, v in files.items() if k.startswith(("fc.", "input_norm.")))
            total = sum(files.values())
            return total, total - fc, "the release's head"
        if isinstance(given, Mapping):
            first, later = eagle3_head_bytes(given, given.get("storage", "bf16"))
            return first, later, "facts"
        shape = derived_eagle3_shape(config_mapping(model, facts))
        return (*eagle3_head_bytes(shape, model_cost(model).storage["other"]), "derived from the target's facts")
    if drafter == "mtp":
        b = _mtp_bytes(model, model_cost(model))
        return b, b, "derived from the target's facts"
    if drafter == "draft_model":
        if ((model.get("drafters") or {}).get("draft_model") or {}).get("path") == "perturbed":  # the target's copy
            c = model_cost(model)
            b = verify_hbm_bytes(c, c.top_k)
            return b, b, "a copy of the target"
        if isinstance(given, Mapping):
            b = _lm_bytes(given, given.get("storage", "bf16"))
            return b, b, "facts"
        raise ValueError(f"model {model.get('name')!r}: facts.drafters.draft_model has no shape of its draft LM")
    raise ValueError(f"unknown drafter {drafter!r}")


def predictor_pass_bytes(model: Mapping) -> tuple[float, str]:
    """(bytes, source) of one expert-predictor pass (`predictor.model.ExpertPredictor`: projection from the
    target's hidden size, the backbone without its embedding, the head to L x N logits): the release's files
    (model=tiny), else the backbone's shape from `facts.predictor_backbone` or a backbone config mapping."""
    release = _release_dir(model)
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


def modeled_step(
    model: str | Mapping | ModelCost,
    alpha: float,
    experts_per_layer: float,
    hardware: str | Hardware,
    overhead_s: float | None = None,
    parts: StepParts | None = None,
) -> dict:
    """Roofline latency of one SD step: T_verify = verify bytes / HBM bandwidth + overhead; each draft pass and the
    predictor's pass (`parts`) cost their bytes / bandwidth + the same fixed overhead; T_step = T_verify + T_draft +
    T_pred, α tokens per step. AR is the verify pass with E = k and α = 1. `overhead_s` defaults to the profile's.
    Modeled, not measured: the dict says so."""
    if alpha <= 0:
        raise ValueError(f"alpha={alpha}: tokens per step must be positive")
    c, hw = _cost(model), _hardware(hardware)
    parts = parts or StepParts()
    over = hw.overhead_s if overhead_s is None else overhead_s
    bw = hw.hbm_bytes_per_s
    hbm = verify_hbm_bytes(c, experts_per_layer)
    t_verify = hbm / bw + over
    t_draft = sum(b / bw + over for b in parts.draft)
    t_pred = parts.predictor / bw + over if parts.predictor else 0.0
    t_step = t_verify + t_draft + t_pred
    t_ar = verify_hbm_bytes(c, c.top_k) / bw + over
    return {
        "modeled": True,
        "hardware": hw.name,
        "hbm_bytes": hbm,
        "t_verify_s": t_verify,
        "t_draft_s": t_draft,
        "t_pred_s": t_pred,
        "t_step_s": t_step,
        "tokens_per_s": alpha / t_step,
        "ar_t_step_s": t_ar,
        "ar_tokens_per_s": 1.0 / t_ar,
        "speedup": alpha * t_ar / t_step,
    }


def fit_overhead(records: Iterable[Mapping], hardware: str | Hardware, model: str | None = None) -> float | None:
    """Least-squares fixed overhead per pass from SD cells: the mean over ok records measured on `hardware` (matched
    by record['env']['hardware']; of conf/model `model` if given) of t_verify − verify bytes / bandwidth.
    None if no record qualifies. Where the verify-latency benchmark measured the model on that GPU, `fit_latency`
    fits slope and intercept instead, and `LatencyFit.profile` replaces both the bandwidth and this overhead."""
    hw = _hardware(hardware)
    residuals = []
    for r in records:
        s = r.get("summary") or {}
        t, e = s.get("t_verify_s"), s.get("experts_per_layer")
        cfg = (r.get("config") or {}).get("model") or {}
        if r.get("status") != "ok" or t is None or e is None or (model is not None and cfg.get("name") != model):
            continue
        if not hw.matches((r.get("env") or {}).get("hardware", "")):
            continue
        residuals.append(t - verify_hbm_bytes(cfg, e) / hw.hbm_bytes_per_s)
    return sum(residuals) / len(residuals) if residuals else None


# -- measured per-layer cost (ecospec.bench.verify_latency records) ------------------------------------------------


def fit_line(x, y) -> tuple[float, float, float]:
    """Least-squares y = slope * x + intercept; returns (slope, intercept, R²). Needs two distinct x values."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    dx, dy = x - x.mean(), y - y.mean()
    sxx = float(dx @ dx)
    if sxx == 0:
        raise ValueError("a line needs at least two distinct x values")
    slope = float(dx @ dy) / sxx
    intercept = float(y.mean() - slope * x.mean())
    ss_res = float(np.sum((y - (slope * x + intercept)) ** 2))
    ss_tot = float(dy @ dy)
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    return slope, intercept, r2


@dataclass(frozen=True)
class LatencyFit:
    """Per-layer verify-pass latency measured by `ecospec.bench.verify_latency` on a few real-shape MoE layers:
    t_layer(E) = slope_s · E + intercept_s (seconds per expert-layer; fixed seconds per layer), least squares over
    its records of one implementation, model and device."""

    model: str
    impl: str
    hardware: str  # the device name the records were measured on
    layers: int  # decoder layers the benchmark timed together
    records: int
    slope_s: float
    intercept_s: float
    r2: float
    expert_bytes: float  # one routed expert as the benchmark stored it
    dense_layer_bytes: float  # the rest of one benchmarked layer

    def t_layer(self, experts_per_layer: float) -> float:
        return self.slope_s * experts_per_layer + self.intercept_s

    @property
    def bytes_per_s(self) -> float:
        """Achieved bandwidth on expert reads: one expert's bytes per fitted second per expert-layer."""
        return self.expert_bytes / self.slope_s

    def profile(self, hardware: str | Hardware, model: str | Mapping | ModelCost) -> Hardware:
        """`hardware` with the fitted numbers, scaled from the measured layers to the model's full depth: bandwidth
        = `bytes_per_s`, overhead = MoE layers × (intercept − a layer's dense bytes / that bandwidth). Then
        `modeled_step(model, α, E, profile)` gives T_verify = MoE layers × t_layer(E) + the model's other bytes
        (dense layers, lm_head) at the fitted bandwidth, and the checkpoint's own storage bytes where the benchmark
        stood in with bf16 (fp8, mxfp4) are read at that bandwidth too."""
        if self.slope_s <= 0:
            raise ValueError(f"{self.describe()}: a slope <= 0 has no bandwidth (too few or too noisy records)")
        hw, c = _hardware(hardware), _cost(model)
        bw = self.bytes_per_s
        overhead = c.moe_layers * (self.intercept_s - self.dense_layer_bytes / bw)
        return replace(hw, hbm_bytes_per_s=bw, overhead_s=overhead, source=f"verify-latency fit {self.describe()}")

    def describe(self) -> str:
        return (
            f"{self.impl}: {self.slope_s * 1e3:.4g} ms per expert-layer + {self.intercept_s * 1e3:.4g} ms per layer "
            f"(R² {self.r2:.3f}; {self.records} records, {self.layers} layer{'s' if self.layers != 1 else ''}, "
            f"{self.hardware})"
        )


def fit_latency(
    records: Iterable[Mapping],
    impl: str | None = None,
    model: str | None = None,
    hardware: str | Hardware | None = None,
) -> LatencyFit | None:
    """Least-squares t_pass / layers = slope · E + intercept over the ok `verify_latency` records (of `impl`,
    conf/model `model` and the GPU profile `hardware`, each if given; AR points enter at E = k). The records must
    share one shape (layers, expert and dense bytes: one scale and storage) and implementation; None if fewer than
    two distinct E values qualify."""
    from ecospec.bench import KIND

    hw = None if hardware is None else _hardware(hardware)
    rows = [
        r
        for r in records
        if r.get("kind") == KIND
        and r.get("status", "ok") == "ok"
        and (impl is None or r.get("impl") == impl)
        and (model is None or r.get("model") == model)
        and (hw is None or hw.matches(r.get("hardware") or ""))
    ]
    if not rows:
        return None
    keys = {(r["impl"], r["model"], r["layers"], r["expert_bytes"], r["dense_layer_bytes"]) for r in rows}
    if len(keys) > 1:
        raise ValueError(f"verify_latency records of {len(keys)} implementations or shapes; fit one at a time")
    x = [float(r["E"]) for r in rows]
    if len(set(x)) < 2:
        return None
    slope, intercept, r2 = fit_line(x, [float(r["t_pass_s"]) / r["layers"] for r in rows])
    first = rows[0]
    return LatencyFit(
        model=first["model"],
        impl=first["impl"],
        hardware=first.get("hardware") or "",
        layers=first["layers"],
        records=len(rows),
        slope_s=slope,
        intercept_s=intercept,
        r2=r2,
        expert_bytes=first["expert_bytes"],
        dense_layer_bytes=first["dense_layer_bytes"],
    )


# -- a verify-cost profile measured on the engine and machine that run the cells -----------------------------------


PROFILE_VERSION = 4  # a profile written by another version is made again (`analysis.profiles.load_profile`)


@dataclass(frozen=True)
class VerifyProfile:
    """What a step costs on one engine and machine, measured (`python -m ecospec.bench.profile`): a verify pass as
    a line in its tokens and its unique experts per MoE layer (`t_verify`), the loop's own cost per step
    (`overhead_s`: what a real AR step costs beyond its verify pass), one drafter pass of each shape the methods
    use, the expert predictor's pass, and the unique experts per layer a block of t tokens of real text routes to
    (`experts`). The same questions `modeled_step` answers from weight bytes on a GPU profile (one cost interface,
    two sources: measured here, roofline there)."""

    model: str
    engine: str
    dtype: str
    processor: str
    layers: int  # MoE layers the verify fit covers (the model's)
    intercept_s: float  # a pass's fixed seconds
    per_token_s: float  # seconds per token in the block
    per_expert_layer_s: float  # seconds per unique expert per MoE layer
    r2: float
    points: int
    ar_step_s: float  # one AR step of the decode loop, everything included
    overhead_s: float  # ar_step_s minus the fit's AR pass: the loop's cost per step outside the verify pass
    draft_pass_s: dict  # drafter shape ("tree", "chain") -> seconds of one head pass
    predictor_pass_s: float | None
    experts_by_tokens: dict  # str(t) -> mean unique experts per MoE layer of t consecutive tokens
    source: str
    # str(t) -> [seconds, unique experts per layer]: the mean verify phase of real steps of t tokens and their mean E
    verify_by_tokens: dict | None = None
    # str(B) -> {str(t): [seconds, unique experts per layer over the batch]}: the mean verify phase of real batched
    # passes of B sequences whose longest block is t tokens (a batch runs padded to it), B > 1
    verify_by_batch: dict | None = None
    draft_by_batch: dict | None = None  # str(B) -> seconds of one tree head pass over B sequences, B > 1
    # "head" / "predictor" -> [seconds, seconds per token]: what a step's drafting (its predictor's pass) costs beyond
    # its usual passes when the drafter first runs over tokens it has not seen (the prompt, or the steps since it last
    # drafted), as a line in those tokens
    catchup: dict | None = None
    version: int = PROFILE_VERSION

    def t_verify(self, tokens: int, experts_per_layer: float) -> float:
        """A verify pass of `tokens` tokens routed to `experts_per_layer` unique experts per MoE layer: the real
        steps of that size, their experts repriced at `per_expert_layer_s`, where measured; else the line."""
        measured = (self.verify_by_tokens or {}).get(str(tokens))
        if measured is not None:
            seconds, experts = measured
            return seconds + self.per_expert_layer_s * (experts_per_layer - experts) * self.layers
        return self.intercept_s + self.per_token_s * tokens + self.per_expert_layer_s * experts_per_layer * self.layers

    def experts(self, tokens: int) -> float:
        """The expected unique experts per layer of a block of `tokens` (the largest measured size beyond them)."""
        sizes = sorted(int(t) for t in self.experts_by_tokens)
        return float(self.experts_by_tokens[str(min(tokens, sizes[-1]))])

    def t_catchup(self, tokens: int, gamma: int, predictor: bool = False) -> float:
        """What drafting costs beyond a step's usual passes when the head (and the predictor) first take `tokens`
        they have not seen: nothing up to a step's own `gamma`, else the measured line (none measured: nothing)."""
        if tokens <= gamma or not self.catchup:
            return 0.0
        parts = ("head", "predictor") if predictor else ("head",)
        return sum(max(0.0, a + b * tokens) for a, b in (self.catchup.get(p, (0.0, 0.0)) for p in parts))

    def t_step(self, draft_s: float, tokens: int, experts_per_layer: float | None = None) -> float:
        """A whole SD step: the loop's overhead, drafting `draft_s`, and a verify pass of `tokens` (with
        `experts_per_layer`, or the expected count for that many tokens)."""
        e = self.experts(tokens) if experts_per_layer is None else experts_per_layer
        return self.overhead_s + draft_s + self.t_verify(tokens, e)

    def t_batch(self, sequences: int, tokens: int) -> float:
        """A verify pass of `sequences` sequences whose longest block is `tokens` tokens: one sequence's
        `t_verify` at the experts that many tokens route to; a batch's real passes of that shape where measured
        (`verify_by_batch`); between or beyond the measured batch sizes, the straight line in the batch size
        through the nearest two (one sequence counting as measured); else the line over every row's tokens."""
        if sequences == 1:
            return self.t_verify(tokens, self.experts(tokens))
        by_size = {1: self.t_verify(tokens, self.experts(tokens))}
        for b, by_t in (self.verify_by_batch or {}).items():
            if str(tokens) in by_t:
                by_size[int(b)] = by_t[str(tokens)][0]
        if sequences in by_size:
            return by_size[sequences]
        if len(by_size) > 1:
            sizes = sorted(by_size)
            above = [b for b in sizes if b > sequences]
            lo, hi = (sizes[-2], sizes[-1]) if not above else (max(b for b in sizes if b < sequences), above[0])
            return by_size[lo] + (by_size[hi] - by_size[lo]) * (sequences - lo) / (hi - lo)
        total = sequences * tokens
        return self.intercept_s + self.per_token_s * total + self.per_expert_layer_s * self.experts(total) * self.layers

    def t_draft(self, sequences: int, passes: int, shape: str = "tree") -> float:
        """`passes` head passes of `shape` over `sequences` sequences (one pass serves every row): a tree pass at
        the largest measured batch size up to `sequences` (`draft_by_batch`), else one sequence's."""
        measured = {int(b): s for b, s in (self.draft_by_batch or {}).items() if int(b) <= sequences}
        batched = measured[max(measured)] if shape == "tree" and measured else None
        return passes * (batched if batched is not None else self.draft_pass_s.get(shape, 0.0))

    def batch_experts(self, sequences: int, tokens: int) -> float:
        """The unique experts per layer over a pass of `sequences` sequences of `tokens` tokens each: the batch
        table's at the largest measured batch size up to `sequences`, else what that many tokens of one sequence
        route to."""
        measured = {
            int(b): by_t[str(tokens)][1]
            for b, by_t in (self.verify_by_batch or {}).items()
            if int(b) <= sequences and str(tokens) in by_t
        }
        return measured[max(measured)] if measured else self.experts(sequences * tokens)

    def at_batch(self, sequences: int, shared: bool = False) -> VerifyProfile:
        """One sequence's prices in a pass of `sequences` sequences that all verify as it does: a block of t tokens
        costs the batched pass `t_batch(sequences, t)`, an AR step the batched AR pass, a tree head pass the batched
        one. Experts beyond the expected are priced as at one sequence: beyond what t tokens of one sequence route
        to, or with `shared` (one expert buffer for the batch, whose count a row's choice sees) beyond the batch's.
        The profile itself at one sequence, or where it has no batch table (`verify_by_batch`)."""
        if sequences == 1 or not self.verify_by_batch:
            return self
        sizes = sorted({int(t) for t in self.experts_by_tokens} | {int(t) for t in self.verify_by_tokens or {}})
        expected = (lambda t: self.batch_experts(sequences, t)) if shared else self.experts
        by_tokens = {str(t): [self.t_batch(sequences, t), expected(t)] for t in sizes}
        drafts = {**self.draft_pass_s, "tree": self.t_draft(sequences, 1)}
        return replace(
            self,
            ar_step_s=self.overhead_s + self.t_batch(sequences, 1),
            per_token_s=self.per_token_s * sequences,
            draft_pass_s=drafts,
            verify_by_tokens=by_tokens,
        )

    @property
    def key(self) -> str:
        return profile_key(self.model, self.engine, self.dtype, self.processor)


def independent_experts(num_experts: int, top_k: int, tokens: int) -> float:
    """Unique experts per layer of `tokens` tokens routed independently and uniformly: N (1 - (1 - k/N)^t)."""
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


def profile_key(model: str, engine: str, dtype: str, processor: str) -> str:
    """The file stem of a profile: model, engine, dtype and processor (or GPU model), in filename characters."""
    import re

    return re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{model}-{engine}-{dtype}-{processor}").strip("_")


def fit_verify(records: Iterable[Mapping], layers: int) -> tuple[float, float, float, float, int]:
    """Least squares t_pass = intercept + per_token · tokens + per_expert_layer · E · layers over `verify_latency`
    records of one implementation (the AR pass enters at γ = 1, E = k), each coefficient held >= 0 (a token or an
    expert more never makes a pass cheaper; noise in a few timed points could tilt a free fit so); returns the three
    coefficients, R² and the number of points. The records' passes cover `layers` MoE layers."""
    from scipy.optimize import nnls

    rows = [r for r in records if r.get("status", "ok") == "ok"]
    if len({(r["gamma"], r["E"]) for r in rows}) < 3:
        raise ValueError("a verify profile needs at least three distinct (tokens, E) points")
    x = np.array([[1.0, r["gamma"], r["E"] * layers] for r in rows])
    y = np.array([r["t_pass_s"] for r in rows])
    coef, _ = nnls(x, y)
    pred = x @ coef
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float(((y - pred) ** 2).sum()) / ss_tot if ss_tot > 0 else 1.0
    return float(coef[0]), float(coef[1]), float(coef[2]), r2, len(rows)
