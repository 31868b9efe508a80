"""The tiny build's predictor and GTO stages: their weights are a function of their inputs alone, and their recipes
learn. No bits are pinned here: another processor (or the same one with its kernels held to another instruction
set, `make test-other-isa`) trains other bits from the same recipe. So the test trains each stage twice on this
machine, once through the build and once by calling the stage on the build's inputs after everything else has run,
and compares the two bit for bit; and it holds what each recipe reaches (held-out accuracy, GTO's reward gain)
within tolerances that hold across instruction sets."""

import hashlib
import importlib
import json

import pytest
import torch
from safetensors.torch import load_file

from ecospec.tiny.budgets import get_budget

tiny_build = importlib.import_module("ecospec.tiny.build")


def tensors_sha256(folder) -> str:
    """One hash of every tensor a checkpoint folder saved, independent of the safetensors header's layout."""
    h = hashlib.sha256()
    files = sorted(folder.glob("*.safetensors"))
    assert files, f"no tensors in {folder}"
    for path in files:
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


def rerun(stage_name: str, root, tmp_path) -> tuple[dict, object]:
    """The stage called directly on the build's products, writing into a fresh folder: (metrics, folder)."""
    stage = next(s for s in tiny_build.STAGES if s.name == stage_name)
    out = tmp_path / f"again-{stage_name}"
    out.mkdir()
    names = [s.name for s in tiny_build.STAGES]
    before = names[: names.index(stage_name)]
    ctx = tiny_build.Context(
        budget=get_budget("micro"),
        root=root,
        out=out,
        dirs={n: root / n for n in before},
        metrics={},
        progress=False,
    )
    torch.manual_seed(12345)  # a global RNG state unlike the build's: the stage must not depend on it
    return stage.run(ctx), out


# What the micro recipes reach, measured with one thread on a 2-core AMD EPYC (AVX2) natively and with every kernel
# held to the baseline instruction set (tests/other_isa.py): the two agree far inside these tolerances, which a change
# of the recipe or of the training code would leave.
MICRO = {"predictor": {"accuracy": (0.384, 0.02), "final_loss": (2.066, 0.02)}, "gto": {"loss_last": (0.00483, 0.0003)}}


def test_predictor_and_gto_stages_train_the_same_weights_however_driven(tmp_path, monkeypatch, one_thread):
    monkeypatch.setenv("ECOSPEC_CACHE", str(tmp_path / "cache"))
    summary = tiny_build.build("micro", until="gto", progress=False, threads=1)
    stages = summary["stages"]
    assert stages["predictor"]["status"] == "built" and stages["gto"]["status"] == "built"
    root = tiny_build.paths("micro")["root"]

    predictor, predictor_out = rerun("predictor", root, tmp_path)
    gto, gto_out = rerun("gto", root, tmp_path)
    assert tensors_sha256(predictor_out / "final") == tensors_sha256(root / "predictor" / "final")
    assert tensors_sha256(gto_out / "head") == tensors_sha256(root / "gto" / "head")
    as_saved = lambda metrics: json.loads(json.dumps(metrics))  # noqa: E731  (done.json holds lists, not tuples)
    assert as_saved(predictor) == stages["predictor"]["metrics"] and as_saved(gto) == stages["gto"]["metrics"]

    p = stages["predictor"]["metrics"]
    assert p["accuracy"] >= p["accuracy_untrained"] + 0.05 and p["accuracy"] >= p["chance"] + 0.1, p  # it learns
    for stage, figures in MICRO.items():
        got = stages[stage]["metrics"]
        for key, (value, tolerance) in figures.items():
            assert got[key] == pytest.approx(value, abs=tolerance), (stage, key, got[key])
