"""Every identity rule of the project in one place: which knobs make two cells, jobs, AR baselines, stored targets,
tiny builds or random checkpoints different, and the exceptions kept so that what was made before a knob existed
keeps its name (a user's experiments/ and caches resume after any change).

A back-compatibility exception is a `Rule`: a name, the reason, and what it drops from the identity. A new knob enters
an identity only where it differs from what ran before it existed. Each rule has a test in
tests/test_identity_rules.py; tests/test_identity.py pins the ids themselves.

Light on purpose (the cache's hash and OmegaConf only): config, store, the jobs and the tiny build all import it. A
job kind's own identity blocks are its record's (`experiment.kinds`), from the keys here.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from omegaconf import DictConfig, OmegaConf

from ecospec.cache import digest

# ------------------------------------------------------------------------------------------------------ the keys

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
    "batch_buffer",  # sequence | batch (EcoSpec's expert buffer at B > 1); identity only when it changes something
    "expert_budget",  # MoE-Spec's cap (budgeted methods); with budget_policy, identity only when set
    "budget_policy",
    "max_new_tokens",
    "num_prompts",
    "seed",
    "split",  # heldout (the paper's protocol) or all: which prompts num_prompts counts in
    "trace_steps",  # what the record holds
    "backend",  # hf (our engine) or vllm: identity only when not hf, with the server settings that change what runs
    "engine",  # eager | compiled (our engine's forward): identity only when not eager
)
# what a vLLM server does differently (part of a vLLM cell's identity); its interpreter, URL and rounds are run settings
VLLM_IDENTITY = ("name", "dtype", "tp", "max_model_len", "enforce_eager", "requests", "requests_per_seq")
# What identifies a traces job and a predictor job (besides the model's identity); the rest is execution.
TRACES_KEYS = ("num_prompts", "response_tokens", "part", "parts", "shard_size")
TRAINING_KEYS = ("datasets", "epochs", "steps", "lr", "batch_size", "window", "levels", "seed")
GTO_KEYS = (
    "data",
    "datasets",
    "num_prompts",
    "response_tokens",
    "steps",
    "lr",
    "warmup_steps",
    "batch_size",
    "seq_len",
    "groups",
    "group_size",
    "depth",
    "topk",
    "seed",
)
# the target as the store knows it: traces and predictors of one target serve every cell of it, whatever its dtype,
# device map or drafter
STORE_KEYS = ("source", "target", "preset", "seed", "budget")
# what two AR baselines share besides the target: prompts and decoding settings
AR_KEYS = ("dataset", "temperature", "top_p", "batch_size", "num_prompts", "split", "max_new_tokens", "seed")
AR_NOT_TARGET = ("drafters", "default_drafter", "predictor", "facts")  # model keys an AR never uses
AR_DEFAULTS = {"split": "heldout"}  # a config from before the split knob ran the held-out prompts: its AR is theirs
JOB_BLOCKS = ("model", "dataset", "traces", "training", "gto", "fig1a", "num_prompts")
TINY_CACHE_FORMAT = 1  # bump when the tiny cache's layout or the meaning of a stage's files change


@dataclass(frozen=True)
class Rule:
    """A back-compatibility exception: `drop(identity)` removes (in place) what would otherwise rename what was made
    before the knob existed; `reason` says why that is safe."""

    name: str
    reason: str
    drop: Callable[[dict], None]


# ------------------------------------------------------------------------------------------------- cell identity


def _model_descriptive(out: dict) -> None:
    out["model"] = {k: v for k, v in dict(out["model"]).items() if k not in ("facts", "cpu_threads", "gamma")}


def _unused_drafters(out: dict) -> None:
    used = out["method"].get("drafter")
    used = out["model"].get("default_drafter") if used == "default" else used
    if isinstance(out["model"].get("drafters"), dict):
        out["model"]["drafters"] = {k: v for k, v in out["model"]["drafters"].items() if k == used}


def _one_process(out: dict) -> None:
    if out["model"].get("parallel") in (None, "device_map"):
        out["model"].pop("parallel", None)


def _sequence_buffer(out: dict) -> None:
    if out.get("batch_buffer") in (None, "sequence") or out.get("batch_size") == 1:
        out.pop("batch_buffer")


def _no_budget(out: dict) -> None:
    if out.get("expert_budget") is None:
        out.pop("expert_budget")
        out.pop("budget_policy")


def _eager_engine(out: dict) -> None:
    if out.get("engine") in (None, "eager"):
        out.pop("engine")


def _hf_backend(out: dict) -> None:
    backend = out.pop("backend", None) or {"name": "hf"}
    if backend.get("name", "hf") != "hf":
        out["backend"] = {k: backend.get(k) for k in VLLM_IDENTITY}
        if backend.get("routed_experts"):
            out["backend"]["routed_experts"] = True


CELL_RULES = (
    Rule(
        "model_descriptive",
        "model.facts are descriptive, model.cpu_threads an execution default and model.gamma only the default of the "
        "cell's own gamma (which identifies it): none of them changes what a cell decodes",
        _model_descriptive,
    ),
    Rule(
        "unused_drafters",
        "only the drafter the cell uses identifies it: a drafter added to a model config must not rename its cells",
        _unused_drafters,
    ),
    Rule(
        "one_process",
        "model.parallel=device_map (or unset) is one process, what every cell did before the knob existed",
        _one_process,
    ),
    Rule(
        "sequence_buffer",
        "batch_buffer=sequence, and any buffer at batch size 1, is what every cell did before the knob existed",
        _sequence_buffer,
    ),
    Rule(
        "no_budget",
        "without expert_budget, budget_policy changes nothing: cells of unbudgeted methods keep their ids",
        _no_budget,
    ),
    Rule("eager_engine", "engine=eager is what every cell ran before the knob existed", _eager_engine),
    Rule(
        "hf_backend",
        "an hf cell keeps the id it had before the knob existed; a vLLM cell is named by the server settings that "
        "change what runs, and by routed_experts only when set (the record holds vLLM's routes too)",
        _hf_backend,
    ),
)


def resolved(value: Any) -> Any:
    """A config node (mapping or list) as plain data (resolved); anything else as it is."""
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def cell_config(cfg: DictConfig | Mapping) -> dict:
    """The keys that identify a cell, resolved key by key (resolving the `hydra` node here would recurse into the
    output-dir interpolation that calls this), less what `CELL_RULES` drop."""
    out = {k: resolved(cfg.get(k)) for k in CELL_KEYS}
    for rule in CELL_RULES:
        rule.drop(out)
    return out


def config_id(config: Mapping) -> str:
    """The id of an identity (`cell_config`, `job_config`): the first 12 hex digits of its canonical hash."""
    return digest(config)


def cell_id(cfg: DictConfig | Mapping) -> str:
    return config_id(cell_config(cfg))


# -------------------------------------------------------------------------------------------------- job identity


def store_identity(model: Mapping) -> dict:
    """The target as the store knows it (`STORE_KEYS`)."""
    return {k: model.get(k) for k in STORE_KEYS}


# ------------------------------------------------------------------------------------------------ AR baseline key


def times_hf_peer(ar_peer: str | None, batch_size: int) -> bool:
    """Whether AR is also timed through transformers' `generate` (batch 1; at B > 1 AR stays our batched loop)."""
    return (ar_peer or "hf_generate") == "hf_generate" and batch_size == 1


def _wall_clock(key: dict) -> None:
    if key.get("clock") == "wall":
        key.pop("clock")


def _eager_ar(key: dict) -> None:
    if key.get("engine") == "eager":
        key.pop("engine")


AR_RULES = (
    Rule("wall_clock", "wall-clock baselines keep the keys they had before the clock knob", _wall_clock),
    Rule(
        "eager_ar",
        "eager baselines keep the keys they had before the engine knob (an AR of another engine is another baseline)",
        _eager_ar,
    ),
)


def ar_key(cfg: Mapping, hardware: str, clock: str = "wall") -> dict:
    """What makes two AR baselines interchangeable: target, prompts, decoding settings, hardware (`AR_DEFAULTS` where
    a config predates a knob), less what `AR_RULES` drop."""
    key = {
        "model": {k: v for k, v in cfg["model"].items() if k not in AR_NOT_TARGET},
        **{k: cfg.get(k, AR_DEFAULTS.get(k)) for k in AR_KEYS},
        "hardware": hardware,
        "ar_peer": "hf_generate"
        if times_hf_peer(cfg.get("ar_peer"), cfg["batch_size"])
        else "none",  # which ARs the record chose from
        "clock": clock,
        "engine": cfg.get("engine", "eager"),
    }
    for rule in AR_RULES:
        rule.drop(key)
    return key


# -------------------------------------------------------------------------------- the embedded default's weights


def record_stands(record: Mapping, weights: Mapping | None) -> bool:
    """A kept record stands unless it decoded the embedded default with other weights than `weights` (an earlier
    release, a cache build): then it is not this cell's result."""
    return weights is None or (record.get("env") or {}).get("tiny") == weights


def weights_tag(weights: Mapping) -> str:
    """How a record's embedded-default weights are named: the release identity, else the cache build's version."""
    return weights.get("identity") or weights.get("version") or "unknown"


def aside_name(record: Mapping) -> str:
    """The file a record that no longer stands is renamed to (never overwritten), named by the weights it used."""
    was = (record.get("env") or {}).get("tiny") or {}
    return f"result.{was.get('source', 'old')}-{weights_tag(was)}.json"


class StageLike(Protocol):
    name: str
    revision: str

    def recipe_of(self, budget: Any) -> Any: ...


def stage_recipes(stages: Iterable[StageLike], budget: Any) -> dict[str, dict]:
    return {s.name: {"revision": s.revision, "recipe": s.recipe_of(budget)} for s in stages}


def release_identity(stages: Iterable[StageLike], budget: Any) -> str:
    """Hash of what shapes the tiny build's weights: the cache format, each stage's revision and recipe. Not the
    Python version, the thread count or whether the build's checks were enforced, so that the release is accepted
    on any machine."""
    return digest({"format": TINY_CACHE_FORMAT, "stages": stage_recipes(stages, budget)}, 16)


def python_minor() -> list[int]:
    """This Python's minor version: the tiny corpus is its stdlib, so a cache build is per Python."""
    return list(sys.version_info[:2])


def tiny_version(release_id: str) -> str:
    """A cache build's folder name: the recipe's identity and this Python's minor version."""
    return digest({"identity": release_id, "python": python_minor()})


def stage_keys(stages: Iterable[StageLike], budget: Any) -> dict[str, str]:
    """Per stage of a cache build, the key its done.json must hold: the format, the Python, its revision, its recipe
    and the keys of every stage before it (so that a stage rebuilt rebuilds everything after it)."""
    keys: dict[str, str] = {}
    for stage in stages:
        keys[stage.name] = digest(
            {
                "format": TINY_CACHE_FORMAT,
                "python": python_minor(),
                "stage": stage.name,
                "revision": stage.revision,
                "recipe": stage.recipe_of(budget),
                "upstream": list(keys.values()),
            },
            16,
        )
    return keys


# -------------------------------------------------------------------------------------------- random checkpoints


def random_checkpoint_key(model: Mapping, vocab_size: int) -> dict:
    """What a random tiny preset saved as an HF checkpoint is made from: preset, seed, vocabulary and dtype."""
    return {"preset": model["preset"], "seed": model.get("seed", 0), "vocab": vocab_size, "dtype": model.get("dtype")}
