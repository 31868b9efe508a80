"""random: a tiny preset of a real architecture (`models.presets`) with random weights and the byte tokenizer, built
in memory (saved once as an HF checkpoint where tensor or expert parallelism loads it through `from_pretrained`)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from ecospec.identity import random_checkpoint_key
from ecospec.sources import Source, TinyDirs, dtype_of, register


def config(model: Mapping) -> dict | None:
    """The preset's config as `tiny_model` builds it: the byte tokenizer's vocabulary, the tiny init."""
    from ecospec.models.byte_tokenizer import VOCAB_SIZE
    from ecospec.models.loading import TINY_INIT_STD
    from ecospec.models.presets import PRESETS

    preset = PRESETS.get(model.get("preset"))
    return {**preset, "initializer_range": TINY_INIT_STD, "vocab_size": VOCAB_SIZE} if preset else None


def random_checkpoint(model: Mapping) -> Path:
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
        target.to(dtype=dtype_of(model.get("dtype"))).save_pretrained(tmp)
        if where.exists():  # another job made it meanwhile
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, where)
            fsync_dir(where.parent)
    if world() > 1:
        import torch.distributed as dist

        dist.barrier()  # the others wait for rank 0's checkpoint
    return where


def load(model: Mapping, device, dirs_of: TinyDirs, mode: str):
    from ecospec.models import load_target, tiny_model
    from ecospec.models.byte_tokenizer import VOCAB_SIZE, byte_tokenizer

    if mode != "device_map":  # eager kernels, as tiny_model builds them
        target = load_target(
            str(random_checkpoint(model)),
            dtype=dtype_of(model.get("dtype")),
            attn_implementation="eager",
            experts_implementation="eager",
            parallel=mode,
        )
        return target, byte_tokenizer()
    target = tiny_model(model["preset"], seed=model.get("seed", 0), vocab_size=VOCAB_SIZE)
    return target.to(device=device, dtype=dtype_of(model.get("dtype"))), byte_tokenizer()


SOURCE = register(Source(name="random", builtin=False, real=False, config=config, load=load, order=20))
