"""`experiment=predictor`: train a model's expert predictor on the traces of `experiment=traces` and publish it.

The paper's recipe (App. B.1): the train split of every dataset's samples (80 %, `ecospec.data.split`, by
sample id), the held-out 20 % for accuracy, Adam lr 1e-5, batch 16, 100 epochs, the backbone by HF id. The
target is not loaded: its MoE facts come from its config (built on the meta device) and the predictor's frozen
embedding is read from the checkpoint's safetensors. Checkpoints at the first crossing of each accuracy level
(Table 9) and the final one are published in the store under the model config's names (`acc50`, `acc60`,
`final`), where `method=ecospec` finds them; the training resumes from its last state after a kill or requeue.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from ecospec import sources
from ecospec.atomic import replace_dir
from ecospec.components import load_target_and_tokenizer
from ecospec.data.split import is_heldout
from ecospec.experiment.config import ConfigError
from ecospec.experiment.job import run_job
from ecospec.predictor.trace_files import MANIFEST, Traces, load_traces
from ecospec.predictor.train import PredictorTraining, train_expert_predictor
from ecospec.store import predictor_root, stored_predictor, traces_root
from ecospec.tiny.build import tiny_dirs

WORK = "work"  # the training run's own directory under the predictor root (checkpoints, resume state)


def _traces_command(model: str, dataset: str) -> str:
    return f"python run.py -m experiment=traces model={model} dataset={dataset}"


def gather_traces(model: dict, datasets: list[str]) -> Traces:
    """Every complete trace directory of `datasets` in the store, as one Traces (a sample traced twice, e.g. by
    two part layouts, counts once). Missing or unfinished traces are an error naming the command to run."""
    parts: list[Traces] = []
    for name in datasets:
        root = traces_root(model, name)
        dirs = sorted(p.parent for p in root.glob(f"*/{MANIFEST}"))
        if not dirs:
            raise ConfigError(
                f"no routing traces of dataset {name} for model={model['name']} (looked in {root}); make them with: "
                f"{_traces_command(model['name'], name)}"
            )
        for d in dirs:
            manifest = json.loads((d / MANIFEST).read_text())
            if not manifest.get("complete"):
                done, total = manifest["samples"], manifest.get("collection", {}).get("samples", "?")
                raise ConfigError(
                    f"the traces in {d} are unfinished ({done} of {total} samples); finish them with: "
                    f"{_traces_command(model['name'], name)} (it resumes)"
                )
            tr = load_traces(d)
            if tr.ids is None:
                raise ConfigError(f"the traces in {d} have no sample ids (not made by experiment=traces)")
            parts.append(tr)
    return _concat(parts)


def _concat(parts: list[Traces]) -> Traces:
    first = parts[0]
    seen: set[str] = set()
    tokens, routes, lengths, ids = [], [], [], []
    for tr in parts:
        if (tr.num_experts, tr.top_k, tr.moe_layers) != (first.num_experts, first.top_k, first.moe_layers):
            raise ConfigError("trace directories of different targets cannot be mixed")
        for i, sid in enumerate(tr.ids):
            if sid in seen:
                continue
            seen.add(sid)
            t, r = tr.sample(i)
            tokens.append(t)
            routes.append(r)
            lengths.append(len(t))
            ids.append(sid)
    return Traces(
        tokens=np.concatenate(tokens),
        offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        routes=np.concatenate(routes),
        num_experts=first.num_experts,
        top_k=first.top_k,
        moe_layers=first.moe_layers,
        ids=ids,
    )


def read_embedding(name_or_path: str, param: str) -> torch.Tensor:
    """One tensor of a safetensors checkpoint (local directory or hub id), read without the rest of the model:
    only the index and the one shard holding it are opened (or downloaded)."""
    from safetensors import safe_open

    def fetch(filename: str) -> Path | None:
        local = Path(name_or_path) / filename
        if Path(name_or_path).is_dir():
            return local if local.is_file() else None
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import EntryNotFoundError

        try:
            return Path(hf_hub_download(name_or_path, filename))
        except EntryNotFoundError:
            return None

    index = fetch("model.safetensors.index.json")
    shard = json.loads(index.read_text())["weight_map"].get(param) if index else "model.safetensors"
    path = fetch(shard) if shard else None
    if path is None:
        raise ConfigError(f"{name_or_path}: no safetensors file holds {param} (the target's input embedding)")
    with safe_open(str(path), framework="pt") as f:
        if param not in f.keys():  # noqa: SIM118 - safe_open has keys(), not __contains__
            raise ConfigError(f"{name_or_path}: {path.name} has no tensor {param} (the target's input embedding)")
        return f.get_tensor(param)


def target_facts(model: dict, device: torch.device):
    """(MoE facts, input embedding) of the target: from its config and one tensor for a real checkpoint, from the
    model itself for the tiny ones (cheap to build)."""
    if not sources.real(model):
        from ecospec.models import moe_info

        target, _ = load_target_and_tokenizer(model, torch.device("cpu"), tiny_dirs)
        return moe_info(target), target.get_input_embeddings().weight.detach().to(device)
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    from ecospec.models.adapters import config_moe_info

    config = AutoConfig.from_pretrained(model["target"])
    meta = config.__class__.from_dict(config.to_dict())
    meta._attn_implementation = meta._experts_implementation = "eager"
    with torch.device("meta"), no_init_weights():
        skeleton = AutoModelForCausalLM.from_config(meta)
    emb = skeleton.get_input_embeddings().weight
    param = next(n for n, p in skeleton.named_parameters() if p is emb)
    return config_moe_info(config), read_embedding(model["target"], param).to(device)


def _train(d: dict, job_dir: Path, device: torch.device, record: dict) -> None:
    t, model = d["training"], d["model"]
    traces = gather_traces(model, list(t["datasets"]))
    held = [is_heldout(sid) for sid in traces.ids]
    split = ([i for i, h in enumerate(held) if not h], [i for i, h in enumerate(held) if h])
    info, embedding = target_facts(model, device)
    if (info.num_moe_layers, info.num_experts, info.top_k) != (
        len(traces.moe_layers),
        traces.num_experts,
        traces.top_k,
    ):
        raise ConfigError(f"the traces in the store do not match model={model['name']}'s routing shape")
    root = predictor_root(model)
    work = root / WORK
    if d.get("force"):
        shutil.rmtree(root, ignore_errors=True)
    bar = tqdm(desc=f"predictor {model['name']}", unit="step", disable=not d.get("progress", True))

    def on_step(step: int, steps: int, loss: float, acc: float | None) -> None:
        if bar.total is None:
            bar.reset(total=steps)
            bar.update(step - 1)
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.3f}", **({"heldout": f"{acc:.3f}"} if acc is not None else {}))

    t0 = time.perf_counter()
    training = PredictorTraining(
        lr=t["lr"],
        batch_size=t["batch_size"],
        window=t["window"],
        seed=t["seed"],
        steps=t.get("steps"),
        epochs=t.get("epochs"),
        levels=dict(t.get("levels") or {}),
        eval_every=t.get("eval_every") or None,
    )
    summary = train_expert_predictor(
        info,
        embedding,
        model["predictor"]["backbone"],
        traces,
        training,
        work,
        device,
        split=split,
        resume=True,
        save_every_s=float(t.get("save_every_s", 900)),
        on_step=on_step,
    )
    bar.close()
    published = []
    for c in summary.checkpoints:  # work/<name> -> <root>/<name>, replacing an older one
        if c.reason == "every":
            continue
        replace_dir(work / c.name, root / c.name)
        published.append(c.name)
    result = {
        "model": model["name"],
        "target": model.get("target") or model.get("preset"),
        "backbone": model["predictor"]["backbone"],
        "datasets": list(t["datasets"]),
        "train_samples": len(split[0]),
        "heldout_samples": len(split[1]),
        "tokens": int(len(traces.tokens)),
        "steps": len(summary.losses),
        "final_accuracy": summary.final_accuracy,
        "untrained_accuracy": summary.evals[0][1],
        "chance": summary.chance,
        "layer_accuracy": summary.layer_accuracy,
        "evals": summary.evals,
        "checkpoints": [
            {"name": c.name, "step": c.step, "accuracy": c.accuracy, "reason": c.reason}
            for c in summary.checkpoints
            if c.name in published
        ],
        "published": published,
        "resumed_at": summary.resumed_at,
        "seconds": time.perf_counter() - t0,
        "store": str(root),
    }
    (root / "summary.json").write_text(json.dumps(result, indent=2))
    record["summary"] = {k: v for k, v in result.items() if k != "evals"} | {"evals": summary.evals[-50:]}


def run_predictor(cfg, job_dir: str | Path) -> dict:
    """Run (or skip) one predictor-training job and return its record."""
    return run_job(cfg, job_dir, _train, made=lambda d: stored_predictor(d["model"], "final") is not None)
