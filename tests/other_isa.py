"""Run pytest with the CPU kernels held to another instruction set than this processor's best, so that a test
pinning bits that a processor decides (trained weights, float sums) fails here, on the machine that pins them,
instead of on the next user's.

Three libraries pick their kernels at run time: torch's own (ATen: ``ATEN_CPU_CAPABILITY``), its BLAS (MKL:
``MKL_ENABLE_INSTRUCTIONS``, which Intel processors honour, and ``MKL_CBWR``, which fixes MKL's code path on any
processor) and oneDNN (``ONEDNN_MAX_CPU_ISA``). Each is held one step below what this processor runs (``default``
below AVX2). Before the tests, a probe in a fresh process reads torch's capability back and checks that a matrix
product and a softmax give other bits than they do unswitched: switches that took no effect are an error, not a
silent pass (one kernel of the two unchanged is a warning: some processors have one path only).

    python tests/other_isa.py                      # make test-other-isa: the tests in FLOATS
    python tests/other_isa.py [options] [paths]    # other paths, e.g. tests/ for the whole default suite

The default selection (``FLOATS``) is every test file that trains weights, or holds a decode or a forward's floats
against a pinned value or against another code path: where a processor's kernels can decide a result. The whole
suite held this way takes longer than `make test` itself, more than CI's time leaves on a slow machine, so CI runs
``FLOATS`` (CONTRIBUTING.md, Tests). A new test of that kind goes into ``FLOATS``.
"""

from __future__ import annotations

import os
import subprocess
import sys

# FLOATS with the compiled engine's C++ kernels against transformers, which the default suite leaves to
# make test-compiled (their first test builds them), and the compiled engine against the eager one: inductor builds
# its graphs for the instruction set ATen runs at (`engine.graphs.inductor_key`)
FLOATS_MARKERS = "not slow and not slurm and not vllm"
# held at `default` (an AVX2 processor's step below), inductor (torch 2.13) emits at::vec code its headers lack
NO_INDUCTOR = "DEFAULT"
FLOATS = [
    "tests/test_tiny_stage_weights.py",
    "tests/test_tiny.py",
    "tests/test_predictor.py",
    "tests/test_eagle3_train.py",
    "tests/test_gto.py",
    "tests/test_engine.py",
    "tests/test_eagle3.py",
    "tests/test_mtp.py",
    "tests/test_static_qwen3.py",
    "tests/test_acceptance_regression.py",
    "tests/test_calibration.py",
]

PROBE = """
import hashlib, torch
torch.manual_seed(0); torch.set_num_threads(1)
a, b, x = torch.randn(257, 513), torch.randn(513, 129), torch.randn(1000, 512)
digest = lambda t: hashlib.sha256(t.numpy().tobytes()).hexdigest()[:12]
print(torch.backends.cpu.get_cpu_capability(), digest(a @ b), digest(torch.softmax(x, -1)))
"""


def switches(capability: str) -> dict[str, str]:
    """The environment that holds each library one instruction set below ``capability`` (torch's own word)."""
    if capability.upper().startswith("AVX512"):
        return {
            "ATEN_CPU_CAPABILITY": "avx2",
            "MKL_ENABLE_INSTRUCTIONS": "AVX2",
            "MKL_CBWR": "AVX2",
            "ONEDNN_MAX_CPU_ISA": "AVX2",
        }
    return {
        "ATEN_CPU_CAPABILITY": "default",
        "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
        "MKL_CBWR": "COMPATIBLE",
        "ONEDNN_MAX_CPU_ISA": "SSE41",
    }


def probe(env: dict[str, str]) -> tuple[str, str, str]:
    """(torch's capability, a matrix product's digest, a softmax's digest) in a fresh process under ``env``."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env={**os.environ, **env}, capture_output=True, text=True, check=True
    )
    capability, mm, softmax = out.stdout.split()
    return capability, mm, softmax


def main(args: list[str]) -> int:
    native = probe({})
    env = switches(native[0])
    held = probe(env)
    expected = env["ATEN_CPU_CAPABILITY"].upper()
    print(f"native: torch {native[0]}, matmul {native[1]}, softmax {native[2]}")
    switched = " ".join(f"{k}={v}" for k, v in env.items())
    print(f"held:   torch {held[0]}, matmul {held[1]}, softmax {held[2]} ({switched})")
    if held[0] != expected:
        print(f"other_isa: torch runs {held[0]}, not {expected}: ATEN_CPU_CAPABILITY took no effect", file=sys.stderr)
        return 2
    if held[1:] == native[1:]:
        print("other_isa: the probe's bits are the same held and unswitched: no switch took effect", file=sys.stderr)
        return 2
    for name, a, b in (("matrix product (BLAS)", native[1], held[1]), ("softmax (ATen)", native[2], held[2])):
        if a == b:
            print(f"other_isa: warning: the {name} gave the same bits held and unswitched on this processor")
    sys.stdout.flush()
    chosen = any(os.path.exists(a.split("::")[0]) for a in args)  # a path or a node id: that selection, else FLOATS
    markers = FLOATS_MARKERS + (" and not compiled" if held[0] == NO_INDUCTOR else "")
    return subprocess.call(
        [sys.executable, "-m", "pytest", *args, *([] if chosen else [*FLOATS, "-m", markers])],
        env={**os.environ, **env},
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
