"""gto: an EAGLE-3 head trained further with Group Tree Optimization (Table 5): `path`, else the embedded default's
GTO stage (model=tiny), else the head `experiment=gto` published in the store."""

from ecospec import sources
from ecospec.drafters.kind_eagle3 import KIND as BASE_KIND
from ecospec.drafters.kind_eagle3 import load_head, prepare_head
from ecospec.drafters.registry import DrafterKind, LoadContext, register
from ecospec.store import gto_root, stored_gto

NAME = "gto"  # the kind, its build stage and the job kind that trains it (experiment=gto)
STAGE = NAME
BASE = BASE_KIND.name  # the head it trains further


def load(ctx: LoadContext):
    path = ctx.spec.get("path")

    def where():
        if path is not None:
            return ctx.local(path)
        if sources.builtin(ctx.model):  # the release's (a cache build: built on first use)
            return ctx.tiny_dirs(ctx.model, until=STAGE)[STAGE] / "head"
        return gto_root(ctx.model) / "head"

    return load_head(ctx, where)


def missing(model: dict) -> str | None:
    """The head `experiment=gto` publishes, where the model names no `path` and does not ship one."""
    spec = (model.get("drafters") or {}).get(NAME) or {}
    if sources.builtin(model) or spec.get("path") or stored_gto(model) is not None:
        return None
    return (
        f"a GTO-trained EAGLE-3 head for model={model['name']}; make it with: python run.py -m experiment={NAME} "
        f"model={model['name']} (looked in {gto_root(model) / 'head'}), or set model.drafters.{NAME}.path=<directory "
        "or HF id>"
    )


KIND = register(
    DrafterKind(
        name=NAME,
        label="GTO",
        load=load,
        prepare=prepare_head,
        hidden=True,
        build_stage=STAGE,
        weights="head",
        shape_of=BASE,
        missing=missing,
        standard=False,
        order=40,
    )
)
