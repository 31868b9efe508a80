"""Model families: one record per supported HF MoE architecture, each in its own module of this package, so a new
family is a new module here (plus, for the reports, a `conf/model` entry), nothing else. Importable without torch:
validation, the sizing command and the reports read it; the record's rules that act on tensors import torch when
called.

A record holds what the engine, the parallel plans, MoE-Spec's budget, the cost model and the tests know of a
family: its HF causal LM and config classes, how its config gives its parameter counts (`_counts.Counts`), the
router's attribute in a MoE block, the tiny test presets, which transformers parallel modes fail for it, and its
routing rule (the score the budget ranks experts by, whether top-k weights are renormalised, the top-k weights of a
truncated token and a substituted token's experts).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ecospec.families._counts import Counts  # noqa: F401 - the record's type, for the families' modules
from ecospec.registry import Registry

# token ids every tiny preset uses: pad 0, bos 1, eos 2 (vocab 256)
IDS = {"vocab_size": 256, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False}


@dataclass(frozen=True)
class Family:
    name: str  # the HF config's model_type
    causal_lm: str  # the HF causal-LM class name (the engine matches a model by it, or by a base of its class)
    config_class: tuple[str, str]  # (module, class) of its HF config: plans and shapes without building a model
    router: str  # the attribute of a MoE block that holds its router
    presets: dict[str, dict]  # tiny configs of the real architecture (tests, CPU experiments): name -> kwargs
    check_preset: str  # the preset `ecospec.bench.gpu_check` decodes
    # MoE-Spec's budget (engine.budget): [tokens, N] scores the kept set is ranked by (router, logits) -> tensor
    scores: Callable
    normalises: Callable  # router -> whether the model renormalises its top-k weights
    truncate: Callable  # (router, logits, indices, inside, normalises) -> the kept slots' weights
    substitute: Callable  # (router, logits, keep, k, normalises) -> (weights, indices) chosen among the kept
    counts: Counts  # how its config gives its parameter counts (`models.param_count`)
    broken: dict[str, str] = field(default_factory=dict)  # parallel mode -> why transformers' plan fails for it
    order: int = 50


REGISTRY = Registry(
    "family",
    __name__,
    lambda name, names: KeyError(f"unsupported model family {name!r}; supported: {', '.join(names)}"),
)
register = REGISTRY.register
names = REGISTRY.names
families = REGISTRY.all  # every supported family, in a fixed order
family = REGISTRY.get  # the family whose model_type is `name` (KeyError naming the supported ones otherwise)


def by_class() -> dict[str, Family]:
    """HF causal-LM class name -> family."""
    return {f.causal_lm: f for f in families()}


def presets() -> dict[str, dict]:
    """Every tiny preset of every family, by name."""
    return {name: kwargs for f in families() for name, kwargs in f.presets.items()}
