"""The 80/20 split of every benchmark by sample (paper App. B.1): the expert predictor trains on 80 % of each
dataset's samples and every evaluation runs on the held-out 20 %.

A pure, seeded function of each sample's id, so it exists whether or not traces were ever collected, any subset
of a dataset (its first N prompts, one part of it, a local copy) splits the way the whole does, and two machines
agree on it: a sample is held out iff sha256("<seed>/<id>"), read as a fraction of 2^64, is below 0.2 (a
Bernoulli(0.2) draw per sample, so a dataset's held-out share is 20 % up to sampling noise: e.g. 28 of
HumanEval's 164). Stdlib only (the traces job, the predictor job and the cells use it).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

SPLITS = ("heldout", "all")  # the cells' `split` knob: the held-out 20 % (the paper's protocol) or every sample
TEST_FRACTION = 0.2
SPLIT_SEED = 0


def is_heldout(sample_id: str, fraction: float = TEST_FRACTION, seed: int = SPLIT_SEED) -> bool:
    draw = int.from_bytes(hashlib.sha256(f"{seed}/{sample_id}".encode()).digest()[:8], "big") / 2**64
    return draw < fraction


def heldout_ids(ids: Iterable[str], fraction: float = TEST_FRACTION, seed: int = SPLIT_SEED) -> frozenset[str]:
    """The held-out ones among `ids`."""
    return frozenset(i for i in ids if is_heldout(i, fraction, seed))


def select_split(ids: Sequence[str], split: str) -> list[int]:
    """Positions (in order) of the samples of `ids` that belong to `split` ("heldout" or "all")."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of: {', '.join(SPLITS)}")
    return [i for i, sid in enumerate(ids) if split == "all" or is_heldout(sid)]
