"""The methods a page shows, as the registries describe them (`ecospec.methods`, `drafters.registry`): a page reads
which methods its records hold and asks here for their order, labels and kind, so it names none itself."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ecospec.drafters.registry import labels as drafter_labels
from ecospec.methods import CHAIN, TREE, MethodSpec, method, names

BASELINE = "confidence"  # the selector the others are measured against (EAGLE's, `selector="confidence"`)


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
