"""The one component loader: a target, its tokenizer, drafter and expert predictor, from a model config and where
their files are (HF ids or directories, a random tiny preset, or the embedded default's stage folders that `dirs_of`
names). A cell loads through it (`experiment.components` says which folders and checkpoints its config means and
builds the embedded default where missing), and so do the tiny build's stages and every script that loads a build
(`load_build`, with the build's own folders)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ecospec import sources
from ecospec.parallel import mode_of
from ecospec.sources import TinyDirs

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
CALIBRATION = "calibration.json"  # the calibrate stage's file in its folder (`tiny.calibrate` writes it)


@dataclass
class Components:
    target: Any
    tokenizer: Any
    drafter: Any = None  # None: autoregressive
    predictor: Any = None  # ExpertPredictor, "oracle" or None
    predictor_accuracy: float | None = None  # held-out top-k accuracy stored with the checkpoint


def local_path(path: str) -> Path:
    """A local directory, or a hub id fetched into the HF cache (a cluster's normal path)."""
    if Path(path).is_dir():
        return Path(path)
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(path))


def load_target_and_tokenizer(model: Mapping, device: torch.device, dirs_of: TinyDirs):
    """The target (on `device`, spread by the model's device_map, or this rank's shard under tp / ep) and its
    tokenizer, as its source loads them (`ecospec.sources`); `dirs_of`: where a tiny target's stage folders are."""
    return sources.of(model).load(model, device, dirs_of, mode_of(model))


def calibrated_temperature(dirs: Mapping[str, Path]) -> float | tuple[float, ...]:
    """A build's fitted draft temperatures, one per draft depth (1.0 when its calibrate stage has not run)."""
    path = dirs.get("calibrate")
    if path is None or not (path / CALIBRATION).exists():
        return 1.0
    return tuple(float(x) for x in json.loads((path / CALIBRATION).read_text())["temperature"])


def _draft_temperature(kind: str, model: Mapping, dirs_of: TinyDirs) -> float | tuple[float, ...]:
    """The EAGLE-3 head's draft temperature: `drafters.<kind>.temperature`, a number, null (1.0) or `calibrated`
    (the tiny build's fitted one, `tiny.calibrate`)."""
    value = ((model.get("drafters") or {}).get(kind) or {}).get("temperature")
    if value is None:
        return 1.0
    if value == "calibrated":
        return calibrated_temperature(dirs_of(model))
    return tuple(map(float, value)) if isinstance(value, list | tuple) else float(value)


def _drafter(kind: str | None, model: Mapping, target, dirs_of: TinyDirs):
    """The drafter of `kind`, built by its kind's module (`drafters.registry`)."""
    if kind is None:
        return None
    from ecospec.drafters.registry import LoadContext
    from ecospec.drafters.registry import kind as drafter_kind

    spec = dict(model["drafters"][kind] or {})
    temperature = _draft_temperature(kind, model, dirs_of) if drafter_kind(kind).hidden else 1.0
    ctx = LoadContext(kind, dict(model), spec, target, local_path, dirs_of, mode_of(model), temperature)
    return drafter_kind(kind).load(ctx)


def _predictor(where: str | Path, model: Mapping, target) -> tuple[Any, float | None]:
    from ecospec.predictor.model import ExpertPredictor

    if where == "random":  # untrained, for tests: the model's backbone config (a mapping), else a 1-layer Qwen3
        backbone = (model.get("predictor") or {}).get("backbone")
        if not isinstance(backbone, dict):
            backbone = dict(RANDOM_BACKBONE)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(2)
            pred = ExpertPredictor.from_target(target, backbone)
        return pred.to(target.device).eval(), None
    where = where if isinstance(where, Path) else local_path(where)
    pred = ExpertPredictor.load(where, device=target.device)
    info = json.loads((where / "config.json").read_text()).get("info") or {}
    return pred.eval(), info.get("heldout_topk_accuracy")


def load(
    model: Mapping,
    device: torch.device,
    dirs_of: TinyDirs,
    drafter: str | None = None,
    predictor: str | Path | None = None,
    loaded: Components | None = None,
) -> Components:
    """The components of `model` on `device` (or spread by its device_map): its target and tokenizer (those of
    `loaded` when given: another method of the same job shares them), the drafter of kind `drafter` (None:
    autoregressive) and `predictor`: None, "oracle", "random" (untrained), a checkpoint directory (a Path) or a
    directory or hub id (a string)."""
    if loaded is not None:
        target, tokenizer = loaded.target, loaded.tokenizer
    else:
        target, tokenizer = load_target_and_tokenizer(model, device, dirs_of)
    draft = _drafter(drafter, model, target, dirs_of)
    pred, accuracy = (predictor, None) if predictor in (None, "oracle") else _predictor(predictor, model, target)
    return Components(target, tokenizer, draft, pred, accuracy)


def load_build(dirs: Mapping[str, Path], calibrated: bool = True, device: torch.device | None = None):
    """``(target, tokenizer, drafter, predictor)`` of the embedded default from a build's stage folders (a finished
    build, the release, or one whose stages are still running: its evaluate and calibrate stages), as a tiny cell
    loads them: the EAGLE-3 head at the build's fitted draft temperature (1.0 unless `calibrated`, or before the
    build has one), the final expert predictor."""
    model = {
        "name": "tiny",
        "source": "tiny",
        "default_drafter": "eagle3",
        "drafters": {"eagle3": {"path": None, "temperature": "calibrated" if calibrated else None}},
    }
    comp = load(
        model,
        device or torch.device("cpu"),
        lambda model, until=None: dict(dirs),
        drafter="eagle3",
        predictor=Path(dirs["predictor"]) / "final",
    )
    return comp.target, comp.tokenizer, comp.drafter, comp.predictor
