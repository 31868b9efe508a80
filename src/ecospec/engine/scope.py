"""Facts of the engine that validation reads without torch: the engines, what the compiled engine runs (one
function for the engine, validation and the cells), the cache sizes its static shapes come in, and the batched
loop's expert-buffer modes."""

from __future__ import annotations

from ecospec.drafters.registry import kinds

ENGINES = ("eager", "compiled")
BATCH_BUFFERS = ("sequence", "batch")  # generate_batch: one expert buffer per sequence, or one for the batch
SLOTS = 512  # a compiled cache's size is a multiple of this: one shape serves every prompt of a usual cell


def slots(longest: int) -> int:
    """The cache slots a compiled decode of up to `longest` tokens gets."""
    return -(-longest // SLOTS) * SLOTS


def compiled_problem(
    family: str | None,
    *,
    hidden_act: str | None = None,
    drafter: str | None = None,
    expert_budget: int | None = None,
    batch_size: int = 1,
    parallel: str | None = None,
    backend: str = "hf",
) -> str | None:
    """Why `engine=compiled` cannot run this decode (one line), or None. Never a silent fall back to eager.
    `drafter`: the drafter's kind (eagle3, gto, mtp, draft_model) or None for AR; None facts are not checked."""
    if family is not None and family != "qwen3_moe":
        return f"engine=compiled supports Qwen3-MoE targets only (got {family}); use engine=eager"
    if hidden_act is not None and hidden_act != "silu":
        return f"engine=compiled needs SwiGLU experts (hidden_act silu, got {hidden_act})"
    if expert_budget is not None:
        return "engine=compiled takes no expert budget (MoE-Spec) yet; use engine=eager"
    compiled = [k.name for k in kinds() if k.compiled]
    if drafter is not None and drafter not in compiled:
        return f"engine=compiled drafts with {', '.join(compiled)}, not {drafter}"
    if parallel not in (None, "device_map"):
        return "engine=compiled runs on one process (no model.parallel=tp|ep)"
    if backend != "hf":
        return "engine is our engine's forward (backend=hf); vLLM compiles its own"
    return None
