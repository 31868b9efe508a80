"""The tiny build's predictor and GTO stages train the same weights whichever code path drives them: the hashes
below were taken at 43189e7 (before the stages called the Hydra jobs' training code) with one torch thread on
this project's CPU machine; a change that alters what those stages train fails here."""

import hashlib
import importlib

import pytest
import torch
from safetensors.torch import load_file

tiny_build = importlib.import_module("ecospec.tiny.build")

# sha256 of each stage's saved tensors (names, dtypes, shapes and bytes), micro budget, threads=1
PINNED = {
    "predictor/final": "1223f37139234d1742af0f224cbb9bec4af76c6d8766f2bad5705b032d38f4e4",
    "gto/head": "6b946d1e58a35a6bb00e8e9c94a86556b03c08853b7a2e7c761dda245a790f8b",
}


def tensors_sha256(folder) -> str:
    """One hash of every tensor a checkpoint folder saved, independent of the safetensors header's layout."""
    h = hashlib.sha256()
    for path in sorted(folder.glob("*.safetensors")):
        for name, t in sorted(load_file(path).items()):
            h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
            h.update(t.contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


@pytest.fixture
def one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def test_predictor_and_gto_stages_train_the_pinned_weights(tmp_path, monkeypatch, one_thread):
    monkeypatch.setenv("ECOSPEC_CACHE", str(tmp_path))
    summary = tiny_build.build("micro", until="gto", progress=False, threads=1)
    assert summary["stages"]["predictor"]["status"] == "built" and summary["stages"]["gto"]["status"] == "built"
    root = tiny_build.paths("micro")["root"]
    got = {name: tensors_sha256(root / name) for name in PINNED}
    assert all(list((root / name).glob("*.safetensors")) for name in PINNED)
    assert got == PINNED
