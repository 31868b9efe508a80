"""hf: a checkpoint by HF id (downloaded into the HF cache on a cluster) or local directory (`model.target`); what
is known of it without a download is `model.facts.hf_config`."""

from __future__ import annotations

from collections.abc import Mapping

from ecospec.sources import Source, TinyDirs, dtype_of, register


def config(model: Mapping) -> dict | None:
    return dict(((model.get("facts") or {}).get("hf_config")) or {}) or None


def load(model: Mapping, device, dirs_of: TinyDirs, mode: str):
    from transformers import AutoTokenizer

    from ecospec.models import load_target

    device_map = model.get("device_map") or None
    target = load_target(model["target"], dtype=dtype_of(model.get("dtype")), device_map=device_map, parallel=mode)
    if device_map is None and mode == "device_map":
        target.to(device)
    return target, AutoTokenizer.from_pretrained(model["target"])


def problem(model: Mapping) -> str | None:
    if not model.get("target"):
        return f"model.target={model.get('target')!r}: an HF id or a local checkpoint directory is required"
    return None


SOURCE = register(
    Source(
        name="hf",
        builtin=False,
        real=True,
        config=config,
        load=load,
        checkpoint=lambda model, dirs_of: model["target"],
        problem=problem,
        order=30,
    )
)
