"""Figure 1(a) on any device, with no checkpoint: verify-pass latency against the unique experts E it touches.

    python -m ecospec.bench.verify_latency --model qwen3 --layers 4 --gammas 4,8,16 \\
        --impls eager,grouped_mm,batched_mm --device cuda --out experiments/fig1a
    python -m ecospec.bench.verify_latency --model gptoss --layers 1 --gammas 4 --scale 0.02 --device cpu
    python -m ecospec.bench.verify_latency --model tiny --layers 20 --gammas 6 --engine eager,compiled --threads 1

What is built: `--layers` decoder layers of the model's own transformers class (Qwen3MoeDecoderLayer,
GptOssDecoderLayer, DeepseekV3DecoderLayer, MixtralDecoderLayer) from the HF config in conf/model/<name>.yaml
`facts` (offline), every one a MoE layer (DeepSeek's three dense first layers are not built). `--scale` multiplies
the widths (hidden, dense and expert intermediate sizes, MLA's LoRA ranks) and the head counts; N, top-k and the
per-head dims stay. Random weights in the checkpoint's storage dtype where the benchmark has a kernel for it
(bf16, fp16, fp32); an fp8 or mxfp4 checkpoint runs in bf16 (transformers' fp8 / mxfp4 experts need a kernel
from the Hub) and the record's `storage` says so.

What is timed, one verify pass: the layers' forward over γ new tokens ([1, γ, hidden], positions P .. P+γ-1) that
attend to a P-token prefix (`--prefix`: random keys and values standing in for the KV cache; every pass reads the
same P + γ keys) and causally to each other (GPT-OSS's sliding layers within their window): attention, router,
routed experts and DeepSeek's shared expert. Rotary tables, embedding and lm_head are outside it. Each router
computes its logits as usual, then its top-k indices are replaced so that the γ tokens together touch exactly E
experts of the layer (each token k distinct ones, each of the E taken by floor or ceil of γk/E tokens), a fresh
random set of E per layer and pass, so no pass finds its experts warm in a cache the previous one filled. An
untimed pass first checks, at the experts modules' inputs, that every layer received exactly E unique experts.
Timer: CUDA events around each pass (after a synchronize) on a GPU, perf_counter on a CPU; `--warmup` passes, then
the median of `--repeats` (>= 20), taken in rounds of one pass of every point of the sweep. AR: the same pass with
γ = 1, E = k, for each implementation.

Bytes read by a pass: layers x (E x one expert's bytes + the layer's dense bytes: attention, norms, router, shared
expert), counted from the built tensors (KV cache and activations not counted); gbps = bytes / t_pass / 1e9;
bw_fraction = bytes / t_pass / the GPU's HBM peak (`analysis.hardware`: H100 3.35, H200 4.8, B200 8 TB/s, found
from the device name; `--peak-tbps` overrides; none on a CPU).

Records: one JSON per (model, impl, γ, E), `<out>/<model>-L<layers>-s<scale>-<device>/<impl>-g<γ>-E<E>` +
`ecospec.bench.RECORD_SUFFIX`, written atomically (a rerun replaces its points). `make tables` draws them
(`ecospec.report.fig1a`) and fits each implementation's per-layer cost (`analysis.latency.fit_latency`).

Needs torch >= 2.11 and transformers 5.x only (no Hydra, no omegaconf: conf/model is read with PyYAML), so it runs
with PYTHONPATH=src on a GPU machine with other versions. `experiment=fig1a` (run.py) wraps it as a job
(`experiment.fig1a_job.run_fig1a`).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ecospec.analysis.hardware import HARDWARE
from ecospec.bench import IMPLS, KIND, RECORD_SUFFIX, settings_problem
from ecospec.bench.passes import (
    WIDTHS,
    e_values,
    forced_indices,
    layer_bytes,
    pass_line,
    random_init_,
    shapes,
    timed_in_rounds,
    timing_fields,
)
from ecospec.bench.verify_compiled import run_compiled

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
_DTYPE_FORMATS = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


# -- the model: config, layers, bytes ------------------------------------------------------------------------------


def model_config(name: str | Mapping) -> dict:
    """conf/model/<name>.yaml (or a YAML path) as a plain dict, read with PyYAML; a mapping is returned as is."""
    if isinstance(name, Mapping):
        return dict(name)
    import yaml

    from ecospec import conf_dir

    path = Path(name) if str(name).endswith((".yaml", ".yml")) else conf_dir() / "model" / f"{name}.yaml"
    if not path.exists():
        have = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise FileNotFoundError(f"no model config {path}; have: {', '.join(have) or 'none'}")
    return yaml.safe_load(path.read_text())


def _width(value: int, scale: float) -> int:
    return value if scale == 1 else max(8, round(value * scale / 8) * 8)


def bench_config(model: Mapping, layers: int, scale: float = 1.0):
    """The HF config of `layers` MoE decoder layers of `model` (a conf/model mapping), widths and head counts x
    `scale`."""
    from ecospec.analysis.model_config import facts_of, hf_config

    base = hf_config(model, facts_of(model))
    kw = base.to_dict()
    for key in ("layer_types", "architectures", "transformers_version", "_name_or_path"):
        kw.pop(key, None)
    if kw.get("head_dim") is None and "num_attention_heads" in kw and "qk_rope_head_dim" not in kw:
        kw["head_dim"] = kw["hidden_size"] // kw["num_attention_heads"]  # Mixtral derives it; keep it fixed
    for key in WIDTHS:
        if isinstance(kw.get(key), int):
            kw[key] = _width(kw[key], scale)
    heads = max(1, round(kw["num_attention_heads"] * scale))
    kv = max(1, min(heads, round((kw.get("num_key_value_heads") or kw["num_attention_heads"]) * scale)))
    while heads % kv:
        kv -= 1
    kw.update(num_attention_heads=heads, num_key_value_heads=kv, num_hidden_layers=layers)
    kw.update(
        {
            k: v
            for k, v in (("first_k_dense_replace", 0), ("mlp_only_layers", []), ("decoder_sparse_step", 1))
            if k in kw
        }
    )
    return type(base)(**kw)


def storage(model: Mapping) -> tuple[torch.dtype, str, str]:
    """(torch dtype the weights get, the record's `storage` label, the checkpoint's expert format). An fp8 or mxfp4
    checkpoint runs in bf16: transformers' fp8 / mxfp4 experts need a kernel from the Hub (`kernels` package)."""
    facts = model.get("facts") or {}
    fmt = (facts.get("storage") or {}).get("experts") or _DTYPE_FORMATS.get(model.get("dtype") or "bfloat16", "bf16")
    if fmt in TORCH_DTYPES:
        return TORCH_DTYPES[fmt], fmt, fmt
    return torch.bfloat16, f"bf16 ({fmt} unavailable)", fmt


@dataclass
class Stack:
    """`layers` decoder layers on a device with what a pass needs around them."""

    config: object
    family: str
    layers: list[torch.nn.Module]
    rotary: torch.nn.Module
    routers: list[torch.nn.Module]
    experts: list[torch.nn.Module]
    cache_kw: str  # the decoder layers' keyword for the KV cache: `cache` (transformers >= 5.24) or `past_key_values`
    expert_bytes: int  # one routed expert as stored
    dense_layer_bytes: int  # everything else of one layer

    @property
    def top_k(self) -> int:
        return int(self.routers[0].top_k)

    @property
    def num_experts(self) -> int:
        return int(self.experts[0].num_experts)


def _classes(config):
    """(family, decoder layer class, rotary class, pretrained class, router attribute) of a config's model type."""
    import importlib

    from ecospec.models.adapters import CLASS_FAMILIES, MODEL_TYPES, unsupported

    if config.model_type not in MODEL_TYPES:
        raise unsupported(f"config of model_type {config.model_type!r}")
    name = MODEL_TYPES[config.model_type]
    mod = importlib.import_module(f"transformers.models.{config.model_type}.modeling_{config.model_type}")
    base = name.removesuffix("ForCausalLM")
    family, router = CLASS_FAMILIES[name]
    return (
        family,
        getattr(mod, f"{base}DecoderLayer"),
        getattr(mod, f"{base}RotaryEmbedding"),
        getattr(mod, f"{base}PreTrainedModel"),
        router,
    )


def build_stack(config, dtype: torch.dtype, device: torch.device | str, seed: int = 0) -> Stack:
    """The config's decoder layers, built on the meta device, then materialised on `device` in `dtype` with random
    weights (normal(0, 0.02); norms 1, biases and buffers 0)."""
    import inspect

    device = torch.device(device)
    family, layer_cls, rotary_cls, pretrained, router_attr = _classes(config)
    config._attn_implementation = "sdpa" if getattr(pretrained, "_supports_sdpa", False) else "eager"
    config._experts_implementation = "eager"
    with torch.device("meta"):
        layers = [layer_cls(config, i).to(dtype) for i in range(config.num_hidden_layers)]
    expert_bytes, dense_layer_bytes = layer_bytes(layers[0])
    if device.type == "cuda":
        need = len(layers) * (expert_bytes * layers[0].mlp.experts.num_experts + dense_layer_bytes)
        free = torch.cuda.mem_get_info(device)[0]
        if need > 0.85 * free:
            raise ValueError(
                f"{len(layers)} layers need {need / 1e9:.1f} GB, {free / 1e9:.1f} GB is free on {device}: "
                "ask for fewer --layers"
            )
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for i, layer in enumerate(layers):
            layers[i] = layer = layer.to_empty(device=device).eval()
            random_init_(layer, gen)
            for b in layer.buffers():
                b.zero_()
    blocks = [layer.mlp for layer in layers]
    if not all(hasattr(b, "experts") for b in blocks):
        raise ValueError(f"{layer_cls.__name__}: a layer without routed experts (the config was not all-MoE)")
    experts = [b.experts for b in blocks]
    params = inspect.signature(layer_cls.forward).parameters
    return Stack(
        config=config,
        family=family,
        layers=layers,
        rotary=rotary_cls(config=config).to(device),
        routers=[getattr(b, router_attr) for b in blocks],
        experts=experts,
        cache_kw="cache" if "cache" in params else "past_key_values",
        expert_bytes=expert_bytes,
        dense_layer_bytes=dense_layer_bytes,
    )


# -- one pass: forced routing, prefix cache, masks ------------------------------------------------------------------


class ForcedRouting:
    """Context manager replacing every router's top-k indices with `indices[layer]` (set before each pass; None
    leaves the router alone). The router still computes its logits and weights; only the index tensor of its output
    tuple changes."""

    def __init__(self, routers: Sequence[torch.nn.Module]):
        self.routers = list(routers)
        self.indices: list[torch.Tensor] | None = None

    def _wrap(self, layer: int, original: Callable) -> Callable:
        def forward(*args, **kwargs):
            out = original(*args, **kwargs)
            if self.indices is None:
                return out
            forced = self.indices[layer]
            at = [j for j, t in enumerate(out) if torch.is_tensor(t) and not t.is_floating_point()]
            if len(at) != 1 or out[at[0]].shape != forced.shape:
                raise RuntimeError(
                    f"{type(self.routers[layer]).__name__}: no [tokens, k] = {list(forced.shape)} index tensor in "
                    "the router's output, so its routing cannot be forced"
                )
            return (*out[: at[0]], forced, *out[at[0] + 1 :])

        return forward

    def __enter__(self) -> ForcedRouting:
        for i, r in enumerate(self.routers):
            r.forward = self._wrap(i, r.forward)
        return self

    def __exit__(self, *exc) -> None:
        for r in self.routers:
            del r.forward  # the instance attribute: the class's forward is back


class PrefixCache:
    """A KV cache of `prefix` tokens for timing: `update` (all the attention layers call) returns fixed random
    prefix states with the pass's own appended, and keeps nothing, so every pass reads the same P + γ keys."""

    def __init__(self, prefix: int, seed: int = 0):
        self.prefix = prefix
        self.seed = seed
        self.states: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        if layer_idx not in self.states:
            gen = torch.Generator(device=key.device).manual_seed(self.seed + layer_idx)
            self.states[layer_idx] = tuple(
                torch.randn((*t.shape[:-2], self.prefix, t.shape[-1]), generator=gen, device=t.device, dtype=t.dtype)
                for t in (key, value)
            )
        k, v = self.states[layer_idx]
        return torch.cat((k, key), dim=-2), torch.cat((v, value), dim=-2)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.prefix


def causal_mask(gamma: int, prefix: int, window: int | None, dtype: torch.dtype, device) -> torch.Tensor:
    """Additive [1, 1, γ, P + γ] mask: token i (position P + i) sees keys 0 .. P + i, within `window` if set."""
    q = torch.arange(gamma)[:, None] + prefix
    kpos = torch.arange(prefix + gamma)[None, :]
    allowed = kpos <= q
    if window:
        allowed &= kpos > q - window
    mask = torch.zeros(gamma, prefix + gamma, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    return mask[None, None].to(device)


class Pass:
    """One verify pass of γ tokens through the stack, ready to call repeatedly."""

    def __init__(self, stack: Stack, gamma: int, prefix: int, seed: int = 0):
        device = stack.rotary.inv_freq.device
        dtype = next(stack.layers[0].parameters()).dtype
        gen = torch.Generator(device=device).manual_seed(seed)
        self.stack = stack
        self.x = torch.randn(1, gamma, stack.config.hidden_size, generator=gen, device=device).to(dtype) * 0.5
        self.position_ids = torch.arange(prefix, prefix + gamma, device=device)[None]
        types = getattr(stack.config, "layer_types", None) or []
        window = getattr(stack.config, "sliding_window", None)
        masks = {w: causal_mask(gamma, prefix, w, dtype, device) for w in {None, window}}
        self.masks = [
            masks[window if i < len(types) and types[i] == "sliding_attention" else None]
            for i in range(len(stack.layers))
        ]
        self.cache = PrefixCache(prefix, seed)
        with torch.inference_mode():
            self.position_embeddings = stack.rotary(self.x, self.position_ids)

    def __call__(self) -> torch.Tensor:
        h = self.x
        with torch.inference_mode():
            for layer, mask in zip(self.stack.layers, self.masks, strict=True):
                kw = {
                    "attention_mask": mask,
                    "position_ids": self.position_ids,
                    "use_cache": True,
                    "position_embeddings": self.position_embeddings,
                    self.stack.cache_kw: self.cache,
                }
                out = layer(h, **kw)
                h = out[0] if isinstance(out, tuple) else out
        return h


def experts_seen(stack: Stack, run: Callable[[], object]) -> list[int]:
    """Unique experts each layer's experts module was given during `run()` (read at its input)."""
    seen: list[set[int]] = [set() for _ in stack.experts]

    def hook(layer: int):
        def pre(module, args, kwargs):
            idx = (
                args[1]
                if len(args) > 1
                else next(v for v in kwargs.values() if torch.is_tensor(v) and not v.is_floating_point())
            )
            seen[layer].update(idx.flatten().tolist())

        return pre

    handles = [e.register_forward_pre_hook(hook(i), with_kwargs=True) for i, e in enumerate(stack.experts)]
    try:
        run()
    finally:
        for h in handles:
            h.remove()
    return [len(s) for s in seen]


# -- the sweep -------------------------------------------------------------------------------------------------


def available_impls(requested: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """The requested experts implementations this transformers offers, and why the others are skipped."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    have = {"eager", *ALL_EXPERTS_FUNCTIONS.keys()}
    return [i for i in requested if i in have], {
        i: f"transformers has no experts implementation {i!r}" for i in requested if i not in have
    }


def peak(device: torch.device, hardware: str, override_tbps: float | None) -> tuple[float | None, str | None]:
    """(HBM peak bytes/s, where it came from): `override_tbps`, else the datasheet profile matching a GPU's name."""
    if override_tbps:
        return float(override_tbps) * 1e12, "--peak-tbps"
    if device.type == "cuda":
        for hw in HARDWARE.values():
            if hw.matches(hardware):
                return hw.hbm_bytes_per_s, hw.name
    return None, None


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")


def run(
    model: str | Mapping,
    layers: int = 4,
    gammas: Sequence[int] = (4, 8, 16),
    impls: Sequence[str] = IMPLS,
    scale: float = 1.0,
    device: str | torch.device = "cpu",
    out: str | Path = "experiments/fig1a",
    points: int = 9,
    experts: Sequence[int] | None = None,
    repeats: int = 20,
    warmup: int = 5,
    prefix: int = 64,
    peak_tbps: float | None = None,
    seed: int = 0,
    echo: Callable[[str], None] | None = print,
    engines: Sequence[str] = ("eager",),
) -> list[dict]:
    """Time every (impl, γ, E) point (and the AR pass per impl), write one record each under `out`, return them.
    `engines`: eager (transformers' decoder layers, one record per impl) and/or compiled (`bench.verify_compiled`:
    the compiled engine's verify step, impl `compiled`; Qwen3-MoE on a CPU)."""
    if not engines or set(engines) - {"eager", "compiled"}:
        raise ValueError(f"engines={list(engines)!r}: a non-empty list from eager, compiled")
    if "compiled" in engines and torch.device(device).type != "cpu":
        raise ValueError("--engine compiled: the compiled engine's ops have CPU kernels only; no GPU has run it yet")
    from ecospec.experiment.records import environment, hardware, now, write_json_atomic

    settings = {
        "layers": layers,
        "gammas": list(gammas),
        "impls": list(impls),
        "scale": scale,
        "points": points,
        "experts": list(experts) if experts else None,
        "repeats": repeats,
        "warmup": warmup,
        "prefix": prefix,
        "peak_tbps": peak_tbps,
        "seed": seed,
    }
    problem = settings_problem(settings)
    if problem:
        raise ValueError(problem)
    model = model_config(model)
    device = torch.device(device)
    config = bench_config(model, layers, scale)
    dtype, label, checkpoint_format = storage(model)
    stack = build_stack(config, dtype, device, seed)
    k, n = stack.top_k, stack.num_experts
    hw = hardware(device)
    peak_bps, peak_source = peak(device, hw, peak_tbps)
    env = environment(device)
    use, skipped = available_impls(impls) if "eager" in engines else ([], {})
    if echo:
        width = getattr(config, "moe_intermediate_size", None) or config.intermediate_size
        echo(
            f"{model['name']}: {layers} x {type(stack.layers[0]).__name__} (hidden {config.hidden_size}, expert width "
            f"{width}, N {n}, k {k}), {label} on {hw}: {stack.expert_bytes / 1e6:.3g} MB per expert, "
            f"{stack.dense_layer_bytes / 1e6:.3g} MB dense per layer"
        )
    for impl, why in skipped.items():
        echo and echo(f"skipping impl {impl}: {why}")
    tag = "cpu" if device.type == "cpu" else _slug(hw)
    where = Path(out) / f"{model['name']}-L{layers}-s{scale:g}-{tag}"
    gen = torch.Generator().manual_seed(seed)
    records = []
    with ForcedRouting(stack.routers) as forcing:
        for impl in use:
            config._experts_implementation = impl
            sweep = []  # (γ, E, the pass, its forced ids: the check's, then one per call)
            for gamma in (1, *gammas):
                one = Pass(stack, gamma, prefix, seed)
                for e in [k] if gamma == 1 else e_values(gamma, k, n, points, experts):
                    sets = [
                        [forced_indices(gamma, k, e, n, gen).to(device) for _ in stack.layers]
                        for _ in range(1 + warmup + repeats)
                    ]
                    forcing.indices = sets[0]
                    got = experts_seen(stack, one)
                    if got != [e] * len(stack.layers):
                        raise RuntimeError(f"forced routing gave {got} unique experts per layer, not {e}")
                    sweep.append((gamma, e, one, sets))

            def forced(sets):
                return lambda call: setattr(forcing, "indices", sets[1 + call])

            timings = timed_in_rounds([(one, forced(sets)) for _, _, one, sets in sweep], warmup, repeats, device)
            for (gamma, e, _, _), times in zip(sweep, timings, strict=True):
                rec = {
                    "schema": 1,
                    "kind": KIND,
                    "status": "ok",
                    "model": model["name"],
                    "family": stack.family,
                    "layers": layers,
                    "impl": impl,
                    "gamma": gamma,
                    "E": e,
                    "top_k": k,
                    "num_experts": n,
                    "scale": scale,
                    "shapes": shapes(config),
                    "storage": label,
                    "checkpoint_storage": checkpoint_format,
                    "dtype": str(dtype).removeprefix("torch."),
                    "attn_implementation": config._attn_implementation,
                    "prefix": prefix,
                    **timing_fields(times, layers, e, stack.expert_bytes, stack.dense_layer_bytes, peak_bps),
                    "repeats": repeats,
                    "warmup": warmup,
                    "timer": "cuda_events" if device.type == "cuda" else "perf_counter",
                    "hbm_peak_bytes_per_s": peak_bps,
                    "peak_source": peak_source,
                    "hardware": hw,
                    "device": str(device),
                    "env": env,
                    "finished": now(),
                }
                write_json_atomic(where / f"{impl}-g{gamma}-E{e}{RECORD_SUFFIX}", rec)
                records.append(rec)
                if echo:
                    echo(pass_line(model["name"], impl, rec))
    if "compiled" in engines:
        records += run_compiled(
            model,
            config,
            dtype,
            label,
            checkpoint_format,
            layers,
            scale,
            gammas,
            points,
            experts,
            repeats,
            warmup,
            prefix,
            seed,
            where,
            env,
            hw,
            echo,
        )
        use = [*use, "compiled"]
    if echo:
        from ecospec.analysis.latency import fit_latency

        for impl in use:
            fit = fit_latency(records, impl=impl)
            if fit is not None:
                echo(f"fit {fit.describe()}")
        echo(f"{len(records)} records -> {where}")
    return records


# -- entry points ----------------------------------------------------------------------------------------------


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ecospec.bench.verify_latency", description=__doc__.split("\n")[0])
    p.add_argument(
        "--model",
        required=True,
        help="conf/model name (qwen3, gptoss, deepseek, qwen3_30b, mixtral, tiny) or a model YAML path",
    )
    p.add_argument("--layers", type=int, default=4, help="decoder layers built and timed (default 4)")
    p.add_argument("--gammas", type=_ints, default=[4, 8, 16], help="tokens per verify pass, root included")
    p.add_argument("--impls", default=",".join(IMPLS), help=f"experts implementations (default {','.join(IMPLS)})")
    p.add_argument("--scale", type=float, default=1.0, help="widths and head counts x this (1 = the real shapes)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu | cuda | cuda:N")
    p.add_argument("--out", default="experiments/fig1a", help="records directory (default experiments/fig1a)")
    p.add_argument("--points", type=int, default=9, help="E values per γ, from top-k to min(N, γk) (default 9)")
    p.add_argument("--experts", type=_ints, default=None, help="explicit E values instead of --points")
    p.add_argument("--repeats", type=int, default=20, help="timed passes per point, median taken (>= 20)")
    p.add_argument("--warmup", type=int, default=5, help="untimed passes first (default 5)")
    p.add_argument("--prefix", type=int, default=64, help="KV-cache tokens the pass attends to (default 64)")
    p.add_argument("--peak-tbps", type=float, default=None, help="HBM peak in TB/s (default: the detected GPU's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument(
        "--engine",
        default="eager",
        help="eager (transformers' layers, --impls) and/or compiled (the "
        "compiled engine's verify step; Qwen3-MoE, CPU), comma-separated",
    )
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    try:
        run(
            a.model,
            layers=a.layers,
            gammas=a.gammas,
            impls=[i for i in a.impls.split(",") if i],
            scale=a.scale,
            device=a.device,
            out=a.out,
            points=a.points,
            experts=a.experts,
            repeats=a.repeats,
            warmup=a.warmup,
            prefix=a.prefix,
            peak_tbps=a.peak_tbps,
            seed=a.seed,
            engines=a.engine.split(","),
        )
    except (ValueError, FileNotFoundError) as e:
        print(f"verify_latency: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
