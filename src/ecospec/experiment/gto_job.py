"""`experiment=gto`: train a GTO head for a target (paper Table 5) and publish it where method=gto finds it.

    python run.py -m experiment=gto model=qwen3 cluster=slurm_gpu          # the model's EAGLE-3 head, further trained
    python run.py -m experiment=gto model=qwen3 gto.data=/data/chats.jsonl  # or on a local JSONL

Data: the train split (80 %, `ecospec.data.split`; the held-out prompts are never trained on) of `gto.datasets`,
each prompt answered by the target itself (greedy, `gto.response_tokens`, turn by turn as the traces job does), or
`gto.data`: a JSONL of {"text": ...} lines (tokenized as is) or {"prompt": ..., "response": ...}. The head starts
from `model.drafters.eagle3` (a public checkpoint in either layout, or ours), the reference is a frozen copy of
it, and `drafters.gto_train.train_gto` runs `gto.steps` steps; the state (head, reference, optimiser, data order,
RNG) is saved every `gto.save_every` steps under the store's `gto/work/`, so a killed or requeued job resumes.
The target is loaded with the model's `parallel` setting (tp / ep: every rank trains the same replicated head,
rank 0 writes). Publishes `gto/head/` (EAGLE layout) and `gto/summary.json`.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ecospec import sources
from ecospec.atomic import replace_dir, temp_dir, write_file, write_json
from ecospec.components import load_target_and_tokenizer, local_path
from ecospec.drafters.gto_train import GtoTraining, train_gto_head
from ecospec.drafters.registry import RANDOM_PATH
from ecospec.experiment.config import ConfigError
from ecospec.experiment.job import run_job
from ecospec.parallel import env_rank
from ecospec.store import gto_root, stored_gto
from ecospec.tiny.build import tiny_dirs

STATE = "state.pt"


def _sequences(d: dict, target, tokenizer) -> list[torch.Tensor]:
    """Training token sequences: a local JSONL, or the datasets' train-split prompts with the target's answers."""
    g = d["gto"]
    if g.get("data"):
        path = Path(g["data"])
        if not path.is_file():
            raise ConfigError(f"gto.data={g['data']!r}: no such file")
        out = []
        for n, line in enumerate(path.read_text().splitlines()):
            if not line.strip():
                continue
            row = json.loads(line)
            text = row.get("text") or (row.get("prompt", "") + row.get("response", ""))
            if not text:
                raise ConfigError(f"{path}:{n + 1}: a line needs 'text', or 'prompt' and 'response'")
            out.append(torch.tensor(tokenizer.encode(text), dtype=torch.long))
        if not out:
            raise ConfigError(f"gto.data={g['data']!r} holds no lines")
        return out
    from ecospec.data import load_prompts
    from ecospec.data.split import is_heldout
    from ecospec.experiment.traces_job import conversations

    chat = d["model"].get("chat_template", True)
    every = [p for name in g["datasets"] for p in load_prompts(name, None, None, split="all")]
    prompts = [p for p in every if not is_heldout(p.id)]  # never the held-out 20 % the cells evaluate on
    prompts = prompts[: g.get("num_prompts") or len(prompts)]
    seqs = []
    for k in range(0, len(prompts), g["batch_size_generate"]):
        batch = prompts[k : k + g["batch_size_generate"]]
        seqs += [
            torch.tensor(s, dtype=torch.long)
            for s in conversations(target, tokenizer, batch, g["response_tokens"], chat)
        ]
    return seqs


def _train(d: dict, job_dir: Path, device: torch.device, record: dict) -> None:
    from ecospec.drafters.eagle3_checkpoint import load_eagle3, save_eagle3

    g, model = d["gto"], d["model"]
    target, tokenizer = load_target_and_tokenizer(model, device, tiny_dirs)
    spec = (model.get("drafters") or {}).get("eagle3") or {}
    path = spec.get("path")
    if path is None and not sources.builtin(model):
        raise ConfigError(f"model={model['name']} has no model.drafters.eagle3.path: GTO starts from an EAGLE-3 head")
    if path == RANDOM_PATH:  # a random tiny target's random head (tests)
        from ecospec.drafters.eagle3 import Eagle3Head, init_random_weights
        from ecospec.drafters.eagle3_train import default_head_config

        where, head = RANDOM_PATH, init_random_weights(Eagle3Head(default_head_config(target)), seed=1)
    else:
        where = tiny_dirs(model)["drafter"] / "head" if path is None else local_path(path)
        head = load_eagle3(where, target.config)
    root = gto_root(model)
    work = root / "work"
    if d.get("force") and env_rank() == 0:
        shutil.rmtree(root, ignore_errors=True)
    state = torch.load(work / STATE, weights_only=False) if (work / STATE).is_file() and not d.get("force") else None
    seqs = _sequences(d, target, tokenizer)
    bar = tqdm(
        total=g["steps"],
        initial=state["step"] if state else 0,
        desc=f"GTO {model['name']}",
        unit="step",
        disable=not d.get("progress", True),
    )

    def save(st: dict) -> None:
        if env_rank() == 0:
            work.mkdir(parents=True, exist_ok=True)
            write_file(work / STATE, lambda f: torch.save(st, f), text=False)

    def progress(e: dict) -> None:
        bar.update(1)
        bar.set_postfix(gain=f"{e['reward_gain']:+.4f}", acc=f"{e['accepted']:.2f}")

    t0 = time.perf_counter()
    head, log = train_gto_head(
        head, target, seqs, GtoTraining.of(g), progress=progress, state=state, save=save, save_every=g["save_every"]
    )
    bar.close()
    summary = {
        "model": model["name"],
        "start_head": str(where),
        "sequences": len(seqs),
        "steps": g["steps"],
        "resumed_at": state["step"] if state else 0,
        "reward_gain_last": sum(log.reward_gain[-20:]) / 20,
        "accepted_last": sum(log.accepted[-20:]) / 20,
        "seconds": time.perf_counter() - t0,
        "store": str(root),
    }
    if env_rank() == 0:
        tmp = temp_dir(root / "head")
        save_eagle3(head, tmp)
        replace_dir(tmp, root / "head")
        write_json(root / "summary.json", summary, indent=2)
        shutil.rmtree(work, ignore_errors=True)
    record["summary"] = summary


def run_gto(cfg, job_dir: str | Path) -> dict:
    """Run (or skip) one GTO-training job and return its record."""
    return run_job(cfg, job_dir, _train, made=lambda d: stored_gto(d["model"]) is not None)
