"""draft_model: a separate causal LM sharing the target's vocabulary (an HF id or directory); `path: perturbed`
is a perturbed copy of the target (tests: it agrees on most greedy tokens)."""

from ecospec.drafters.registry import DrafterKind, LoadContext, as_is, register


def load(ctx: LoadContext):
    from ecospec.drafters.draft_model import DraftModelDrafter

    target, spec = ctx.target, ctx.spec
    if spec.get("path") == "perturbed":
        from ecospec.models import perturbed_copy

        base = target
        if ctx.parallel_mode != "device_map":  # the drafter is replicated: perturb an unsharded copy
            from ecospec.models import tiny_model
            from ecospec.models.byte_tokenizer import VOCAB_SIZE

            base = tiny_model(ctx.model["preset"], seed=ctx.model.get("seed", 0), vocab_size=VOCAB_SIZE)
            base = base.to(device=target.device, dtype=target.dtype)
        return DraftModelDrafter(perturbed_copy(base, scale=spec.get("scale", 0.05), seed=1))
    from transformers import AutoModelForCausalLM

    draft = AutoModelForCausalLM.from_pretrained(str(ctx.local(spec["path"])), dtype=target.dtype)
    return DraftModelDrafter(draft.to(target.device).eval())


KIND = register(DrafterKind(name="draft_model", label="Draft model", load=load, prepare=as_is, weights="lm", order=30))
