"""A model's config as the cost model reads it, with no weights and no download where it can: `conf/model/<name>.yaml`
(package data, so a wheel install has them) or a config mapping, its `facts`, and the target's HF config: from
``facts.hf_config``, else what its source knows (`ecospec.sources`: a random preset, the tiny build's recipe), else
``AutoConfig.from_pretrained(target)`` (a real checkpoint)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from functools import cache
from pathlib import Path

from ecospec import conf_dir, sources
from ecospec.models.param_count import counts_complete


def load_model_config(name: str) -> dict:
    """`conf/model/<name>.yaml` as a plain dict (no Hydra): a fresh copy each call, parsed once per file version
    (a report reads each model's several times)."""
    path = conf_dir() / "model" / f"{name}.yaml"
    if not path.exists():
        have = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise FileNotFoundError(f"no model config {path}; have: {', '.join(have) or 'none'}")
    stat = path.stat()
    return copy.deepcopy(_parsed_config(str(path), stat.st_mtime_ns, stat.st_size))


@cache
def _parsed_config(path: str, mtime_ns: int, size: int) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(path), resolve=True)


def facts_of(model: Mapping) -> dict:
    """`facts` of a model config; a config without the key (e.g. an older record's) borrows conf/model's."""
    if "facts" in model:
        return model["facts"] or {}
    path = conf_dir() / "model" / f"{model.get('name')}.yaml"
    return (load_model_config(model["name"]).get("facts") or {}) if path.exists() else {}


def config_mapping(model: Mapping, facts: Mapping) -> dict:
    """The target's HF config as a plain mapping (`PretrainedConfig.to_dict()`'s fields), without transformers
    where it is complete as written: `facts.hf_config` when it names every field the count reads (config.json may
    leave class defaults out), or its source's (`sources.facts`) when complete; `hf_config(...).to_dict()` otherwise."""
    written = facts.get("hf_config") or sources.facts(model)
    if written and counts_complete(written):
        return dict(written)
    return hf_config(model, facts).to_dict()


def hf_config(model: Mapping, facts: Mapping):
    """The target's transformers config from a conf/model mapping and its `facts` (no weights, no download where
    facts or the tiny recipe have it)."""
    from transformers import AutoConfig

    kwargs = dict(facts.get("hf_config") or sources.facts(model) or {})
    if kwargs:
        return AutoConfig.for_model(kwargs.pop("model_type"), **kwargs)
    if sources.real(model) and model.get("target"):
        return AutoConfig.from_pretrained(model["target"])
    raise ValueError(f"model {model.get('name')!r}: no facts.hf_config and no preset, tiny budget or HF target")


def release_dir(model: Mapping) -> Path | None:
    """The release's directory of a model whose weights ship with the package (source tiny), else None."""
    if not sources.builtin(model):
        return None
    from ecospec.tiny.layout import RELEASE_DIR

    return RELEASE_DIR
