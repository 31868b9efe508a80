"""Build and cache the embedded default: corpus + tokenizer, target, then the drafter, traces and predictor.

The full budget is released: trained once and shipped in ``ecospec/tiny/release/`` (``tiny.release``), which every
caller gets (``source``: unless ``$ECOSPEC_TINY=cache``), so nothing trains on first use. This module trains the
budgets into the cache: the small and micro ones the tests use, and the full one for whoever retrains it
(``python -m ecospec.tiny build --force``, compared with the release) or cuts a release (``make release-tiny``).

Layout (``paths()``)::

    $ECOSPEC_CACHE (default ~/.cache/ecospec)/
      tiny-<version>/              version = hash of the recipe's identity (tiny.release) and the Python minor
        .lock                      build lock (fcntl), so concurrent builds wait for each other
        corpus/   done.json  corpus.json  train.npy  val.npy  tokenizer/
        target/   done.json  model/  (HF config + safetensors + tokenizer files)
        drafter/  traces/  predictor/   done.json (+ files of later stages)

A stage is ``Stage(spec, run)`` in ``STAGES`` (``tiny.stages.SPECS`` holds the specs): ``run(ctx)`` writes its
files into ``ctx.out`` and returns a JSON-able metrics dict. It runs in a temp directory (``.<name>.tmp-<pid>``)
that is renamed to ``<name>/`` once ``done.json`` (key, metrics, seconds) is written, so a stage is either complete
or absent. A stage's key hashes its revision, its part of the budget (``StageSpec.recipe``, default: the budget
field named like the stage) and the keys of all earlier stages; a stage whose ``done.json`` has another key is
rebuilt, and so is everything after it. A missing stage whose key matches a finished one in a sibling ``tiny-*``
directory (another recipe that differs only downstream) is copied from there instead of rebuilt.

Budgets (``tiny.budgets``): ``"full"`` (the embedded default, released; tens of minutes on 2 CPU cores, its
build times in docs/embedded-default.md), ``"small"`` (a minutes-long end-to-end version for slow tests) and
``"micro"`` (seconds; unit tests). Results are deterministic for a
budget, a processor, a thread count (``build(threads=2)`` by default) and a Python (the corpus is its stdlib).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ecospec.atomic import replace_dir
from ecospec.components import load_build
from ecospec.identity import stage_keys
from ecospec.sources.tiny import load_trained
from ecospec.tiny.budgets import Budget, get_budget
from ecospec.tiny.calibrate import calibrate_stage, calibrate_summary
from ecospec.tiny.corpus import encode_documents, load_corpus, train_tokenizer
from ecospec.tiny.drafter import drafter_stage, drafter_summary
from ecospec.tiny.evaluate import evaluate_stage, evaluate_summary
from ecospec.tiny.gto import gto_stage, gto_summary
from ecospec.tiny.predictor import predictor_stage, predictor_summary, traces_stage, traces_summary
from ecospec.tiny.release import ReleaseError, compare, figures, read_manifest
from ecospec.tiny.stages import (
    SPECS,
    StageSpec,
    paths,
    recipe_identity,
    root_dir,
    source,
    version,
)

DEFAULT_THREADS = 2


# ----------------------------------------------------------------------------------------------- stages


@dataclass
class Context:
    """What a stage's ``run`` gets. ``out``: the (temporary) directory to write into; ``dirs``/``metrics``:
    final directories and metrics of the stages before it."""

    budget: Budget
    root: Path
    out: Path
    dirs: dict[str, Path]
    metrics: dict[str, dict]
    progress: bool = True
    strict: bool = False  # the target's routing check fails the build instead of warning

    def bar(self, iterable=None, **kwargs):
        """A tqdm bar (disabled when ``progress`` is False); as a factory: ``ctx.bar(total=n, desc=...)``."""
        from tqdm.auto import tqdm

        kwargs.setdefault("disable", not self.progress)
        kwargs.setdefault("dynamic_ncols", True)
        kwargs.setdefault("leave", False)
        return tqdm(iterable, **kwargs)

    def log(self, msg: str) -> None:
        if self.progress:
            from tqdm.auto import tqdm

            tqdm.write(f"[ecospec.tiny] {msg}", file=sys.stderr)

    # shortcuts to the products of the first stages, for the stages after them
    def tokenizer(self):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.dirs["corpus"] / "tokenizer")

    def tokens(self, split: str) -> np.ndarray:
        """The ``"train"`` or ``"val"`` token stream (``<|bos|> file <|eos|>`` documents)."""
        return np.load(self.dirs["corpus"] / f"{split}.npy")

    def target(self, **kwargs):
        return load_trained(self.dirs["target"] / "model", **kwargs)


@dataclass(frozen=True)
class Stage:
    """A stage (`stages.StageSpec`: its name, revision and recipe) with ``run(ctx) -> metrics`` and
    ``summary(metrics)``, the lines for the build summary."""

    spec: StageSpec
    run: Callable[[Context], dict]
    summary: Callable[[dict], list[str]] | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def revision(self) -> str:
        return self.spec.revision

    @property
    def optional(self) -> bool:
        return self.spec.optional

    def recipe_of(self, budget: Budget) -> Any:
        return self.spec.recipe_of(budget)


def _corpus_stage(ctx: Context) -> dict:
    r = ctx.budget.corpus
    t0 = time.perf_counter()
    corpus = load_corpus(r.max_bytes, r.val_every, progress=lambda it: ctx.bar(it, desc="corpus files", unit="file"))
    t1 = time.perf_counter()
    ctx.log(f"training a byte-level BPE tokenizer (vocab {r.vocab_size}) on {len(corpus.train)} files")
    tok = train_tokenizer(corpus.train, r.vocab_size, r.min_frequency)
    tok.save_pretrained(ctx.out / "tokenizer")
    t2 = time.perf_counter()
    train = encode_documents(tok, corpus.train)
    val = encode_documents(tok, corpus.val)
    np.save(ctx.out / "train.npy", train)
    np.save(ctx.out / "val.npy", val)
    meta = corpus.metadata()
    (ctx.out / "corpus.json").write_text(
        json.dumps({**meta, "files": corpus.files, "val_files": corpus.val_files}, indent=1)
    )
    return {
        **meta,
        "vocab_size": len(tok),
        "train_tokens": len(train),
        "val_tokens": len(val),
        "chars_per_token": meta["train_chars"] / max(len(train), 1),
        "read_seconds": t1 - t0,
        "tokenizer_seconds": t2 - t1,
        "encode_seconds": time.perf_counter() - t2,
    }


def _corpus_summary(m: dict) -> list[str]:
    return [
        f"{m['num_files']} stdlib files, {m['num_bytes'] / 1e6:.2f} MB, sha256 {m['sha256'][:16]}...; "
        f"BPE vocab {m['vocab_size']}, {m['train_tokens']:,} train / {m['val_tokens']:,} held-out tokens "
        f"({m['chars_per_token']:.2f} chars/token)"
    ]


def _target_stage(ctx: Context) -> dict:
    from ecospec.tiny.target import train_target

    tok = ctx.tokenizer()
    r = ctx.budget.target
    ctx.log(
        f"training the target: {r.num_layers} MoE layers, {r.num_experts} experts, top-{r.top_k}, hidden "
        f"{r.hidden_size}; {r.steps} steps x {r.batch_size} x {r.seq_len} tokens"
    )
    model, metrics = train_target(
        r,
        ctx.tokens("train"),
        ctx.tokens("val"),
        len(tok),
        progress=lambda **kw: ctx.bar(**kw),
        log=ctx.log,
        strict=ctx.strict,
    )
    model.save_pretrained(ctx.out / "model")
    tok.save_pretrained(ctx.out / "model")
    return metrics


def _target_summary(m: dict) -> list[str]:
    rt = m["routing"]
    ov = rt["overlap"]
    return [
        f"{m['params'] / 1e6:.2f}M params ({m['active_params'] / 1e6:.2f}M active), {m['train_tokens']:,} tokens, "
        f"{m['steps_per_second']:.2f} steps/s ({m['tokens_per_second']:.0f} tokens/s, {m['threads']} threads)",
        f"held-out loss {m['heldout_loss']:.3f} nats/token (init {m['heldout_loss_init']:.3f}, log V "
        f"{m['log_vocab']:.3f}); train loss {m['train_loss']:.3f}",
        "expert load per layer: min share "
        + " ".join(f"{x:.2%}" for x in rt["min_share"])
        + " | max/mean "
        + " ".join(f"{x:.2f}" for x in rt["max_over_mean"]),
        f"consecutive-token routing overlap: empirical {ov['empirical']:.3f}, independence "
        f"{ov['independence']:.3f}, uniform {ov['uniform']:.3f}",
    ] + [f"ROUTING VIOLATION {p}" for p in m.get("routing_violations", [])]


RUNS: dict[str, tuple[Callable[[Context], dict], Callable[[dict], list[str]]]] = {
    "corpus": (_corpus_stage, _corpus_summary),
    "target": (_target_stage, _target_summary),
    "drafter": (drafter_stage, drafter_summary),
    "traces": (traces_stage, traces_summary),
    "predictor": (predictor_stage, predictor_summary),
    "evaluate": (evaluate_stage, evaluate_summary),
    "gto": (gto_stage, gto_summary),
    "calibrate": (calibrate_stage, calibrate_summary),
}
STAGES: list[Stage] = [Stage(spec, *RUNS[spec.name]) for spec in SPECS]


def _read_done(stage_dir: Path) -> dict | None:
    try:
        return json.loads((stage_dir / "done.json").read_text())
    except (OSError, ValueError):
        return None


def _find_sibling(root: Path, name: str, key: str) -> Path | None:
    for other in sorted(root.parent.glob("tiny-*")):
        if other == root:
            continue
        done = _read_done(other / name)
        if done is not None and done.get("key") == key:
            return other / name
    return None


@contextlib.contextmanager
def _locked(root: Path):
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _versions() -> dict:
    import tokenizers
    import torch
    import transformers

    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
    }


def _replace_dir(tmp: Path, final: Path) -> None:
    replace_dir(tmp, final)


def build(
    budget: str | Budget = "full",
    force: bool = False,
    progress: bool = True,
    until: str | None = None,
    threads: int | None = DEFAULT_THREADS,
    strict: bool = False,
) -> dict:
    """Build (or reuse) every stage up to ``until`` (default: all) and return the summary:
    ``{"budget", "version", "root", "seconds", "stages": {name: {"status", "seconds", "dir", "metrics"}}}``
    where status is ``built``, ``cached``, ``copied`` or ``released`` and seconds is the stage's original build
    time. Where the release is in use (``source``), nothing trains: the summary is the release's. ``force``
    retrains into the cache (the full budget: then compared with the release); ``strict`` fails on the routing
    check instead of warning; ``threads`` sets torch's intra-op threads for the build (None: leave as is). Prints
    the summary when ``progress``."""
    import torch

    b = get_budget(budget)
    if not force and source(b) == "release":
        if until == "traces":
            _traces_on_release(b, progress)
        return _release_summary(b)
    names = [s.name for s in STAGES]
    if until is not None and until not in names:
        raise ValueError(f"unknown stage {until!r}; stages: {', '.join(names)}")
    stages = STAGES[: names.index(until) + 1] if until is not None else STAGES
    stages = [st for st in stages if not st.optional or st.name == until]  # optional: only when asked for
    keys = stage_keys(STAGES, b)
    root = root_dir(b)
    summary: dict = {"budget": b.name, "version": version(b), "root": str(root), "stages": {}}
    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    t_start = time.perf_counter()
    load0 = os.getloadavg()[0]
    try:
        with _locked(root):
            for stale in root.glob(".*.tmp-*"):  # left by a killed build (we hold the lock)
                shutil.rmtree(stale, ignore_errors=True)
            (root / "recipe.json").write_text(json.dumps({"budget": asdict(b), "keys": keys}, indent=1, default=str))
            dirs: dict[str, Path] = {}
            metrics: dict[str, dict] = {}
            rebuilt_upstream = False
            for stage in stages:
                final = root / stage.name
                done = _read_done(final)
                status = "cached"
                if force or rebuilt_upstream or done is None or done.get("key") != keys[stage.name]:
                    tmp = root / f".{stage.name}.tmp-{os.getpid()}"
                    shutil.rmtree(tmp, ignore_errors=True)
                    sibling = None if force else _find_sibling(root, stage.name, keys[stage.name])
                    if sibling is not None:
                        shutil.copytree(sibling, tmp)
                        status = "copied"
                    else:
                        ctx = Context(b, root, tmp, dict(dirs), dict(metrics), progress, strict)
                        _run_stage(stage, ctx, {"key": keys[stage.name]}, f"building stage {stage.name!r} ...")
                        status = "built"
                    _replace_dir(tmp, final)
                    done = _read_done(final)
                    rebuilt_upstream = True
                dirs[stage.name] = final
                metrics[stage.name] = done["metrics"]
                summary["stages"][stage.name] = {
                    "status": status,
                    "seconds": done["seconds"],
                    "dir": str(final),
                    "metrics": done["metrics"],
                }
    finally:
        torch.set_num_threads(old_threads)
    summary["seconds"] = time.perf_counter() - t_start
    summary["build_seconds"] = sum(s["seconds"] for s in summary["stages"].values())
    summary["loadavg_1min_at_start"] = load0
    if progress:
        print(format_summary(summary), flush=True)
        if b.name.startswith("full") and until is None:
            print(compare_with_release(summary), flush=True)
    return summary


def _run_stage(stage: Stage, ctx: Context, extra: dict, message: str) -> dict:
    """Run `stage` into `ctx.out` (created here, removed again if the stage fails) and write its done.json: `extra`
    (its key, or what marks it), revision, recipe, seconds, threads, versions and metrics."""
    import torch

    ctx.out.mkdir()
    if ctx.progress:
        ctx.log(message)
    t0 = time.perf_counter()
    try:
        stage_metrics = stage.run(ctx)
    except BaseException:
        shutil.rmtree(ctx.out, ignore_errors=True)
        raise
    done = {
        "stage": stage.name,
        **extra,
        "revision": stage.revision,
        "recipe": stage.recipe_of(ctx.budget),
        "seconds": time.perf_counter() - t0,
        "threads": torch.get_num_threads(),
        "loadavg_1min_at_start": os.getloadavg()[0],
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "versions": _versions(),
        "metrics": stage_metrics,
    }
    (ctx.out / "done.json").write_text(json.dumps(done, indent=1, default=str))
    return done


def _traces_on_release(b: Budget, progress: bool) -> Path:
    """The release's routing traces, traced here once from its target and corpus (deterministic for a processor
    like every stage; its time: docs/embedded-default.md) into ``on_release_dir``."""
    where = paths(b)
    final = where["traces"]
    if _read_done(final) is not None:
        return final
    with _locked(final.parent):
        if _read_done(final) is not None:  # another process traced it meanwhile
            return final
        tmp = final.parent / f".traces.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        ctx = Context(b, where["root"], tmp, {n: where[n] for n in ("corpus", "target")}, {}, progress)
        stage = next(st for st in STAGES if st.name == "traces")
        _run_stage(stage, ctx, {"on_release": True}, "tracing the release's routing (first use) ...")
        _replace_dir(tmp, final)
    return final


def _released(b: Budget) -> tuple[dict, dict[str, Path], dict[str, dict | None]]:
    """The release (checked) as a summary head, its stage folders and each stage's done.json (None: not shipped)."""
    where = paths(b)
    head = {"budget": b.name, "version": version(b), "root": str(where["root"]), "source": "release", "stages": {}}
    return head, where, {stage.name: _read_done(where[stage.name]) for stage in STAGES}


def _release_summary(b: Budget) -> dict:
    summary, where, done = _released(b)
    for name, d in done.items():
        if d is not None:
            summary["stages"][name] = {
                "status": "released",
                "seconds": d["seconds"],
                "dir": str(where[name]),
                "metrics": d["metrics"],
            }
    summary["build_seconds"] = sum(s["seconds"] for s in summary["stages"].values())
    summary["seconds"] = 0.0  # this call trained nothing
    return summary


def compare_with_release(summary: dict) -> str:
    """How a cache build's figures compare with the release's (held-out loss, routing, α, E, cost ratios)."""
    try:
        manifest = read_manifest()
    except ReleaseError as e:
        return f"no comparison with the release: {e}"
    if manifest is None:
        return "no release to compare with"
    mine = figures({n: s["metrics"] for n, s in summary["stages"].items()})
    return "\n".join(
        [
            f"this build against the release ({manifest['built_by']['processor']}, "
            f"{manifest['built_by']['threads']} threads, Python {manifest['built_by'].get('python')}):",
            *compare(mine, manifest["figures"]),
        ]
    )


def format_summary(summary: dict) -> str:
    by_name = {s.name: s for s in STAGES}
    lines = [f"ecospec tiny build, budget {summary['budget']!r}: {summary['root']}"]
    for name, info in summary["stages"].items():
        lines.append(f"  {name:<10} {info['status']:<7} {info['seconds']:8.1f} s")
        stage = by_name.get(name)
        if info["metrics"].get("placeholder"):
            lines[-1] += "  (placeholder)"
        elif stage is not None and stage.summary is not None:
            lines += [f"      {line}" for line in stage.summary(info["metrics"])]
    lines.append(f"  build time of these stages {summary['build_seconds']:.1f} s; this call {summary['seconds']:.1f} s")
    return "\n".join(lines)


def status(budget: str | Budget = "full") -> dict:
    """Per stage: ``done`` (matching key, or in the release), ``stale`` (other key) or ``missing``, with
    seconds/metrics; ``source``: release or cache."""
    b = get_budget(budget)
    if source(b) == "release":
        out, _, done = _released(b)
        for stage in STAGES:
            if not stage.optional and stage.name != "traces":  # the release ships no traces
                out["stages"][stage.name] = {
                    "status": "done" if done[stage.name] else "missing",
                    **(done[stage.name] or {}),
                }
        return out
    keys = stage_keys(STAGES, b)
    root = root_dir(b)
    out: dict = {"budget": b.name, "version": version(b), "root": str(root), "source": "cache", "stages": {}}
    for stage in STAGES:
        if stage.optional:
            continue  # not part of a finished build; `build(until=name)` makes it
        done = _read_done(root / stage.name)
        state = "missing" if done is None else ("done" if done.get("key") == keys[stage.name] else "stale")
        out["stages"][stage.name] = {"status": state, **({} if done is None else done)}
    return out


# ------------------------------------------------------------------------------------------------- loaders


def load_tiny_tokenizer(budget: str | Budget = "full", progress: bool = True):
    """The embedded tokenizer (``AutoTokenizer``): the release's, or a cache build's (built on first use)."""
    from transformers import AutoTokenizer

    build(budget, until="corpus", progress=progress)
    return AutoTokenizer.from_pretrained(paths(budget)["tokenizer"])


def load_tiny_target(budget: str | Budget = "full", progress: bool = True, **kwargs):
    """The embedded target (``Qwen3MoeForCausalLM``, eval mode): the release's, or a cache build's. ``kwargs`` go to
    ``from_pretrained`` (default: float32, eager attention and experts, like ``ecospec.models.tiny_model``)."""
    build(budget, until="target", progress=progress)
    return load_trained(paths(budget)["target_model"], **kwargs)


def load_tiny(budget: str | Budget = "full", calibrated: bool = True):
    """``(target, tokenizer, drafter, predictor)`` of the embedded default (the release, checked; another budget
    or ``$ECOSPEC_TINY=cache``: a cache build, made first where missing): the EAGLE-3 head at its fitted draft
    temperature and the final expert predictor."""
    build(budget, progress=False)
    return load_build(paths(budget), calibrated=calibrated)


def tiny_dirs(model: dict, until: str | None = None) -> dict[str, Path]:
    """The embedded default's directories: the release (checked, nothing trains) or, for another budget or
    ECOSPEC_TINY=cache, a cache build made first where missing; `until`: an optional stage too (e.g. "gto")."""
    budget = model.get("budget", "full")
    if any(st["status"] != "done" for st in status(budget)["stages"].values()):
        build(budget)  # a cache build, the first time (the full budget: tens of minutes on 2 cores)
    if until is not None:
        build(budget, until=until)  # a no-op once built (and for the release)
    return paths(budget)


def tiny_weights(model: dict) -> dict:
    """Which embedded default a tiny cell uses: ``{"source": "release", "identity": ...}`` or the cache build's
    version and folder."""
    budget = model.get("budget", "full")
    if source(budget) == "release":
        return {"source": "release", "identity": recipe_identity(budget)}
    return {"source": "cache", "version": version(budget), "root": str(root_dir(budget))}
