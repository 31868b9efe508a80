"""Where the traces, predictor and GTO jobs put what they make, so that cells find it without a config edit.

    $ECOSPEC_CACHE/store/<model>-<identity hash>/
      traces/<dataset>/part-<i>-of-<n>/     routing traces of the dataset's samples (predictor.traces format)
      predictor/<checkpoint>/               published predictors: final, acc50, acc60 (the model config's names)
      predictor/summary.json                the training summary (held-out accuracy, per layer, checkpoints)
      predictor/work/                       the training run's own checkpoints (resume state)
      gto/head/                             the GTO-trained EAGLE-3 head (EAGLE layout), gto/summary.json, gto/work/

The identity is the target (`identity.STORE_KEYS`: source, HF id or path, preset, seed, tiny budget): traces and
predictors of one target serve every cell of it, whatever its dtype, device map or drafter. Light (validation reads
it): no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from ecospec.cache import cache_root, digest
from ecospec.identity import store_identity

CONFIG_FILE = "config.json"  # a predictor checkpoint directory holds one (predictor.model.CONFIG_FILE)


def model_key(model: Mapping) -> str:
    """`<name>-<hash of the target's identity>`: readable, and distinct for two targets under one name."""
    return f"{model['name']}-{digest(store_identity(model), 8)}"


def model_store(model: Mapping) -> Path:
    return cache_root() / "store" / model_key(model)


def traces_root(model: Mapping, dataset: str) -> Path:
    return model_store(model) / "traces" / dataset


def traces_dir(model: Mapping, dataset: str, part: int = 0, parts: int = 1) -> Path:
    return traces_root(model, dataset) / f"part-{part}-of-{parts}"


def predictor_root(model: Mapping) -> Path:
    return model_store(model) / "predictor"


def stored_predictor(model: Mapping, name: str) -> Path | None:
    """The published predictor checkpoint `name` of this model, or None when the predictor job has not made it."""
    path = predictor_root(model) / name
    return path if (path / CONFIG_FILE).is_file() else None


def gto_root(model: Mapping) -> Path:
    return model_store(model) / "gto"


def stored_gto(model: Mapping) -> Path | None:
    """The GTO head the gto job published for this model, or None."""
    path = gto_root(model) / "head"
    return path if (path / CONFIG_FILE).is_file() else None
