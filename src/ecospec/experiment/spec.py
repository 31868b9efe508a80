"""The typed cell: what a cell job reads once its config is validated (`config.validate_cell` builds it), so that the
cell, its decoders and its components read fields, never the composed config. Plain frozen data; the model stays
its resolved mapping (its keys are each model family's own and the loaders read it whole)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from ecospec import methods
from ecospec.experiment.kinds import Job
from ecospec.identity import times_hf_peer


@dataclass(frozen=True)
class Method:
    """A method as a cell runs it: `drafter` is the kind it drafts with (`default` resolved to the model's), None
    for AR."""

    name: str
    selector: str = "confidence"
    drafter: str | None = None
    predictor: str | None = None  # learned | oracle | None
    budgeted: bool = False  # MoE-Spec's methods: verify passes capped at the cell's expert budget

    @property
    def speculative(self) -> bool:
        return self.drafter is not None


AR = Method(methods.AR)  # the baseline every cell times: the target alone


@dataclass(frozen=True)
class Dataset:
    """A benchmark by name, or the `mix` of several (`members`, `instances` drawn with `seed`)."""

    name: str
    source: str | None = None
    members: tuple[str, ...] = ()
    instances: int | None = None
    seed: int | None = None
    per_member: int | None = None
    turns: int | None = None


@dataclass(frozen=True)
class Decoding:
    """The cell's decoding settings, as `generate` and `generate_batch` take them."""

    gamma: int
    depth: int
    topk: int
    temperature: float
    top_p: float
    max_new_tokens: int
    seed: int
    batch_size: int = 1
    batch_buffer: str = "sequence"
    expert_budget: int | None = None
    budget_policy: str = "truncate"

    def generate_args(self, method: Method) -> dict:
        """generate()'s decoding arguments for `method`, with the expert budget of MoE-Spec's methods (never AR's)."""
        out = {
            k: getattr(self, k) for k in ("gamma", "depth", "topk", "temperature", "top_p", "max_new_tokens", "seed")
        }
        if method.budgeted:
            out.update(expert_budget=self.expert_budget, budget_policy=self.budget_policy)
        return out


@dataclass(frozen=True)
class Cell:
    """A validated cell: its job (identity, id, name, config as composed), then what its run reads."""

    job: Job
    model: Mapping
    method: Method
    dataset: Dataset
    decoding: Decoding
    split: str = "heldout"
    num_prompts: int | None = None
    trace_steps: int = 0
    engine: str = "eager"
    backend: Mapping = field(default_factory=lambda: {"name": "hf"})  # hf, or vllm with its server settings
    ar_baseline: str = "auto"
    ar_peer: str = "hf_generate"
    clock: str | None = None
    force: bool = False
    progress: bool = True
    out_dir: str = "experiments"
    interleave: tuple[Cell, ...] = ()  # the methods decoded beside this one, each as its own cell

    @property
    def id(self) -> str:
        return self.job.id

    @property
    def name(self) -> str:
        return self.job.name

    @property
    def chat(self) -> bool:
        """Whether prompts go through the tokenizer's chat template."""
        return self.model.get("chat_template", True)

    @property
    def hf_peer(self) -> bool:
        """Whether transformers' `generate` is timed beside AR (`identity.times_hf_peer`)."""
        return times_hf_peer(self.ar_peer, self.decoding.batch_size)


def _pick(cls, d: Mapping, skip: tuple[str, ...] = (), **extra) -> dict:
    """The fields of dataclass `cls` that `d` sets (None keeps the field's default), less `skip`, plus `extra`."""
    out = {f.name: d[f.name] for f in fields(cls) if f.name not in skip and d.get(f.name) is not None}
    return {**out, **extra}


def drafter_of(method: Mapping, model: Mapping) -> str | None:
    """The drafter kind a method config drafts with on `model`: its own, `default` meaning the model's."""
    drafter = method.get("drafter")
    return model.get("default_drafter") if drafter == "default" else drafter


def method_of(method: Mapping, model: Mapping) -> Method:
    drafter = drafter_of(method, model)
    return Method(**_pick(Method, method, drafter=drafter, budgeted=bool(method.get("budgeted"))))


def cell_of(job: Job, interleave: tuple[Cell, ...] = ()) -> Cell:
    """The typed cell of a validated cell job."""
    d = job.config
    dataset = d["dataset"]
    return Cell(
        job=job,
        model=d["model"],
        method=method_of(d["method"], d["model"]),
        dataset=Dataset(**_pick(Dataset, dataset, members=tuple(dataset.get("members") or ()))),
        decoding=Decoding(**_pick(Decoding, d)),
        **_pick(Cell, d, ("job", "model", "method", "dataset", "decoding"), interleave=interleave),
    )
