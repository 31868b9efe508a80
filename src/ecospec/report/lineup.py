"""The methods a page shows, as the registries describe them (`ecospec.methods`, `drafters.registry`, conf/method),
so that no page names one itself. Two kinds of page ask here: the MoE-methods and batch pages show the methods their
records hold (`lineup`: order, labels, kind); a paper table shows the methods its experiment runs (`sweep`: the
roles of conf/experiment/<table>.yaml's methods and the pairs its ratio rows read)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import pandas as pd
import yaml

from ecospec import conf_dir
from ecospec.drafters.registry import labels as drafter_labels
from ecospec.experiment.config import method_config
from ecospec.methods import AR, CHAIN, TREE, MethodSpec, method, names

BASELINE = "confidence"  # the selector the others are measured against (EAGLE's, `selector="confidence"`)
BASE_ROLE = method(BASELINE).role  # its role in the tables: the model's own drafter with confidence selection


@dataclass(frozen=True)
class Entry:
    name: str  # the conf/method name its records carry
    spec: MethodSpec  # its selector's record
    label: str  # its selector's label, else its drafter's with what it drafts ("EAGLE-3 tree", "EAGLE-3 chain")

    @property
    def adaptive(self) -> bool:
        return self.spec.adaptive


def lineup(frame: pd.DataFrame) -> dict[str, Entry]:
    """The methods of `frame`'s records (method, selector, drafter), in the registry's order."""
    drafters = drafter_labels()
    entries = []
    for name, selector, drafter in (
        frame[["method", "selector", "drafter"]].drop_duplicates("method").itertuples(index=False)
    ):
        spec = method(selector)
        shown = drafters.get(drafter, drafter)
        label = spec.label if spec.label and spec.drafts == TREE else f"{shown} {spec.drafts}"
        entries.append(Entry(name, spec, label))
    return {e.name: e for e in sorted(entries, key=lambda e: (e.spec.order, e.name))}


def adaptive(frame: pd.DataFrame) -> pd.Series:
    """Per record, whether its method adapts how much it drafts (`MethodSpec.adaptive`)."""
    known = set(names())
    return frame["selector"].map(lambda s: s in known and method(s).adaptive).astype(bool)


def baseline(entries: dict[str, Entry]) -> str | None:
    """The method the others are measured against: the model's drafter with confidence selection."""
    return next((n for n, e in entries.items() if e.spec.name == BASELINE), None)


def chain(entries: dict[str, Entry]) -> str | None:
    """The method that drafts one path (`MethodSpec.drafts`)."""
    return next((n for n, e in entries.items() if e.spec.drafts == CHAIN), None)


# -- a paper table's line-up: the methods its experiment runs ------------------------------------------------------


@dataclass(frozen=True)
class Sweep:
    """The methods conf/experiment/<name>.yaml runs and how its table reads them: a table's rows are these roles
    (`MethodSpec.role`, AR's for a method without a drafter), so the sweep that makes a table and the table that
    reads it share one list. Its ratio rows read each role against the first in the tables' order
    (`MethodSpec.order`): EcoSpec against the baseline or the global-cost ablation, the oracle against EcoSpec."""

    methods: tuple[str, ...]  # conf/method names, in the order the experiment lists them (interleaved ones too)
    roles: tuple[str, ...]  # their roles in the tables' order, each once
    pairs: tuple[tuple[str, str], ...]  # (role, the role it is read against)
    method_pairs: tuple[tuple[str, str], ...]  # the same pairs by conf/method name (the first of each role)


def _listed(value) -> list[str]:
    """A sweep value ("a,b", "[a,b]", a list) as its items."""
    if value is None:
        return []
    if isinstance(value, list | tuple):
        return [str(v) for v in value]
    return [v.strip() for v in str(value).strip("[]").split(",") if v.strip()]


conf_of = cache(method_config)  # conf/method/<name>.yaml, read once per name


def _method_confs() -> list[dict]:
    return [conf_of(p.stem) for p in sorted((conf_dir() / "method").glob("*.yaml"))]


@cache
def experiment_conf(name: str) -> dict:
    """conf/experiment/<name>.yaml as written (its sweep's values unexpanded)."""
    return yaml.safe_load((conf_dir() / "experiment" / f"{name}.yaml").read_text())


def spec_of(name: str) -> MethodSpec:
    """The selector's record of conf/method/<name>.yaml's method."""
    return method(conf_of(name)["selector"])


def role_of(name: str) -> str:
    """The role of conf/method/<name>.yaml's method: AR's without a drafter, else its selector's."""
    return AR if conf_of(name).get("drafter") is None else spec_of(name).role


def _order(name: str) -> int:
    return -1 if role_of(name) == AR else spec_of(name).order  # AR first: every speedup is over it


@cache
def sweep(experiment: str) -> Sweep:
    """The line-up of conf/experiment/<experiment>.yaml: its sweep's methods (each grid's, then `params`, as the
    sweepers expand them), else the method its defaults pick, each followed by what its cells interleave."""
    conf = experiment_conf(experiment)
    chosen = [
        next(iter(d.values())) for d in conf.get("defaults") or () if isinstance(d, dict) and "override /method" in d
    ]
    sweeper = (conf.get("hydra") or {}).get("sweeper") or {}
    grids = [*(sweeper.get("grids") or ()), *([sweeper["params"]] if sweeper.get("params") else [])] or [{}]
    listed = [
        n
        for g in grids
        for m in _listed(g.get("method")) or chosen
        for n in (m, *_listed(g.get("interleave", conf.get("interleave"))))
    ]
    names = tuple(dict.fromkeys(listed))
    if not names:
        raise ValueError(f"conf/experiment/{experiment}.yaml runs no method")
    first_of = {}
    for n in sorted(names, key=_order):  # stable: the experiment's order within a role
        first_of.setdefault(role_of(n), n)
    roles = tuple(first_of)
    method_pairs = tuple((first_of[r], first_of[roles[0]]) for r in roles[1:])
    return Sweep(
        methods=names,
        roles=roles,
        pairs=tuple((r, roles[0]) for r in roles[1:]),
        method_pairs=method_pairs,
    )


@cache
def budgeted() -> dict[str, str]:
    """role -> the conf/method name of the method of that role that caps the experts a verify pass loads."""
    return {role_of(c["name"]): c["name"] for c in _method_confs() if c.get("budgeted")}


def named_for(kind: str) -> str:
    """The conf/method that drafts with drafter `kind` by confidence selection, unbudgeted: the model's own
    baseline under its drafter's name."""
    found = [
        c["name"]
        for c in _method_confs()
        if c.get("drafter") == kind and c["selector"] == BASELINE and not c.get("budgeted")
    ]
    if not found:
        raise ValueError(f"no conf/method drafts with {kind!r} by confidence selection")
    return found[0]


def label_of(name: str) -> str:
    """How a page prints conf/method/<name>.yaml's method: its selector's label, else its drafter's ("EAGLE-3")."""
    return spec_of(name).label or drafter_labels().get(conf_of(name).get("drafter"), name)
