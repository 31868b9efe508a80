"""The released embedded default: checked in place (identity, every file's sha256), used by everything that needs
the full budget without training, refused with one line when stale or changed; a micro build released round trip."""

import importlib
import json
import shutil
from dataclasses import replace

import pytest

from ecospec.tiny import release
from ecospec.tiny.budgets import BUDGETS, Budget
from ecospec.tiny.corpus import BOS_ID
from ecospec.tiny.layout import MANIFEST, RELEASE_DIR
from ecospec.tiny.stages import ENV_SOURCE

tiny_build = importlib.import_module("ecospec.tiny.build")
identity = tiny_build.recipe_identity
FULL = BUDGETS["full"]
MICRO = BUDGETS["micro"]


def test_committed_release_is_whole_small_and_names_no_machine():
    m = release.verify(identity(FULL))  # identity of the code's recipe, every file's sha256
    assert m["identity"] == identity(FULL) and m["budget"] == "full"
    assert m["bytes"] <= 60e6, f"release is {m['bytes'] / 1e6:.1f} MB (at most 60)"
    files = set(m["files"])
    on_disk = {p.relative_to(RELEASE_DIR).as_posix() for p in RELEASE_DIR.rglob("*") if p.is_file()}
    assert on_disk - files == {MANIFEST}, f"files in the release the manifest does not list: {on_disk - files}"
    for need in (
        "target/model/config.json",
        "target/model/model.safetensors",
        "target/model/tokenizer.json",
        "corpus/tokenizer/tokenizer.json",
        "corpus/train.npy",
        "drafter/head/config.json",
        "predictor/final/config.json",
        "gto/head/config.json",
        "calibrate/calibration.json",
    ):
        assert need in files, need
    assert {"acc50", "acc60", "final"} <= {f.split("/")[1] for f in files if f.startswith("predictor/")}
    by = m["built_by"]
    assert by["processor"] and by["threads"] >= 1 and by["python"].startswith("3.")
    fig = m["figures"]
    assert fig["heldout_loss"] > 0 and fig["confidence.alpha"] > 1 and fig["ecospec.E"] > 0
    for path in [RELEASE_DIR / MANIFEST, *RELEASE_DIR.glob("*/done.json")]:
        text = path.read_text()
        assert "/root" not in text and "/home/" not in text and "loadavg" not in text, path


def test_full_budget_uses_the_release_and_trains_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ECOSPEC_CACHE", str(tmp_path))
    monkeypatch.delenv(ENV_SOURCE, raising=False)

    def boom(*args, **kwargs):
        raise AssertionError("trained although the release is in use")

    monkeypatch.setattr(importlib.import_module("ecospec.tiny.target"), "train_target", boom)
    assert tiny_build.source("full") == "release"
    assert tiny_build.paths("full")["target_model"] == RELEASE_DIR / "target" / "model"
    summary = tiny_build.build("full", progress=False)
    assert summary["source"] == "release" and {s["status"] for s in summary["stages"].values()} == {"released"}
    assert tiny_build.build("full", until="gto", progress=False)["source"] == "release"
    st = tiny_build.status("full")
    assert st["source"] == "release" and {s["status"] for s in st["stages"].values()} == {"done"}
    model = tiny_build.load_tiny_target(progress=False)
    assert model.config.num_hidden_layers == FULL.target.num_layers
    assert tiny_build.load_tiny_tokenizer(progress=False).bos_token_id == BOS_ID
    assert not list(tmp_path.glob("tiny-*")), "nothing goes into the cache"
    from ecospec.tiny.build import tiny_weights

    assert tiny_weights({"budget": "full"}) == {"source": "release", "identity": identity(FULL)}
    from ecospec.tiny.__main__ import main

    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "the release is in use" in out and "every sha256 checked" in out
    assert main(["build"]) == 0 and "nothing to build" in capsys.readouterr().out


def test_source_choice():
    assert tiny_build.source("micro") == "cache" and tiny_build.source("full", "cache") == "cache"
    other = replace(FULL, target=replace(FULL.target, steps=1))
    assert tiny_build.source(other) == "cache"  # another recipe: the cache
    with pytest.raises(ValueError, match="ECOSPEC_TINY='weights'"):
        tiny_build.source("full", "weights")
    # the identity ignores what does not shape the weights, and moves with what does
    assert identity(FULL) == identity(Budget("full"))
    assert identity(other) != identity(FULL)


@pytest.fixture(scope="module")
def micro_build(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("ECOSPEC_CACHE", str(cache))
    tiny_build.build("micro", until="gto", progress=False, threads=1)
    tiny_build.build("micro", progress=False, threads=1)
    yield tiny_build.root_dir("micro")
    mp.undo()


def test_micro_release_round_trip_and_refusals(micro_build, tmp_path):
    dest = tmp_path / "release"
    m = release.make_release(micro_build, MICRO, tiny_build.STAGES, dest=dest)
    assert release.verify(identity(MICRO), dest)["identity"] == m["identity"]
    assert "traces" not in {f.split("/")[0] for f in m["files"]}  # training data for the predictor: not shipped
    assert "corpus/corpus.json" not in m["files"]  # its file list names this machine's stdlib path
    done = json.loads((dest / "corpus" / "done.json").read_text())
    assert "/" not in done["metrics"]["stdlib"] and "loadavg_1min_at_start" not in done
    assert (
        m["figures"]["heldout_loss"]
        == json.loads((micro_build / "target/done.json").read_text())["metrics"]["heldout_loss"]
    )
    from ecospec.components import load_build

    dirs = {name: dest / name for name in release.KEEP}
    target, tokenizer, drafter, predictor = load_build(dirs)
    assert target.config.num_experts == MICRO.target.num_experts and predictor is not None

    # another recipe: one line that names the make target
    with pytest.raises(release.ReleaseError, match="make release-tiny") as err:
        release.verify(identity(replace(MICRO, target=replace(MICRO.target, steps=31))), dest)
    assert "\n" not in str(err.value)
    # a changed file is refused by name, and nothing is rewritten
    changed = tmp_path / "changed"
    shutil.copytree(dest, changed)
    weights = changed / "target" / "model" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    with pytest.raises(release.ReleaseError, match="target/model/model.safetensors does not match"):
        release.verify(identity(MICRO), changed)
    assert weights.read_bytes() == bytes(data)
    (changed / "gto" / "head" / "config.json").unlink()
    (changed / "target" / "model" / "model.safetensors").write_bytes(weights.read_bytes())
    with pytest.raises(release.ReleaseError):
        release.verify(identity(MICRO), changed)
    # a build of another recipe is not released
    with pytest.raises(release.ReleaseError, match="another target recipe"):
        release.make_release(
            micro_build, replace(MICRO, target=replace(MICRO.target, steps=31)), tiny_build.STAGES, dest=tmp_path / "x"
        )
    assert not (tmp_path / "x").exists()


@pytest.mark.slow  # ~35 s: the release's routing traced once
def test_traces_are_built_on_top_of_the_release_on_first_use(tmp_path, monkeypatch):
    """The release ships no routing traces; the routing report's corpus source traces them from the release once,
    into the cache (by release identity), and reads them from there afterwards."""
    from ecospec.report.routing_data import corpus_routes

    monkeypatch.setenv("ECOSPEC_CACHE", str(tmp_path))
    monkeypatch.delenv(ENV_SOURCE, raising=False)
    folder = tiny_build.paths("full")["traces"]
    assert folder == tmp_path / f"tiny-release-{identity(FULL)}" / "traces" and not folder.exists()
    routes, n_experts = corpus_routes({"name": "tiny", "source": "tiny", "budget": "full"})
    assert len(routes) == FULL.traces.samples and n_experts == FULL.target.num_experts
    assert routes[0].shape == (FULL.traces.length, FULL.target.num_layers, FULL.target.top_k)
    done = (folder / "done.json").stat().st_mtime_ns
    assert len(corpus_routes({"name": "tiny", "source": "tiny", "budget": "full"})[0]) == FULL.traces.samples
    assert (folder / "done.json").stat().st_mtime_ns == done  # traced once
    release._verified.cache_clear()
    release.verify(identity(FULL))  # the release itself untouched: every sha256 still matches
