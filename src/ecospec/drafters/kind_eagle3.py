"""eagle3: an EAGLE-3 head (either public checkpoint layout, `drafters.eagle3_checkpoint`), or the embedded
default's; `path: random` for a random head (tests)."""

from ecospec.drafters.registry import DrafterKind, LoadContext, register


def load_head(ctx: LoadContext, where):
    from ecospec.drafters.eagle3 import Eagle3Drafter, Eagle3Head, init_random_weights
    from ecospec.drafters.eagle3_checkpoint import load_eagle3
    from ecospec.drafters.eagle3_train import default_head_config

    target = ctx.target
    if ctx.spec.get("path") == "random":
        head = init_random_weights(Eagle3Head(default_head_config(target)), seed=1 if ctx.kind == "eagle3" else 3)
    else:
        head = load_eagle3(where(), target.config)
    head = head.to(device=target.device, dtype=target.dtype).eval()
    return Eagle3Drafter(head, target.get_input_embeddings(), temperature=ctx.temperature)


def prepare_head(drafter, **shape):
    """engine=compiled's EAGLE-3 head (`engine.static_eagle3`): native steps, or inductor's graphs."""
    from ecospec.engine.static_eagle3 import prepare_drafter

    return prepare_drafter(drafter, **shape)


def load(ctx: LoadContext):
    path = ctx.spec.get("path")
    return load_head(ctx, lambda: ctx.local(path) if path is not None else ctx.tiny_dirs(ctx.model)[STAGE] / "head")


STAGE = "drafter"  # the embedded default's build stage that trains the head
KIND = register(
    DrafterKind(
        name="eagle3",
        label="EAGLE-3",
        load=load,
        prepare=prepare_head,
        hidden=True,
        build_stage=STAGE,
        weights="head",
        order=10,
    )
)
