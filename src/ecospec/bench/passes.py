"""The pieces of a forced-routing verify pass that both engines' Figure 1(a) benchmarks use (`verify_latency` on
transformers' layers, `verify_compiled` on the compiled engine): the model's shapes and bytes, random weights, the
forced expert ids, the timer and the E values of a sweep."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch

WIDTHS = ("hidden_size", "intermediate_size", "moe_intermediate_size", "q_lora_rank", "kv_lora_rank")
HEADS = ("num_attention_heads", "num_key_value_heads")
PER_HEAD = ("head_dim", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


def shapes(config) -> dict:
    return {k: getattr(config, k) for k in (*WIDTHS, *HEADS, *PER_HEAD) if getattr(config, k, None) is not None}


def _bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def layer_bytes(layer: torch.nn.Module) -> tuple[int, int]:
    """(one routed expert's bytes, the rest of the layer's bytes: attention, norms, router, shared expert) of a MoE
    decoder layer as its tensors store them (works on the meta device)."""
    experts = layer.mlp.experts
    return _bytes(experts) // experts.num_experts, _bytes(layer) - _bytes(experts)


def random_init_(module: torch.nn.Module, generator: torch.Generator) -> None:
    """The benchmark's random weights, in place: norms 1, biases 0, everything else normal(0, 0.02)."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.normal_(0.0, 0.02, generator=generator)


def forced_indices(gamma: int, k: int, unique: int, num_experts: int, generator: torch.Generator) -> torch.Tensor:
    """[γ, k] expert ids over exactly `unique` experts drawn at random from N: slot j of the γk gets the (j mod E)-th
    of them, so each token has k distinct experts (E >= k) and every one of the E is used (γk >= E)."""
    if not k <= unique <= min(num_experts, gamma * k):
        raise ValueError(f"E={unique}: needs top-k {k} <= E <= min(N={num_experts}, γ·k={gamma * k})")
    chosen = torch.randperm(num_experts, generator=generator)[:unique]
    return chosen[torch.arange(gamma * k) % unique].view(gamma, k)


def timed(run: Callable[[], object], device: torch.device) -> float:
    """Seconds of one call: CUDA events after a synchronize on a GPU, perf_counter on a CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    run()
    return time.perf_counter() - t0


def timed_in_rounds(
    points: Sequence[tuple[Callable[[], object], Callable[[int], None]]], warmup: int, repeats: int, device
) -> list[list[float]]:
    """Each point's `repeats` timed calls after `warmup` untimed ones, taken in rounds of one call of every point
    (`(run, prepare)`: `prepare(i)` sets the i-th call's inputs), so that a burst of load on a shared machine falls
    on all points alike instead of tilting the one timed during it."""
    times: list[list[float]] = [[] for _ in points]
    for i in range(warmup + repeats):
        for j, (run, prepare) in enumerate(points):
            prepare(i)
            t = timed(run, device)
            if i >= warmup:
                times[j].append(t)
    return times


def timing_fields(
    times: list[float], layers: int, e: int, expert_bytes: int, dense_bytes: int, peak_bps: float | None = None
) -> dict:
    """The fields of a pass record that its timed calls and its bytes give (both benchmarks' records carry them):
    the median and the minimum, the bytes read (`layers` x (E experts + the dense part)), GB/s and the fraction of
    the device's peak where one is known."""
    t_pass = statistics.median(times)
    nbytes = layers * (e * expert_bytes + dense_bytes)
    return {
        "t_pass_s": t_pass,
        "t_layer_s": t_pass / layers,
        "t_pass_min_s": min(times),
        "times_s": times,
        "bytes": nbytes,
        "expert_bytes": expert_bytes,
        "dense_layer_bytes": dense_bytes,
        "gbps": nbytes / t_pass / 1e9,
        "bw_fraction": nbytes / t_pass / peak_bps if peak_bps else None,
    }


def pass_line(model: str, impl: str, rec: dict) -> str:
    """One timed point as the benchmarks echo it."""
    frac = f", {rec['bw_fraction']:.0%} of peak" if rec["bw_fraction"] else ""
    return (
        f"{model} {impl:<10} γ={rec['gamma']:<2} E={rec['E']:<3} {rec['t_pass_s'] * 1e3:9.3f} ms/pass "
        f"{rec['t_layer_s'] * 1e3:8.3f} ms/layer {rec['gbps']:8.2f} GB/s{frac}"
    )


def e_values(gamma: int, k: int, n: int, points: int, experts: Sequence[int] | None = None) -> list[int]:
    """The E a γ-token pass is timed at: `experts` within [k, min(N, γk)], else `points` values spread evenly over
    that range, both ends included."""
    hi = min(n, gamma * k)
    if experts:
        return sorted({e for e in experts if k <= e <= hi})
    if points == 1 or hi == k:
        return [hi]
    return sorted({round(k + (hi - k) * i / (points - 1)) for i in range(points)})
