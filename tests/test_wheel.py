"""An installed wheel works without the repository: it ships every Hydra config, and a cell composed from the
installed package outside the checkout has the same identity as one composed here."""

import importlib.util
import json
import os
import shutil
import site
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from ecospec import conf_dir
from ecospec.experiment.config import job_id

ROOT = Path(__file__).resolve().parents[1]
CELLS = [("method=ecospec",), ("model=qwen3", "method=eagle3", "dataset=humaneval"), ("experiment=demo",)]

# run by the wheel's venv from a directory outside the repository: where ecospec comes from, and each cell's id
OUTSIDE = """
import json, sys
from hydra import compose, initialize_config_dir
import ecospec
from ecospec.experiment.config import job_id

ids = []
with initialize_config_dir(config_dir=str(ecospec.conf_dir()), version_base="1.3"):
    for overrides in json.loads(sys.argv[1]):
        ids.append(job_id(compose("config", overrides=overrides)))
print(json.dumps({"file": ecospec.__file__, "ids": ids}))
"""


def _wheel(tmp_path: Path) -> Path:
    """A wheel of a copy of the project (so the build leaves nothing in the checkout): offline with this
    environment's setuptools where it has one, else setuptools from the package index."""
    project = tmp_path / "project"
    shutil.copytree(ROOT / "src", project / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, project / name)
    offline = ["--no-build-isolation", "--no-index"] if importlib.util.find_spec("setuptools") else []
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", *offline]
    subprocess.run([*cmd, str(project), "-w", str(tmp_path / "dist")], check=True, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("ecospec-*.whl")
    return wheel


def _venv(tmp_path: Path, wheel: Path) -> Path:
    """A fresh virtualenv with the wheel installed, then shown this environment's site-packages (its dependencies,
    not its editable ecospec: a path line in a .pth file does not read that directory's own .pth files)."""
    env = tmp_path / "venv"
    venv.create(env, with_pip=False)
    python = env / "bin" / "python"
    cmd = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)]
    subprocess.run(cmd, check=True, capture_output=True)
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (Path(purelib) / "outer.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return python


@pytest.mark.slow
def test_a_wheel_composes_cells_outside_the_repository(tmp_path):
    wheel = _wheel(tmp_path)
    shipped = set(zipfile.ZipFile(wheel).namelist())
    yamls = {f"ecospec/{p.relative_to(conf_dir().parent).as_posix()}" for p in conf_dir().rglob("*.yaml")}
    assert len(yamls) > 50 and yamls <= shipped, sorted(yamls - shipped)

    python = _venv(tmp_path, wheel)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [str(python), "-c", OUTSIDE, json.dumps(CELLS)], cwd=outside, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.splitlines()[-1])
    assert Path(got["file"]).is_relative_to(tmp_path / "venv"), got["file"]  # the wheel, not the source tree

    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        here = [job_id(compose("config", overrides=list(c))) for c in CELLS]
    assert got["ids"] == here
