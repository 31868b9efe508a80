"""The released embedded default: the full budget's build, trained once and shipped as package data in
``ecospec/tiny/release/``, so that every machine decodes with the same weights and nothing trains on first use.

Layout: the stage folders of a cache build (``tiny.build``) with only what later code reads::

    release/
      manifest.json          identity, recipe, who built it (processor, threads, Python), figures, sha256 of each file
      corpus/   done.json  train.npy  val.npy  tokenizer/
      target/   done.json  model/          HF folder (config, safetensors, tokenizer): vLLM serves it as it is
      drafter/  done.json  head/           EAGLE-3 head, speculators layout (HF folder with config)
      predictor/ done.json acc50/ acc60/ final/
      evaluate/ done.json
      gto/      done.json  head/
      calibrate/ done.json calibration.json

Routing traces (the ``traces`` stage) are left out (the predictor's training data, its size in
docs/embedded-default.md; the predictor is shipped).

The identity hashes what shapes the weights: the cache format, each stage's revision and its recipe (the budget's
fields). Not the Python version, the thread count it is loaded with or whether the build's checks were enforced,
so the release is accepted on any machine. A release whose identity differs from the code's recipe is refused
with one line naming ``make release-tiny``; a file whose sha256 differs from the manifest is refused by name.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import shutil
import sys
from dataclasses import asdict
from pathlib import Path

from ecospec.atomic import replace_dir
from ecospec.cache import sha256_file
from ecospec.identity import release_identity
from ecospec.methods import methods
from ecospec.tiny.layout import MANIFEST, RELEASE_DIR

REBUILD = "make release-tiny"
# what a release keeps of each stage folder (globs relative to it; done.json always)
KEEP = {
    "corpus": ["train.npy", "val.npy", "tokenizer/*"],
    "target": ["model/*"],
    "drafter": ["head/*"],
    "predictor": ["acc*/*", "final/*", "summary.json"],
    "evaluate": [],
    "gto": ["head/*"],
    "calibrate": ["calibration.json"],
}


# the evaluate stage's selectors that call the expert predictor (the others' T_pred is timer noise)
PREDICTED = tuple(m.name for m in methods() if m.predictor == "learned")


class ReleaseError(RuntimeError):
    """The shipped release cannot be used as it is (another recipe, a changed file, a missing file)."""


def read_manifest(where: Path = RELEASE_DIR) -> dict | None:
    try:
        return json.loads((where / MANIFEST).read_text())
    except FileNotFoundError:
        return None
    except ValueError as e:
        raise ReleaseError(f"{where / MANIFEST}: not valid JSON ({e}); restore it from git or run `{REBUILD}`") from e


@functools.cache
def _verified(where: str, expected: str) -> dict:
    root = Path(where)
    m = read_manifest(root)
    if m is None:
        raise ReleaseError(f"no embedded default release in {root} (no {MANIFEST}); run `{REBUILD}` to build one")
    if m.get("identity") != expected:
        raise ReleaseError(
            f"the embedded default release in {root} was made by another recipe (release {m.get('identity')}, code "
            f"{expected}): run `{REBUILD}` to rebuild, check and re-release it"
        )
    for rel, sha in m["files"].items():
        path = root / rel
        if not path.is_file():
            raise ReleaseError(
                f"embedded default release: {rel} is missing (listed in {MANIFEST}); restore it from git"
            )
        if sha256_file(path) != sha:
            raise ReleaseError(
                f"embedded default release: {rel} does not match its sha256 in {MANIFEST}; restore it "
                f"from git or run `{REBUILD}`"
            )
    return m


def verify(identity: str, where: Path = RELEASE_DIR) -> dict:
    """The manifest of the release in `where` once its identity (the code's recipe's: `tiny.build.recipe_identity`)
    and every file's hash are checked (once a process)."""
    return _verified(str(where), identity)


def processor() -> str:
    """The CPU as /proc/cpuinfo names it (model name, family, model, AVX-512 or not; no host name), else platform's."""
    try:
        info = dict(
            line.split(":", 1)
            for line in Path("/proc/cpuinfo").read_text().split("\n\n")[0].splitlines()
            if ":" in line
        )
        info = {k.strip(): v.strip() for k, v in info.items()}
        simd = (
            "AVX-512"
            if "avx512f" in info.get("flags", "").split()
            else "AVX2"
            if "avx2" in info.get("flags", "")
            else ""
        )
        return f"{info['model name']} (family {info.get('cpu family')}, model {info.get('model')}, {simd or 'no AVX2'})"
    except (OSError, KeyError, ValueError):
        return platform.processor() or platform.machine()


def figures(metrics: dict[str, dict]) -> dict:
    """The build's own figures from its stages' metrics: held-out loss, routing statistics, the evaluate stage's α,
    E and cost ratios (what `build --force` compares with the release)."""
    t = metrics.get("target") or {}
    rt = t.get("routing") or {}
    out: dict = {
        "heldout_loss": t.get("heldout_loss"),
        "routing_min_share": min(rt["min_share"]) if rt.get("min_share") else None,
        "routing_max_over_mean": max(rt["max_over_mean"]) if rt.get("max_over_mean") else None,
        "routing_overlap": (rt.get("overlap") or {}).get("empirical"),
        "routing_violations": list(t.get("routing_violations") or []),
    }
    ev = (metrics.get("evaluate") or {}).get("methods") or {}
    ar_ms = (ev.get("ar") or {}).get("t_step_ms")
    for name, x in ev.items():
        out[f"{name}.alpha"] = x["alpha"]
        out[f"{name}.E"] = x["experts_per_layer"]
        if ar_ms and name != "ar":
            out[f"{name}.T_draft/T_AR"] = x["t_draft_ms"] / ar_ms
        if name in PREDICTED and x.get("t_pred_ms") and x.get("t_verify_ms"):
            out[f"{name}.T_pred/T_verify"] = x["t_pred_ms"] / x["t_verify_ms"]
    if "predictor" in metrics:
        out["predictor_accuracy"] = metrics["predictor"].get("accuracy")
    return out


def compare(build_figures: dict, release_figures: dict) -> list[str]:
    """Lines that set a build's figures beside the release's."""
    lines = [f"  {'':<26} {'this build':>12} {'release':>12}"]
    for key in dict.fromkeys([*release_figures, *build_figures]):
        if key.endswith(".T_pred/T_verify") and key.split(".")[0] not in PREDICTED:
            continue  # timer noise of a selector that calls no predictor (in releases before this rule)
        a, b = build_figures.get(key), release_figures.get(key)
        if key == "routing_violations":
            lines.append(f"  {key:<26} {len(a or []):>12} {len(b or []):>12}")
            continue
        pct = key == "routing_min_share"
        a, b = ("-" if v is None else (f"{v:.2%}" if pct else f"{v:.4f}") for v in (a, b))
        lines.append(f"  {key:<26} {a:>12} {b:>12}")
    return lines


def _scrub(done: dict) -> dict:
    """A stage's done.json without what names the machine it ran on (paths, load)."""
    done = {k: v for k, v in done.items() if k not in ("loadavg_1min_at_start", "dir")}
    metrics = dict(done.get("metrics") or {})
    if "stdlib" in metrics:
        metrics["stdlib"] = "python{}.{} standard library".format(*sys.version_info[:2])
    done["metrics"] = metrics
    return done


def make_release(build_root: Path, budget, stages, dest: Path = RELEASE_DIR, threads: int | None = None) -> dict:
    """Copy the finished build in `build_root` into `dest` as a release (written beside, then swapped in) and return
    its manifest; `stages`: the build's (`tiny.build.STAGES`). The build's recorded recipe must be the code's (fields
    the code no longer has are ignored)."""
    recorded = json.loads((build_root / "recipe.json").read_text())["budget"]
    current = json.loads(json.dumps(asdict(budget)))  # as recipe.json holds it (tuples as lists)
    for part, fields in current.items():
        have = recorded.get(part)
        if isinstance(fields, dict) and isinstance(have, dict):
            have = {k: v for k, v in have.items() if k in fields}
        if part != "name" and have != fields:
            raise ReleaseError(f"{build_root}: built with another {part} recipe than the code's; rebuild it first")
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    metrics: dict[str, dict] = {}
    versions: dict = {}
    for stage in stages:
        if stage.name not in KEEP:
            continue
        src = build_root / stage.name
        done = json.loads((src / "done.json").read_text())
        metrics[stage.name] = done["metrics"]
        versions = done.get("versions", versions)
        threads = threads or done.get("threads")
        out = tmp / stage.name
        out.mkdir(parents=True)
        (out / "done.json").write_text(json.dumps(_scrub(done), indent=1, default=str))
        for pattern in KEEP[stage.name]:
            for f in sorted(src.glob(pattern)):
                if f.is_file():
                    (out / f.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(f, out / f.relative_to(src))
    files = {str(p.relative_to(tmp)): sha256_file(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
    manifest = {
        "identity": release_identity(stages, budget),
        "budget": budget.name,
        "recipe": current,
        "stage_revisions": {s.name: s.revision for s in stages},
        "built_by": {"processor": processor(), "machine": platform.machine(), "threads": threads, **versions},
        "figures": figures(metrics),
        "bytes": sum((tmp / f).stat().st_size for f in files),
        "files": files,
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, default=str) + "\n")
    replace_dir(tmp, dest)
    _verified.cache_clear()
    return manifest
