"""Per-prompt rows and a cell's summary metrics, with the definitions the papers use.

alpha = tokens the SD steps produced / SD steps (bonus included; AR = 1; the first new token comes from the
prefill, as in HF's `generate` and vLLM, and is no step's). E = mean over verify passes and MoE layers of
the unique experts a pass activates in a layer. Timings are seconds per step. tokens_per_s = Σ new tokens /
Σ generation wall time over the cell's prompts (Spec-Bench's convention); speedup = tokens_per_s / AR's on
the same prompts and settings (at batch size B > 1: batched AR at the same B, the same batches). At B > 1,
E and the step timings are per batched verify pass (E = unique experts per layer over all sequences' tokens of
the pass), a batch's wall time is counted once (split evenly over its prompt rows), and rho = T_AR / T_verify
(AR's mean step time / the mean verify-pass time at the same B, paper Table 8). The oracle's router look-ups
(t_pred) are analysis-only: they are taken out of its wall time. loop_share = share of outputs of full length
whose last 16 tokens repeat one token or one 2-token pattern (`in_loop`): how often greedy decoding of the model
degenerates.
"""

from __future__ import annotations

import torch

from ecospec.analysis.loops import in_loop
from ecospec.engine.records import GenerateResult

PHASES = ("t_pred", "t_draft", "t_select", "t_verify", "t_total", "t_cpu")  # t_cpu: the step's thread CPU time


def prompt_row(
    pid: str,
    turn: int,
    prompt_tokens: int,
    res: GenerateResult,
    seconds: float,
    oracle: bool,
    cpu_seconds: float | None = None,
) -> dict:
    """Everything the summary needs from one generation (sums, so rows of a cell add up). `seconds`: its wall time,
    `cpu_seconds`: the decoding thread's CPU time over the same span (`experiment.clock`)."""
    steps = res.steps
    layers = len(steps[0].experts) if steps else 0
    sums = {f"{p}_s": sum(getattr(s, p) for s in steps) for p in PHASES}
    if oracle:  # the oracle's router look-ups are analysis only
        seconds, cpu_seconds = without_lookups(seconds, cpu_seconds, sums["t_pred_s"])
    return {
        "id": pid,
        "turn": turn,
        "prompt_tokens": prompt_tokens,
        "tokens": list(res.tokens),
        "n_tokens": len(res.tokens),
        "steps": len(steps),
        "accepted": sum(s.accepted for s in steps),
        "verified": sum(s.verified for s in steps),
        "speculated": sum(s.verified > 1 for s in steps),  # steps that verified more than the root
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "t_prefill_s": res.t_prefill,
        "t_prefill_cpu_s": res.t_prefill_cpu,
        **sums,
        "experts_sum": [sum(s.experts[i] for s in steps) for i in range(layers)],
        "expert_load": res.expert_load,
        "alpha": res.alpha,
        "experts_per_layer": res.experts_per_layer,
        "loop": in_loop(list(res.tokens)),
        **positions(steps),
    }


def positions(steps) -> dict:
    """Per draft depth i = 1, 2, ...: the steps whose draft tree reached depth i (`drafted_at`) and those whose
    accepted path reached it (`accepted_at`), sums like the rest of a row; `acceptance_by_position` divides them."""
    deepest = max((s.drafted_depth for s in steps), default=0)
    return {
        "drafted_at": [sum(s.drafted_depth >= i for s in steps) for i in range(1, deepest + 1)],
        "accepted_at": [sum(s.accepted - 1 >= i for s in steps) for i in range(1, deepest + 1)],
    }


def acceptance_by_position(rows: list[dict]) -> list[float] | None:
    """For depth i, the share of steps that drafted at depth >= i whose accepted path reached depth i: vLLM's
    per-position acceptance for a chain (every draft proposes every position), extended to trees. α counts the bonus
    token on top (α = 1 + the sum over positions of accepted_at / steps). None for records without the counts."""
    rows = [r for r in rows if "drafted_at" in r]
    if not rows:
        return None
    width = max(len(r["drafted_at"]) for r in rows)
    drafted = [sum(r["drafted_at"][i] for r in rows if i < len(r["drafted_at"])) for i in range(width)]
    accepted = [sum(r["accepted_at"][i] for r in rows if i < len(r["accepted_at"])) for i in range(width)]
    return [a / d if d else None for a, d in zip(accepted, drafted, strict=True)]


def without_lookups(seconds: float, cpu_seconds: float | None, lookups_s: float) -> tuple[float, float | None]:
    """(wall, CPU) seconds less the oracle's router look-ups, timed on the wall clock: off the CPU time at their share
    of the wall time (on a busy core the thread ran for only part of the wall time, so subtracting wall seconds
    from CPU seconds would take off more than the look-ups cost, down to a negative time)."""
    share = lookups_s / seconds if seconds > 0 else 0.0
    return seconds - lookups_s, None if cpu_seconds is None else cpu_seconds * (1 - share)


def batch_row(n: int, keys: list[str], res, seconds: float, oracle: bool, cpu_seconds: float | None = None) -> dict:
    """What the batched verify passes of batch `n` did (`res`: a BatchResult), as sums like `prompt_row`'s: E and
    the step timings of a batch_size > 1 cell are per batched pass (the paper's "active experts" at B > 1)."""
    steps = res.steps
    layers = len(steps[0].experts) if steps else 0
    sums = {f"{p}_s": sum(getattr(s, p) for s in steps) for p in PHASES}
    return {
        "batch": n,
        "keys": keys,
        "sequences": len(keys),
        "passes": len(steps),
        "verified": sum(s.verified for s in steps),
        "tokens": sum(len(r.tokens) for r in res.results),
        "longest": max((len(r.tokens) for r in res.results), default=0),  # every row waits for the batch's passes
        **dict(
            zip(
                ("seconds", "cpu_seconds"),
                without_lookups(seconds, cpu_seconds, sums["t_pred_s"]) if oracle else (seconds, cpu_seconds),
                strict=True,
            )
        ),
        "t_prefill_s": res.t_prefill,
        "t_prefill_cpu_s": res.t_prefill_cpu,
        **sums,
        "experts_sum": [sum(s.experts[i] for s in steps) for i in range(layers)],
    }


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def _per_step(rows: list[dict], key: str, steps: int) -> float | None:
    """Σ key / steps; None where a row lacks the key (rows checkpointed before it was recorded, e.g. t_cpu_s)."""
    if any(key not in r for r in rows):
        return None
    return _ratio(sum(r[key] for r in rows), steps)


def row_seconds(row: dict, clock: str = "wall") -> float:
    """A row's seconds under `clock` (`experiment.clock`): `cpu_seconds` for thread_cpu, else its wall `seconds`."""
    if clock == "thread_cpu":
        if row.get("cpu_seconds") is None:
            raise ValueError(f"prompt row {row.get('id')!r} has no cpu_seconds: it was timed before thread_cpu")
        return row["cpu_seconds"]
    return row["seconds"]


def tpot(rows: list[dict], batches: list[dict] | None = None, clock: str = "wall") -> float | None:
    """Seconds per output token after the first, as vLLM counts TPOT (the prefill and its first token left out),
    averaged over sequences: a sequence's decode time over its tokens after the first; in a batch its batch's decode
    time over the batch's longest output (every row waits for the batch's passes). None for rows that lack the
    prefill's time on `clock` (recorded before it was kept)."""
    units = (
        [(b, b["sequences"], b.get("longest", 0)) for b in batches]
        if batches
        else [(r, 1, r["n_tokens"]) for r in rows]
    )
    prefill = "t_prefill_cpu_s" if clock == "thread_cpu" else "t_prefill_s"
    if any(prefill not in u for u, _, _ in units):
        return None
    per = [(n, (row_seconds(u, clock) - u[prefill]) / (longest - 1)) for u, n, longest in units if longest > 1]
    return _ratio(sum(n * t for n, t in per), sum(n for n, _ in per))


def hf_seconds(row: dict, clock: str = "wall") -> float:
    """An AR row's transformers' `generate` seconds under `clock` (`hf_cpu_seconds` for thread_cpu)."""
    return row["hf_cpu_seconds"] if clock == "thread_cpu" else row["hf_seconds"]


def summarize(rows: list[dict], batches: list[dict] | None = None, clock: str = "wall") -> dict:
    """Summary metrics of a cell from its prompt rows (AR fields are added by the caller). With `batches` (batch
    rows of a batch_size > 1 cell), E and the per-step timings are per batched verify pass; alpha stays per
    sequence (tokens a sequence gains per step, averaged over every sequence's steps). tokens_per_s divides by
    `clock`'s seconds; `wall_seconds` is kept beside them."""
    steps = sum(r["steps"] for r in rows)
    tokens = sum(r["n_tokens"] for r in rows)
    seconds = sum(row_seconds(r, clock) for r in rows)
    layers = max((len(r["experts_sum"]) for r in rows), default=0)
    by_layer = [_ratio(sum(r["experts_sum"][i] for r in rows if r["experts_sum"]), steps) for i in range(layers)]
    out = {
        "alpha": _ratio(sum(r["accepted"] for r in rows), steps),
        "experts_per_layer": sum(by_layer) / layers if layers and steps else None,
        "experts_by_layer": by_layer,
        **{f"{p}_s": _per_step(rows, f"{p}_s", steps) for p in PHASES if p != "t_total"},
        "t_step_s": _ratio(sum(r["t_total_s"] for r in rows), steps),
        "t_prefill_s": _ratio(sum(r["t_prefill_s"] for r in rows), len(rows)),
        "tokens": tokens,
        "steps": steps,
        "prompts": len(rows),
        "seconds": seconds,
        "wall_seconds": sum(r["seconds"] for r in rows),
        "clock": clock,
        "tokens_per_s": _ratio(tokens, seconds),
        "tpot_s": tpot(rows, batches, clock),
        "acceptance_by_position": acceptance_by_position(rows),
        "mean_block": _ratio(sum(r.get("verified", 0) for r in rows), steps),  # tokens a verify pass checks
        # share of steps that speculated (verified more than the root); None for rows written before it was kept
        "speculating": _ratio(sum(r["speculated"] for r in rows), steps)
        if all("speculated" in r for r in rows)
        else None,
        # share of full-length outputs whose last 16 tokens are a loop of period <= 2 (output quality)
        "loop_share": _ratio(sum(bool(r.get("loop")) for r in loops), len(loops))
        if (loops := [r for r in rows if r.get("loop") is not None])
        else None,
    }
    if batches:
        passes = sum(b["passes"] for b in batches)
        by_layer = [
            _ratio(sum(b["experts_sum"][i] for b in batches if b["experts_sum"]), passes) for i in range(layers)
        ]
        out["experts_per_layer"] = sum(by_layer) / layers if layers and passes else None
        out["experts_by_layer"] = by_layer
        out.update({f"{p}_s": _per_step(batches, f"{p}_s", passes) for p in PHASES if p != "t_total"})
        out["t_step_s"] = _ratio(sum(b["t_total_s"] for b in batches), passes)
        out["t_prefill_s"] = _ratio(sum(b["t_prefill_s"] for b in batches), len(batches))
        out["passes"] = passes
        out["batches"] = len(batches)
    return out


def expert_load(rows: list[dict]) -> list[list[int]]:
    """[MoE layers][N] tokens routed to each expert over the cell's verify passes."""
    loads = [r["expert_load"] for r in rows if r["expert_load"]]
    if not loads:
        return []
    return [
        [sum(load[layer][e] for load in loads) for e in range(len(loads[0][layer]))] for layer in range(len(loads[0]))
    ]


def step_traces(rows: list[dict]) -> list[dict]:
    """The kept verify-pass traces of a cell (trace_steps > 0), each tagged with its prompt and step."""
    return [
        {"prompt": r["id"], "turn": r["turn"], "step": i, **t} for r in rows for i, t in enumerate(r.get("trace", ()))
    ]


def public_row(row: dict) -> dict:
    """A prompt row as stored in result.json: per-layer means instead of sums, no per-prompt load."""
    out = {k: v for k, v in row.items() if k not in ("experts_sum", "expert_load", "trace")}
    out["experts_by_layer"] = [x / row["steps"] for x in row["experts_sum"]] if row["steps"] else []
    return out


@torch.no_grad()
def replay_quality(target, prompt_ids: list[int], tokens: list[int]) -> dict:
    """How a lossy (budgeted) generation compares with the full target, from one unbudgeted forward over the
    committed sequence (not timed): `budget_errors`, the committed tokens the full target's greedy choice at that
    position is not; `loglik`, their summed log-probability under the full target (temperature 1)."""
    if not tokens:
        return {"budget_errors": 0, "loglik": 0.0}
    seq = torch.tensor([list(prompt_ids) + list(tokens)], device=target.device)
    logits = target(seq[:, :-1]).logits[0, len(prompt_ids) - 1 :].float()
    got = torch.tensor(tokens, device=logits.device)
    logp = torch.log_softmax(logits, dim=-1).gather(1, got[:, None])[:, 0]
    return {"budget_errors": int((logits.argmax(-1) != got).sum()), "loglik": float(logp.sum())}


def first_divergence(a: list[int], b: list[int]) -> int:
    """The first position where two outputs differ; the shorter length when one is the other's prefix, so a prompt
    that never diverges counts its whole length."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def quality_summary(rows: list[dict], ar: dict, temperature: float) -> dict:
    """A budgeted cell's quality (MoE-Spec is lossy): greedy: budget_error_rate (share of committed tokens the full
    target would not have produced there) and the mean first divergence from AR; sampling: the mean per-token
    log-likelihood under the full target beside AR's own."""
    tokens = sum(r["n_tokens"] for r in rows)
    out = {"budget_error_rate": _ratio(sum(r.get("budget_errors", 0) for r in rows), tokens)}
    outs = ar.get("outputs") or {}
    div = [first_divergence(r["tokens"], outs.get(f"{r['id']}/{r['turn']}", [])) for r in rows]
    out["first_divergence"] = sum(div) / len(div) if div else None
    out["loglik_per_token"] = _ratio(sum(r.get("loglik", 0.0) for r in rows), tokens)
    ar_ll = ar.get("loglik") or {}
    if temperature > 0 and ar_ll:
        ar_tokens = sum(len(outs.get(k, [])) for k in ar_ll)
        out["ar_loglik_per_token"] = _ratio(sum(ar_ll.values()), ar_tokens)
    if temperature == 0:
        out.pop("loglik_per_token")
    else:
        out.pop("budget_error_rate")
    return out
