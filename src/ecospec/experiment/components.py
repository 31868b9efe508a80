"""Load what a cell runs: the target, its tokenizer, the drafter and the predictor, from the model and method
configs (embedded tiny build, random tiny preset, or real checkpoints by HF id / local path)."""

from __future__ import annotations

import importlib
import json
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ecospec.experiment.config import TINY_CHECKPOINTS, ConfigError, drafter_kind, predictor_path
from ecospec.experiment.engines import CellEngine
from ecospec.identity import random_checkpoint_key

RANDOM_BACKBONE = {
    "model_type": "qwen3",
    "vocab_size": 8,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "max_position_embeddings": 4096,
}


@dataclass
class Components:
    target: Any
    tokenizer: Any
    drafter: Any = None  # None: autoregressive
    predictor: Any = None  # ExpertPredictor, "oracle" or None
    predictor_accuracy: float | None = None  # held-out top-k accuracy stored with the checkpoint
    engine: CellEngine = field(default_factory=CellEngine)  # eager | compiled (shared by a job's methods)
    profile: Any = None  # the verify-cost profile of a method that prices passes in seconds (VerifyProfile)
    profile_ref: dict | None = None  # {"key", "hash"} of that profile: what the record names


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def local_path(path: str) -> Path:
    """A local directory, or a hub id fetched into the HF cache (a cluster's normal path)."""
    if Path(path).is_dir():
        return Path(path)
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(path))


def _dtype(name: str | None) -> torch.dtype | str:
    return "auto" if name in (None, "auto") else getattr(torch, name)


def tiny_dirs(model: dict, until: str | None = None) -> dict[str, Path]:
    """The embedded default's directories: the release (checked, nothing trains) or, for another budget or
    ECOSPEC_TINY=cache, a cache build made first where missing; `until`: an optional stage too (e.g. "gto")."""
    tiny = importlib.import_module("ecospec.tiny.build")
    budget = model.get("budget", "full")
    stages = tiny.status(budget)["stages"].values()
    if any(st["status"] != "done" for st in stages):
        tiny.build(budget)  # a cache build, the first time (the full budget: about 19 minutes on 2 cores)
    if until is not None:
        tiny.build(budget, until=until)  # a no-op once built (and for the release)
    return tiny.paths(budget)


_tiny_dirs = tiny_dirs  # the name experiment/vllm_cell.py imports (to move to `tiny_dirs` there)

# where a tiny cell's stage folders come from: `tiny_dirs`, or a build's own folders while it runs (`load_build`)
TinyDirs = Callable[..., dict[str, Path]]


def tiny_weights(model: dict) -> dict:
    """Which embedded default a tiny cell uses: ``{"source": "release", "identity": ...}`` or the cache build's
    version and folder."""
    tiny = importlib.import_module("ecospec.tiny.build")
    budget = model.get("budget", "full")
    if tiny.source(budget) == "release":
        return {"source": "release", "identity": tiny.recipe_identity(budget)}
    return {"source": "cache", "version": tiny.version(budget), "root": str(tiny.root_dir(budget))}


def parallel_mode(model: dict) -> str:
    return model.get("parallel") or "device_map"


def random_checkpoint(model: dict) -> Path:
    """A random tiny preset saved as an HF checkpoint (made once, by rank 0), so that a tensor-parallel run loads
    it through `from_pretrained` like a real checkpoint."""
    from ecospec.atomic import fsync_dir
    from ecospec.cache import cache_root, digest
    from ecospec.models import tiny_model
    from ecospec.models.byte_tokenizer import VOCAB_SIZE
    from ecospec.parallel import is_main, world

    where = cache_root() / "random" / f"{model['preset']}-{digest(random_checkpoint_key(model, VOCAB_SIZE))}"
    if is_main() and not (where / "config.json").exists():
        target = tiny_model(model["preset"], seed=model.get("seed", 0), vocab_size=VOCAB_SIZE)
        tmp = where.with_name(where.name + f".tmp-{os.getpid()}")
        target.to(dtype=_dtype(model.get("dtype"))).save_pretrained(tmp)
        if where.exists():  # another job made it meanwhile
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, where)
            fsync_dir(where.parent)
    if world() > 1:
        import torch.distributed as dist

        dist.barrier()  # the others wait for rank 0's checkpoint
    return where


def load_target_and_tokenizer(model: dict, device: torch.device, dirs_of: TinyDirs = tiny_dirs):
    """The target (on `device`, spread by the model's device_map, or this rank's shard under tp / ep) and its
    tokenizer; `dirs_of`: where a tiny target's stage folders are."""
    mode = parallel_mode(model)
    if model["source"] == "random":
        from ecospec.models import load_target, tiny_model
        from ecospec.models.byte_tokenizer import VOCAB_SIZE, byte_tokenizer

        if mode != "device_map":  # eager kernels, as tiny_model builds them
            where = random_checkpoint(model)
            target = load_target(
                str(where),
                dtype=_dtype(model.get("dtype")),
                attn_implementation="eager",
                experts_implementation="eager",
                parallel=mode,
            )
            return target, byte_tokenizer()
        target = tiny_model(model["preset"], seed=model.get("seed", 0), vocab_size=VOCAB_SIZE)
        return target.to(device=device, dtype=_dtype(model.get("dtype"))), byte_tokenizer()
    if model["source"] == "tiny":
        from transformers import AutoTokenizer

        from ecospec.models import load_target
        from ecospec.tiny.target import load_trained

        dirs = dirs_of(model)
        tokenizer = AutoTokenizer.from_pretrained(dirs["corpus"] / "tokenizer")
        if mode != "device_map":
            target = load_target(
                str(dirs["target"] / "model"),
                dtype=_dtype(model.get("dtype")),
                attn_implementation="sdpa",
                experts_implementation="eager",
                parallel=mode,
            )
            return target, tokenizer
        target = load_trained(dirs["target"] / "model", dtype=_dtype(model.get("dtype")))
        return target.to(device), tokenizer
    from transformers import AutoTokenizer

    from ecospec.models import load_target

    device_map = model.get("device_map") or None
    target = load_target(model["target"], dtype=_dtype(model.get("dtype")), device_map=device_map, parallel=mode)
    if device_map is None and mode == "device_map":
        target.to(device)
    return target, AutoTokenizer.from_pretrained(model["target"])


def _draft_temperature(kind: str, model: dict, dirs_of: TinyDirs) -> float | tuple[float, ...]:
    """The EAGLE-3 head's draft temperature: `drafters.<kind>.temperature`, a number, null (1.0) or `calibrated`
    (the tiny build's fitted one, `tiny.calibrate`)."""
    value = ((model.get("drafters") or {}).get(kind) or {}).get("temperature")
    if value is None:
        return 1.0
    if value == "calibrated":
        from ecospec.tiny.calibrate import calibrated_temperature

        return calibrated_temperature(dirs_of(model))
    return tuple(map(float, value)) if isinstance(value, list | tuple) else float(value)


def _drafter(kind: str | None, model: dict, target, dirs_of: TinyDirs):
    """The cell's drafter, built by its kind's module (`drafters.registry`)."""
    if kind is None:
        return None
    from ecospec.drafters.registry import LoadContext
    from ecospec.drafters.registry import kind as drafter_kind

    spec = dict(model["drafters"][kind] or {})
    temperature = _draft_temperature(kind, model, dirs_of) if drafter_kind(kind).hidden else 1.0
    ctx = LoadContext(kind, model, spec, target, local_path, dirs_of, parallel_mode(model), temperature)
    return drafter_kind(kind).load(ctx)


def _predictor(model: dict, target, dirs_of: TinyDirs) -> tuple[Any, float | None]:
    from ecospec.predictor.model import ExpertPredictor

    name = predictor_path(model)
    if name == "random":  # untrained, for tests: the model's backbone config (a mapping), else a 1-layer Qwen3
        backbone = (model.get("predictor") or {}).get("backbone")
        if not isinstance(backbone, dict):
            backbone = dict(RANDOM_BACKBONE)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(2)
            pred = ExpertPredictor.from_target(target, backbone)
        return pred.to(target.device).eval(), None
    if model["source"] == "tiny" and name in TINY_CHECKPOINTS:
        where = dirs_of(model)["predictor"] / name
        if not where.is_dir():
            raise ConfigError(f"model.predictor.checkpoint={name!r}: the tiny build saved no such checkpoint ({where})")
    else:
        where = local_path(name)
    pred = ExpertPredictor.load(where, device=target.device)
    info = json.loads((where / "config.json").read_text()).get("info") or {}
    return pred.eval(), info.get("heldout_topk_accuracy")


def load_components(
    cfg: dict, device: torch.device, loaded: Components | None = None, dirs_of: TinyDirs = tiny_dirs
) -> Components:
    """Everything a cell needs, on `device` (or spread by the model's device_map); `loaded`: components whose
    target and tokenizer to share (another method of the same job: `experiment.interleave`); `dirs_of`: where the
    embedded default's stage folders are (`tiny_dirs`: the release or a cache build)."""
    model, method = cfg["model"], cfg["method"]
    if loaded is not None:
        target, tokenizer = loaded.target, loaded.tokenizer
    else:
        target, tokenizer = load_target_and_tokenizer(model, device, dirs_of)
    drafter = _drafter(drafter_kind(cfg), model, target, dirs_of)
    predictor, accuracy = None, None
    if method.get("predictor") == "learned":
        predictor, accuracy = _predictor(model, target, dirs_of)
    elif method.get("predictor") == "oracle":
        predictor = "oracle"
    engine = loaded.engine if loaded is not None else CellEngine(cfg.get("engine") or "eager")
    profile, ref = _profile(cfg, target, device)
    return Components(target, tokenizer, drafter, predictor, accuracy, engine, profile, ref)


def load_build(dirs: Mapping[str, Path], calibrated: bool = True, device: torch.device | None = None):
    """``(target, tokenizer, drafter, predictor)`` of the embedded default from a build's stage folders (a finished
    build, the release, or one whose stages are still running: its evaluate and calibrate stages), through
    `load_components` as a tiny cell loads them: the EAGLE-3 head at the build's fitted draft temperature (1.0
    unless `calibrated`, or before the build has one), the final expert predictor."""
    cfg = {
        "model": {
            "name": "tiny",
            "source": "tiny",
            "default_drafter": "eagle3",
            "drafters": {"eagle3": {"path": None, "temperature": "calibrated" if calibrated else None}},
            "predictor": {"checkpoint": "final"},
        },
        "method": {"name": "tiny_build", "selector": "confidence", "drafter": "eagle3", "predictor": "learned"},
    }
    comp = load_components(cfg, device or torch.device("cpu"), dirs_of=lambda model, until=None: dict(dirs))
    return comp.target, comp.tokenizer, comp.drafter, comp.predictor


def _profile(cfg: dict, target, device: torch.device):
    """(profile, {"key", "hash"}) of this model, engine and machine when the cell's method prices passes in seconds
    (else (None, None)); none measured stops the cell naming the command that makes it."""
    from ecospec.bench.profile import load_profile
    from ecospec.experiment.records import hardware
    from ecospec.methods import method

    if not method(cfg["method"].get("selector") or "confidence").cost_model or cfg["method"]["name"] == "ar":
        return None, None
    dtype = str(target.dtype).removeprefix("torch.")
    profile, digest = load_profile(cfg["model"]["name"], cfg.get("engine") or "eager", dtype, hardware(device))
    return profile, {"key": profile.key, "hash": digest}
