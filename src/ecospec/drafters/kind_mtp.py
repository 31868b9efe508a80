"""mtp: DeepSeek-V3's multi-token-prediction module as a drafter; `path: null` reads the MTP layer stored in the
target's checkpoint (only its shards), `path: random` a random head (tests)."""

from ecospec.drafters.registry import DrafterKind, LoadContext, register


def load(ctx: LoadContext):
    from ecospec.drafters.mtp import MtpDrafter, MtpHead, init_random_weights
    from ecospec.drafters.mtp_checkpoint import load_mtp

    target, path = ctx.target, ctx.spec.get("path")
    if path == "random":
        return MtpDrafter(init_random_weights(MtpHead.for_target(target), seed=1).eval(), target)
    head = load_mtp(path or ctx.model["target"], target.config, dtype=target.dtype, device=target.device)
    return MtpDrafter(head, target)


KIND = register(DrafterKind(name="mtp", label="MTP", load=load, weights="mtp", order=20))
