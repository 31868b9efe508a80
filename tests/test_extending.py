"""Adding a method is new files only (docs/extending.md): a temporary copy of the package and its configs gains a
toy method module and its conf/method YAML, nothing else is edited, and a cell runs with it end to end."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TOY_METHOD = '''"""toy: the deepest-first walk (a new method as a new module, nothing else edited)."""

from ecospec.methods import Candidates, MethodSpec, register
from ecospec.methods._greedy import greedy_static


def rule(c: Candidates, budget: int) -> list[int]:
    return greedy_static(c, [float(d) for d in c.depth], budget)


SPEC = register(MethodSpec(name="toy", label="Toy", colour="tab:brown", role="toy", predictor=None,
                           buffered=False, rule=rule, order=90))
'''

TOY_YAML = "name: toy\ndrafter: default\nselector: toy\npredictor: null\n"


def test_a_new_method_is_a_new_module_and_its_yaml(tmp_path):
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "src", copy / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "release"))
    shutil.copytree(ROOT / "src" / "ecospec" / "tiny" / "release", copy / "src" / "ecospec" / "tiny" / "release")
    shutil.copytree(ROOT / "conf", copy / "conf")
    shutil.copy(ROOT / "run.py", copy / "run.py")
    before = {p.relative_to(copy) for p in copy.rglob("*") if p.is_file()}
    (copy / "src" / "ecospec" / "methods" / "toy.py").write_text(TOY_METHOD)
    (copy / "conf" / "method" / "toy.yaml").write_text(TOY_YAML)
    added = {p.relative_to(copy) for p in copy.rglob("*") if p.is_file()} - before
    assert added == {Path("src/ecospec/methods/toy.py"), Path("conf/method/toy.yaml")}
    env = {**os.environ, "PYTHONPATH": str(copy / "src")}
    out = subprocess.run(
        [sys.executable, "run.py", "method=toy", "model=tiny_random", "num_prompts=1", "max_new_tokens=6",
         "threads=1", "progress=false", f"out_dir={tmp_path / 'exp'}"],
        cwd=copy, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    rec = json.loads(next((tmp_path / "exp").rglob("result.json")).read_text())
    assert rec["status"] == "ok" and rec["config"]["method"]["selector"] == "toy"
    assert rec["summary"]["matches_ar"] == 1.0  # greedy and lossless whatever the rule picks
