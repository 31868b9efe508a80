"""Methods: how one SD step picks the draft nodes the target verifies. Each module of this package registers one
`MethodSpec` (its name, what it needs, how the reports print it, its rule), so a new method is a new module here
plus its `conf/method/*.yaml`, nothing else. Importable without torch: validation and the reports read it.

A rule sees the draft tree as `Candidates` (structure, probabilities, expert trajectories as int bitmasks, the
buffer of experts already loaded) and returns the node indices to verify, prefix-closed (docs/design.md,
"Selection rules"). Per prompt the decode loop opens a `Session` of the method (`MethodSpec.open`): each step it
asks how deep and wide to draft (`shape`; depth 0 drafts nothing), which nodes to verify (`choose`; none makes the
step an AR step), and tells it what the step produced (`observe`), so a method can keep state across the steps of
one prompt. The default session drafts the configured tree and applies the rule (every method today).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ecospec.methods._candidates import Candidates
from ecospec.methods._session import Session
from ecospec.registry import Registry

__all__ = ["AR", "CHAIN", "TREE", "Candidates", "MethodSpec", "Session", "method", "methods", "names", "register"]

AR = "ar"  # conf/method/ar.yaml: the method without a drafter, the baseline every cell times
TREE, CHAIN = "tree", "chain"  # what a method verifies: a draft tree's chosen nodes, or one drafted path


@dataclass(frozen=True)
class MethodSpec:
    """What the project knows of a method, in one place."""

    name: str  # `method.selector` in conf/method, the policy of `ecospec.select`
    label: str  # how the tables print it ("" for the baseline: the tables print its drafter instead)
    colour: str  # its colour in the figures (matplotlib)
    role: str  # its role in the paper's tables (baseline for the confidence rerank, else usually its name)
    predictor: str | None  # the expert sets it needs: None, "learned" (the expert predictor) or "oracle"
    buffered: bool  # keeps an expert buffer across picks (then a batch may share one, `select_batch`)
    rule: Callable[[Candidates, int], list[int]]  # (candidates, budget) -> chosen node indices
    order: int = 50  # its place in the tables (smaller first)
    cost_model: bool = False  # it prices passes in seconds and needs a verify-cost profile
    session: Callable | None = None  # (spec, gamma, depth, topk, cost) -> a Session; None: the default one
    # (cost, trees, budget) -> each sequence's chosen nodes: one decision for the whole batch (`choose_rows`)
    batch_rule: Callable | None = None
    adaptive: bool = False  # decides each step whether and how much to draft (the pages hold it to AR's floor)
    drafts: str = TREE  # TREE or CHAIN; a method named by its drafter prints as "<drafter> <drafts>" ("EAGLE-3 tree")
    rivals: tuple[str, ...] = ()  # the methods the pages check it is not slower than (the better of them)

    def open(self, gamma: int, depth: int, topk: int, cost=None):
        """The method's state for one prompt (`session` or the default `Session`)."""
        return (self.session or Session)(self, gamma, depth, topk, cost)


REGISTRY = Registry(
    "method", __name__, lambda name, names: ValueError(f"unknown policy {name!r}; allowed: {', '.join(names)}")
)
_REGISTRY = REGISTRY.entries
register = REGISTRY.register
methods = REGISTRY.all  # every registered method, in the tables' order
names = REGISTRY.names
method = REGISTRY.get  # the method called `name`; an unknown one is a ValueError naming the registered ones


def needing_experts() -> tuple[str, ...]:
    """The methods whose rule reads expert sets (a predictor's or the router's)."""
    return tuple(m.name for m in methods() if m.predictor is not None)
