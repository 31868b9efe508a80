"""Figure 1(a) on the compiled engine (`verify_latency --engine compiled`): the same passes, timed through
`engine.compiled`'s verify step instead of transformers' decoder layers.

What is built: a Qwen3-MoE model of the benchmark's config (`--layers` MoE layers, `--scale`d widths, random
normal(0, 0.02) weights, a 256-token vocabulary so that embedding and lm_head stay negligible), prepared by
`engine.compiled.prepare` with forced routing: each router computes its logits, then its top-k ids are replaced by a
fresh random set of exactly E experts per layer and pass (`bench.passes.forced_indices`), its weights read at those
ids. The prefix (`--prefix` random tokens) is prefilled once; every pass writes its γ tokens at the same slots after
it, attends to the prefix and causally to itself, and is one call of the prepared target's step at q = γ (its verify
graph, one for every γ of the sweep; γ = 1 is its AR step). The routes buffer it writes is checked against E before
the timing. Records as `verify_latency`'s with `impl: compiled` and `engine: compiled`; the pass includes embedding,
final norm and the small lm_head that the eager benchmark leaves out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from ecospec.bench import KIND, RECORD_SUFFIX
from ecospec.bench.passes import (
    e_values,
    forced_indices,
    layer_bytes,
    pass_line,
    random_init_,
    shapes,
    timed_in_rounds,
    timing_fields,
)

VOCAB = 256


def _model(config, dtype: torch.dtype, seed: int):
    from transformers import Qwen3MoeForCausalLM

    config = type(config)(**{**config.to_dict(), "vocab_size": VOCAB, "tie_word_embeddings": False})
    with torch.device("meta"):
        model = Qwen3MoeForCausalLM(config).to(dtype)
    model = model.to_empty(device="cpu").eval()
    random_init_(model, torch.Generator().manual_seed(seed))
    model.model.rotary_emb = type(model.model.rotary_emb)(config=config)  # its buffers were left empty on meta
    return model


def run_compiled(
    model_cfg: dict,
    config,
    dtype: torch.dtype,
    label: str,
    checkpoint_format: str,
    layers: int,
    scale: float,
    gammas: Sequence[int],
    points: int,
    experts,
    repeats: int,
    warmup: int,
    prefix: int,
    seed: int,
    where: Path,
    env: dict,
    hw: str,
    echo: Callable[[str], None] | None,
) -> list[dict]:
    """Time every (γ, E) point and the AR step through the compiled engine; one record each under `where`."""
    from ecospec.engine.compiled import prepare, refusal
    from ecospec.experiment.records import now, write_json_atomic

    if config.model_type != "qwen3_moe":
        raise ValueError(f"--engine compiled: the compiled engine runs Qwen3-MoE only, not {config.model_type}")
    target = _model(config, dtype, seed)
    reason = refusal(target)
    if reason:
        raise ValueError(reason)
    k, n = config.num_experts_per_tok, config.num_experts
    expert_bytes, dense_bytes = layer_bytes(target.model.layers[0])
    gen = torch.Generator().manual_seed(seed)
    max_len = -(-(prefix + max(gammas)) // 128) * 128
    records = []
    with torch.inference_mode():
        prepared = prepare(target, gamma=max(gammas), max_len=max_len, forced_routing=True)  # its two graphs: every γ
        static = prepared.static
        for gamma in (1, *gammas):
            prepared.prefill_one(torch.randint(0, VOCAB, (prefix,), generator=gen))
            tokens = torch.randint(0, VOCAB, (1, gamma), generator=gen)  # one sequence: the steps' batch axis
            pos = torch.arange(prefix, prefix + gamma)[None]
            start = torch.tensor([prefix])
            tree = torch.ones(gamma, gamma, dtype=torch.bool).tril()[None]

            def one(tokens=tokens, pos=pos, start=start, tree=tree, prepared=prepared, gamma=gamma):
                return prepared.steps[gamma](tokens, pos, start, tree)

            sweep = []  # (E, its forced ids: the check's, then one per call)
            for e in [k] if gamma == 1 else e_values(gamma, k, n, points, experts):
                sets = [
                    torch.stack([forced_indices(gamma, k, e, n, gen) for _ in range(layers)])
                    for _ in range(1 + warmup + repeats)
                ]
                static.forced_ids[:, :gamma] = sets[0]
                one()
                got = [len(set(static.routes[i, :gamma].flatten().tolist())) for i in range(layers)]
                if got != [e] * layers:
                    raise RuntimeError(f"forced routing gave {got} unique experts per layer, not {e}")
                sweep.append((e, sets))

            def forced(sets, static=static, gamma=gamma):
                return lambda call: static.forced_ids[:, :gamma].copy_(sets[1 + call])

            timings = timed_in_rounds([(one, forced(sets)) for _, sets in sweep], warmup, repeats, torch.device("cpu"))
            for (e, _), times in zip(sweep, timings, strict=True):
                rec = {
                    "schema": 1,
                    "kind": KIND,
                    "status": "ok",
                    "model": model_cfg["name"],
                    "family": "qwen3_moe",
                    "layers": layers,
                    "impl": "compiled",
                    "engine": "compiled",
                    "gamma": gamma,
                    "E": e,
                    "top_k": k,
                    "num_experts": n,
                    "scale": scale,
                    "shapes": shapes(config),
                    "storage": label,
                    "checkpoint_storage": checkpoint_format,
                    "dtype": str(dtype).removeprefix("torch."),
                    "attn_implementation": "compiled",
                    "prefix": prefix,
                    "compile_s": prepared.compile_s,
                    **timing_fields(times, layers, e, expert_bytes, dense_bytes),
                    "repeats": repeats,
                    "warmup": warmup,
                    "timer": "perf_counter",
                    "hbm_peak_bytes_per_s": None,
                    "peak_source": None,
                    "hardware": hw,
                    "device": "cpu",
                    "env": env,
                    "finished": now(),
                }
                write_json_atomic(where / f"compiled-g{gamma}-E{e}{RECORD_SUFFIX}", rec)
                records.append(rec)
                if echo:
                    echo(pass_line(model_cfg["name"], "compiled", rec))
    return records
