"""A vLLM cell's summary from its `vllm bench serve` rounds, in vLLM's words (docs/design.md, "Two engines").

TPOT: time per output token after the first, the mean over requests, averaged over rounds; TTFT likewise; tokens/s:
output tokens per second of the whole round (every request at the cell's concurrency). speedup = AR's TPOT / the
method's TPOT at the same concurrency (the overlap paper's metric; 1.0 for an AR cell). alpha = vLLM's acceptance
length, 1 + accepted draft tokens / drafts (the bonus token counted, as ours), with the acceptance rate of each draft
position; both read by vllm bench serve from the server's spec-decode counters around the round.
"""

from __future__ import annotations


def _mean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def engine_summary(rounds: list[dict]) -> dict:
    """TPOT, TTFT, throughput and acceptance of one server over its rounds (each a bench result file)."""
    out = {
        "tpot_s": _mean([r["mean_tpot_ms"] / 1e3 for r in rounds]),
        "median_tpot_s": _mean([r["median_tpot_ms"] / 1e3 for r in rounds]),
        "ttft_s": _mean([r["mean_ttft_ms"] / 1e3 for r in rounds]),
        "tokens_per_s": _mean([r["output_throughput"] for r in rounds]),
        "requests": sum(r["completed"] for r in rounds),
        "tokens": sum(r["total_output_tokens"] for r in rounds),
        "round_tpot_s": [r["mean_tpot_ms"] / 1e3 for r in rounds],
    }
    if any("spec_decode_acceptance_length" in r for r in rounds):
        drafts = sum(r.get("spec_decode_num_drafts", 0) for r in rounds)
        accepted = sum(r.get("spec_decode_accepted_tokens", 0) for r in rounds)
        out["alpha"] = 1 + accepted / drafts if drafts else None
        out["acceptance_rate"] = accepted / max(sum(r.get("spec_decode_draft_tokens", 0) for r in rounds), 1)
        per_pos = [r.get("spec_decode_per_position_acceptance_rates") or [] for r in rounds]
        width = max(map(len, per_pos), default=0)
        out["acceptance_by_position"] = [_mean([p[i] for p in per_pos if i < len(p)]) for i in range(width)]
        out["drafts"] = drafts
    else:
        out["alpha"] = 1.0  # AR: one token per step
    return out


def cell_summary(method: str, rounds: list[dict], ar_rounds: list[dict], concurrency: int) -> dict:
    """The record's summary: the method's numbers, AR's beside them (`ar_*`), and the speedup."""
    s = engine_summary(rounds)
    ar = s if method == "ar" else engine_summary(ar_rounds)
    s.update({f"ar_{k}": ar[k] for k in ("tpot_s", "ttft_s", "tokens_per_s", "median_tpot_s")})
    s["speedup"] = ar["tpot_s"] / s["tpot_s"] if s["tpot_s"] and ar["tpot_s"] else None
    s["batch_size"] = concurrency
    s["rounds"] = len(rounds)
    return s
