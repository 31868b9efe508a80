"""Every compiled artefact under `$ECOSPEC_CACHE` (issue 53): inductor's graphs, its C++ wrappers and its
precompiled headers, even where `torch._inductor` was imported first (torch then writes its default directory into
TORCHINDUCTOR_CACHE_DIR); a second process sharing the cache compiles nothing, one at another instruction set
reads nothing. The wrapper is built apart from the
kernels and checks no input's sizes on each call (`graphs.compile_method`)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = """
import json, sys
import torch._inductor  # first: torch sets its default cache directory now
import torch
from torch._dynamo.utils import counters
from ecospec.engine.graphs import compile_method

class Twice:
    def step(self, x):
        return x * 2 + 1

out = compile_method(Twice(), Twice.step)(torch.ones(3))
print(json.dumps({"out": out.tolist(), "hits": counters["inductor"]["fxgraph_cache_hit"],
                  "misses": counters["inductor"]["fxgraph_cache_miss"]}))
"""


def _files(root) -> list[str]:
    return [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs]


@pytest.mark.compiled
def test_compiled_artefacts_stay_under_the_cache(tmp_path):
    cache, tmp = tmp_path / "cache", tmp_path / "tmp"
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    env.update(ECOSPEC_CACHE=str(cache), TMPDIR=str(tmp))
    runs = []
    import torch

    from ecospec.engine.graphs import inductor_key

    here = torch.backends.cpu.get_cpu_capability().lower()  # this process's (ATEN_CPU_CAPABILITY may have set it)
    other = "default" if here == "avx2" else "avx2"  # another instruction set this processor runs
    for isa in (None, None, other):  # twice as the machine runs, then at the other instruction set
        run_env = env if isa is None else dict(env, ATEN_CPU_CAPABILITY=isa)
        done = subprocess.run([sys.executable, "-c", PROBE], env=run_env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert runs[0]["out"] == runs[1]["out"] == runs[2]["out"] == [3.0, 3.0, 3.0]
    assert runs[0]["misses"] == 1 and runs[1] == dict(runs[1], hits=1, misses=0)  # the second compiles nothing
    # another instruction set reads none of the first's graphs: a directory of its own (`graphs.inductor_key`)
    assert runs[2] == dict(runs[2], hits=0, misses=1)
    keyed = sorted(p.name for p in (cache / "inductor").iterdir())
    assert keyed == sorted([inductor_key(), inductor_key().rsplit("-", 1)[0] + "-" + other]), keyed
    inductor = cache / "inductor" / inductor_key()
    assert any(p.endswith(".so") for p in _files(inductor))  # the C++ wrapper's build
    assert any(p.endswith(".optimized.o") for p in _files(inductor))  # its kernels built apart (at -O3)
    wrappers = [p for p in _files(inductor) if p.endswith(".main.cpp")]
    # no per-call size checks
    assert wrappers and not any("assert_size_stride(" in Path(p).read_text() for p in wrappers)
    assert _files(inductor / "precompiled_headers")
    assert _files(tmp) == []  # torch's default directory (under TMPDIR) exists, and holds nothing
