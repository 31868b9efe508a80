"""docs/troubleshooting.md quotes the messages a user sees: each must still come out of the code as the page writes
it. Every quoted line names a literal part of its message that must occur in the source (ours, or the library that
raises it), so a reworded message fails here; and most are triggered for real (validation, the loaders, the record
reader, the toolchain check), compared with the page up to the parts that depend on the machine (paths, URLs,
numbers)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import hydra
import pytest
import transformers
from hydra import compose, initialize_config_dir
from hydra.errors import MissingConfigException

from ecospec import conf_dir
from ecospec.analysis.profiles import ProfileMissing, load_profile
from ecospec.analysis.sizing import memory_problem
from ecospec.experiment.cell import run_cell
from ecospec.experiment.config import ConfigError, as_dict, validate_job
from ecospec.experiment.records import read_record

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "troubleshooting.md"
OURS = ROOT / "src" / "ecospec"
LIBS = {"hydra": Path(hydra.__file__).parent, "transformers": Path(transformers.__file__).parent}

# A literal part of each quoted message and where its text lives: (fragment, source root or library, file glob)
SOURCES = [
    ("must be an integer >= ", OURS, "experiment/config.py"),
    ("must be a number >= 0 (0 = greedy)", OURS, "experiment/config.py"),
    ("Could not find '", "hydra", "_internal/defaults_list.py"),
    ("Available options in '", "hydra", "_internal/defaults_list.py"),
    ("is unreachable and it is not in the local cache ", OURS, "data/loading.py"),
    ("offline mode is on (HF_HUB_OFFLINE) and it is not in the local cache ", OURS, "data/loading.py"),
    (
        "To pre-fetch, run `make data` on a machine with network (it fills ~/.cache/huggingface/datasets)",
        OURS,
        "data/loading.py",
    ),
    ("We couldn't connect to", "transformers", "utils/hub.py"),
    ("engine=compiled needs a C++ compiler for torch inductor, none works here (", OURS, "engine/compiled.py"),
    (
        "engine=compiled needs ninja to build its CPU kernels, none found here; pip install ninja",
        OURS,
        "engine/compiled.py",
    ),
    ("no verify-cost profile for model=", OURS, "analysis/profiles.py"),
    ("unreadable result file ", OURS, "experiment/records.py"),
    ("GB for its weights", OURS, "analysis/sizing.py"),
    ("needs a trained expert predictor for ", OURS, "experiment/config.py"),
    ("vllm serve: too little free host memory for its KV cache (the log: ", OURS, "vllm_backend/server.py"),
    ("); free memory or set backend.cpu_kv_cache_mib lower", OURS, "vllm_backend/server.py"),
]


def quoted() -> list[str]:
    """The message lines of the page's ~~~text blocks (a Hydra option list's indented lines left out). Messages are
    fenced with tildes, backticks fence what a reader runs: the docs tests read every backtick block as commands."""
    blocks = re.findall(r"~~~text\n(.*?)~~~", PAGE.read_text(), flags=re.S)
    return [line for block in blocks for line in block.splitlines() if line.strip() and not line.startswith("\t")]


def shape(text: str) -> str:
    """A message less what depends on the machine: URLs, paths and numbers become placeholders."""
    text = re.sub(r"https?://[^\s)]+", "<url>", text)
    text = re.sub(r"(?<![\w/])/[^\s;)',]+", "<path>", text)
    text = re.sub(r"\d+(?:[.,]\d+)*", "<n>", text)
    return " ".join(text.split())


def assert_on_page(message: str) -> None:
    want = shape(message)
    assert any(want in shape(line) for line in quoted()), f"not quoted in {PAGE.name} as the code says it: {message}"


def test_every_quoted_message_names_its_source_and_the_source_still_says_it():
    lines = quoted()
    assert len(lines) >= 12  # the cases of the page
    for line in lines:
        assert any(fragment in line for fragment, _, _ in SOURCES), f"a quoted message with no source to check: {line}"
    for fragment, root, pattern in SOURCES:
        root = LIBS.get(root, root)
        assert any(fragment in p.read_text() for p in root.glob(pattern)), f"{fragment!r} is no longer in {pattern}"
        assert any(fragment in line for line in lines), f"{fragment!r} is quoted nowhere on the page"


def _compose(*overrides: str):
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        return compose("config", overrides=list(overrides), return_hydra_config=True)


def test_bad_values_and_the_failed_record(tmp_path):
    for override in ("gamma=1", "temperature=-1"):
        with pytest.raises(ConfigError) as err:
            validate_job(_compose(override))
        assert_on_page(str(err.value))
    record = run_cell(_compose("gamma=1"), tmp_path / "cell")  # fails at validation: nothing loads
    assert record["status"] == "failed" and record["error"] == "ConfigError: gamma=1: must be an integer >= 2"
    page = json.loads(re.search(r"```json\n(.*?)```", PAGE.read_text(), flags=re.S).group(1))
    written = json.loads((tmp_path / "cell" / "result.json").read_text())
    assert set(page) == set(written) and page["error"] == written["error"] and page["status"] == "failed"


def test_an_unknown_option_names_the_group():
    with pytest.raises(MissingConfigException) as err:
        _compose("method=nope")
    assert_on_page(str(err.value).splitlines()[0])


def test_a_real_target_too_large_and_a_missing_predictor(tmp_path, monkeypatch):
    monkeypatch.setenv("ECOSPEC_CACHE", str(tmp_path))  # an empty store: no predictor published
    cfg = _compose("model=qwen3", "method=ecospec")
    with pytest.raises(ConfigError) as err:
        validate_job(cfg)
    assert_on_page(str(err.value))
    assert_on_page(memory_problem(as_dict(cfg)["model"], "device_map", 1, "cpu", 25.3e9, "this machine's RAM"))


def test_a_missing_profile(tmp_path, monkeypatch):
    monkeypatch.setenv("ECOSPEC_CACHE", str(tmp_path))
    with pytest.raises(ProfileMissing) as err:
        load_profile("tiny", "eager", "float32", "AMD EPYC (1 threads)")
    assert_on_page(str(err.value))


def test_a_corrupt_record(tmp_path):
    path = tmp_path / "result.json"
    path.write_text('{\n "schema": 1,\n "kind": "cell",\n "status": ')  # cut short after a key
    with pytest.warns(UserWarning) as caught:
        assert read_record(path) is None
    assert_on_page(str(caught[0].message))


OFFLINE = """
import json
import os
from ecospec.data import DatasetUnavailableError, load_prompts
from ecospec.engine.compiled import toolchain_missing
out = []
for name, offline in (("aime25", False), ("amc", True)):
    if offline:
        os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        load_prompts(name)
    except DatasetUnavailableError as e:
        out.append(str(e))
out.append(toolchain_missing())
print(json.dumps(out))
"""
CHECKPOINT = """
import json
from transformers import AutoConfig
try:
    AutoConfig.from_pretrained("Qwen/Qwen3-30B-A3B")
except OSError as e:
    print(json.dumps([str(e).splitlines()[0]]))
"""


def _run(script: str, env: dict) -> list[str]:
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_no_network_and_no_compiler(tmp_path):
    """In fresh processes (the HF libraries and inductor read these settings at import): a Hub that refuses
    connections, then offline mode, an empty datasets cache, no vendored copies, a compiler that is not there."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
    }
    env |= {
        "HF_ENDPOINT": "http://127.0.0.1:9",
        "HF_HOME": str(tmp_path / "hf"),
        "HF_DATASETS_CACHE": str(tmp_path / "hf" / "datasets"),
        "ECOSPEC_CACHE": str(tmp_path / "ecospec"),
        "CXX": str(tmp_path / "no-such-compiler" / "g++"),
        "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    unreachable, offline, compiler = _run(OFFLINE, env)
    for message in (unreachable, offline, compiler):
        assert_on_page(message)
    (checkpoint,) = _run(CHECKPOINT, env | {"HF_HUB_OFFLINE": "1"})
    assert_on_page(checkpoint)
