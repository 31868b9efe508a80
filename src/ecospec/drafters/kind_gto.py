"""gto: an EAGLE-3 head trained further with Group Tree Optimization (Table 5): `path`, else the embedded default's
GTO stage (model=tiny), else the head `experiment=gto` published in the store."""

from ecospec.drafters.kind_eagle3 import load_head, prepare_head
from ecospec.drafters.registry import DrafterKind, LoadContext, register


def load(ctx: LoadContext):
    path = ctx.spec.get("path")

    def where():
        if path is not None:
            return ctx.local(path)
        if ctx.model["source"] == "tiny":  # the release's (a cache build: built on first use)
            return ctx.tiny_dirs(ctx.model, until="gto")["gto"] / "head"
        from ecospec.store import gto_root

        return gto_root(ctx.model) / "head"

    return load_head(ctx, where)


KIND = register(DrafterKind(name="gto", label="GTO", load=load, prepare=prepare_head, hidden=True, order=40))
