"""A cell's identity, name and validation: everything decided from the composed config before any model loads."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from ecospec.cache import digest
from ecospec.data import DATASETS
from ecospec.selection import POLICIES

SOURCES = ("tiny", "random", "hf")
DRAFTERS = ("eagle3", "mtp", "draft_model")
PREDICTORS = ("learned", "oracle")
# What makes two cells different (and what the AR cache key is cut from); execution knobs such as
# force, device placement, logger or cluster are not part of it.
CELL_KEYS = (
    "model",
    "method",
    "dataset",
    "temperature",
    "top_p",
    "gamma",
    "depth",
    "topk",
    "batch_size",
    "max_new_tokens",
    "num_prompts",
    "seed",
    "trace_steps",  # what the record holds
)


class ConfigError(ValueError):
    """A config value that cannot run; the message names the key, the value and what is allowed."""


def as_dict(cfg: DictConfig | Mapping) -> dict:
    return OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)


def cell_config(cfg: DictConfig | Mapping) -> dict:
    """The keys that identify a cell, resolved (key by key: resolving the `hydra` node here would recurse
    into the output-dir interpolation that calls this)."""
    out = {}
    for k in CELL_KEYS:
        v = cfg.get(k)
        out[k] = OmegaConf.to_container(v, resolve=True) if isinstance(v, DictConfig) else v
    # facts are descriptive and cpu_threads only an execution default: neither identifies a cell
    out["model"] = {k: v for k, v in dict(out["model"]).items() if k not in ("facts", "cpu_threads")}
    return out


def cell_id(cfg: DictConfig | Mapping) -> str:
    return digest(cell_config(cfg))


def _num(x: float) -> str:
    return f"{x:g}"


def cell_name(cfg: DictConfig | Mapping) -> str:
    """Readable and unique directory name of a cell: model-method-dataset-T..-g..-d..-k..-b..-s.. plus the
    first 6 hex digits of cell_id (which also covers every other identity key, e.g. a predictor checkpoint)."""
    c = cell_config(cfg)
    head = "-".join([c["model"]["name"], c["method"]["name"], c["dataset"]["name"]])
    knobs = f"T{_num(c['temperature'])}-g{c['gamma']}-d{c['depth']}-k{c['topk']}-b{c['batch_size']}-s{c['seed']}"
    return f"{head}-{knobs}-{cell_id(cfg)[:6]}"


def _cell_resolver(*, _root_: DictConfig) -> str:
    return cell_name(_root_)


if not OmegaConf.has_resolver("ecospec_cell"):
    OmegaConf.register_new_resolver("ecospec_cell", _cell_resolver)


def _bad(key: str, value: Any, allowed: str) -> ConfigError:
    return ConfigError(f"{key}={value!r}: {allowed}")


def drafter_kind(cfg: DictConfig | Mapping) -> str | None:
    """The drafter a cell uses: the method's, with `default` meaning the model's default drafter."""
    d = as_dict(cfg)
    kind = d["method"].get("drafter")
    return d["model"].get("default_drafter") if kind == "default" else kind


def predictor_path(model: Mapping) -> str | None:
    """The predictor checkpoint of a model config: a name from `predictor.checkpoints`, else a path."""
    pred = model.get("predictor") or {}
    name = pred.get("checkpoint")
    named = pred.get("checkpoints") or {}
    return named.get(name) if name in named else name


def validate(cfg: DictConfig | Mapping) -> None:
    """Raise ConfigError for the first value that cannot run, before anything heavy happens."""
    d = as_dict(cfg)
    for key, low in (("gamma", 2), ("depth", 1), ("topk", 1), ("batch_size", 1), ("max_new_tokens", 1)):
        v = d.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise _bad(key, v, f"must be an integer >= {low}")
    if d["batch_size"] != 1:
        raise _bad("batch_size", d["batch_size"], "the engine decodes one sequence per step (batch_size=1 only)")
    t = d.get("temperature")
    if isinstance(t, bool) or not isinstance(t, int | float) or t < 0:
        raise _bad("temperature", t, "must be a number >= 0 (0 = greedy)")
    p = d.get("top_p")
    if isinstance(p, bool) or not isinstance(p, int | float) or not 0 < p <= 1:
        raise _bad("top_p", p, "must be in (0, 1]")
    n = d.get("num_prompts")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise _bad("num_prompts", n, "must be an integer >= 1, or null for the whole dataset")
    ts = d.get("trace_steps")
    if isinstance(ts, bool) or not isinstance(ts, int) or ts < 0:
        raise _bad("trace_steps", ts, "must be an integer >= 0 (verify passes whose routes the record keeps)")
    if not isinstance(d.get("seed"), int):
        raise _bad("seed", d.get("seed"), "must be an integer")

    model, method, dataset = d["model"], d["method"], d["dataset"]
    if model.get("source") not in SOURCES:
        raise _bad("model.source", model.get("source"), f"allowed: {', '.join(SOURCES)}")
    if model["source"] == "hf" and not model.get("target"):
        raise _bad("model.target", model.get("target"), "an HF id or a local checkpoint directory is required")
    if dataset.get("name") not in DATASETS:
        raise _bad("dataset.name", dataset.get("name"), f"allowed: {', '.join(DATASETS)}")
    if method.get("selector") not in POLICIES:
        raise _bad("method.selector", method.get("selector"), f"allowed: {', '.join(POLICIES)}")

    kind = drafter_kind(d)
    drafters = model.get("drafters") or {}
    if kind is None:
        if method["name"] != "ar":
            raise _bad("method.drafter", None, "only method=ar decodes without a drafter")
    elif kind not in DRAFTERS:
        raise _bad("method.drafter", method.get("drafter"), f"allowed: default, {', '.join(DRAFTERS)}")
    elif kind not in drafters:
        have = ", ".join(drafters) or "nothing"
        raise ConfigError(
            f"method={method['name']} needs a {kind} drafter, but model={model['name']} has none "
            f"(model.drafters has: {have}); pick another method or set model.drafters.{kind}"
        )
    pred = method.get("predictor")
    if pred not in (None, *PREDICTORS):
        raise _bad("method.predictor", pred, f"allowed: null, {', '.join(PREDICTORS)}")
    if method["selector"] in ("ecospec", "global_cost") and pred != "learned":
        raise _bad("method.predictor", pred, f"selector {method['selector']} needs predictor=learned")
    if method["selector"] == "oracle" and pred != "oracle":
        raise _bad("method.predictor", pred, "selector oracle needs predictor=oracle")
    if pred == "learned":
        path = predictor_path(model)
        if not path:
            name = (model.get("predictor") or {}).get("checkpoint")
            raise ConfigError(
                f"model.predictor.checkpoint={name!r}: method={method['name']} needs a trained expert predictor "
                f"for model={model['name']}; set model.predictor.checkpoints.{name or 'final'}=<directory>"
            )
        if model["source"] == "tiny" and path not in ("final", "acc50", "acc60"):
            raise _bad("model.predictor.checkpoint", path, "the tiny build has final, acc50, acc60")
