"""`experiment=traces`: the routing traces of one dataset (or one part of it) for the expert predictor.

Every sample (both splits) is asked as a cell asks it (chat template, multi-turn prompts turn by turn after
the model's own answers), answered by the target's own greedy response of `traces.response_tokens` tokens
(batched `generate`, left-padded), and the whole conversation is routed in one right-padded prefill per batch;
the router's top-k per token and MoE layer go to the store in whole shards. A killed or requeued job resumes
behind its last finished shard: the samples there are neither regenerated nor written twice.
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ecospec.components import load_target_and_tokenizer
from ecospec.data import encode_turn, load_prompts
from ecospec.data.split import heldout_ids
from ecospec.experiment.job import run_job
from ecospec.parallel import env_rank
from ecospec.predictor.trace_files import MANIFEST
from ecospec.predictor.traces import TraceWriter, route_batch, target_meta
from ecospec.store import traces_dir
from ecospec.tiny.build import tiny_dirs


def _eos_ids(target, tokenizer) -> list[int]:
    """The ids that end a response: the target's generation config (as the decode loop reads it), else the
    tokenizer's eos."""
    eos = target.generation_config.eos_token_id if target.generation_config is not None else None
    if eos is None:
        eos = tokenizer.eos_token_id
    return [eos] if isinstance(eos, int) else list(eos or [])


@torch.no_grad()
def greedy_responses(
    target, prompts: list[list[int]], max_new_tokens: int, pad_id: int, eos: list[int]
) -> list[list[int]]:
    """The target's greedy continuation of each prompt (one left-padded `generate` for the batch), cut after
    its first eos (kept)."""
    if max_new_tokens == 0:
        return [[] for _ in prompts]
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[row, width - len(p) :] = 1
    out = target.generate(
        input_ids=ids.to(target.device),
        attention_mask=mask.to(target.device),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        temperature=None,
        top_p=None,
        top_k=None,
        pad_token_id=pad_id,
        eos_token_id=eos or None,
    )
    responses = []
    for row in out[:, width:].tolist():
        end = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        responses.append(row[:end])
    return responses


def conversations(target, tokenizer, prompts, response_tokens: int, chat_template: bool) -> list[list[int]]:
    """Each prompt's whole conversation as token ids: its last turn as the cells encode it (earlier turns and the
    model's answers included) followed by the target's greedy answer to it."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos = _eos_ids(target, tokenizer)
    answers: list[list[str]] = [[] for _ in prompts]
    samples: list[list[int]] = [[] for _ in prompts]
    for turn in range(max(len(p.turns) for p in prompts)):
        rows = [i for i, p in enumerate(prompts) if turn < len(p.turns)]
        asked = [
            encode_turn(tokenizer, prompts[i].turns, answers[i], prompts[i].completion, chat_template) for i in rows
        ]
        for i, ids, resp in zip(rows, asked, greedy_responses(target, asked, response_tokens, pad, eos), strict=True):
            answers[i].append(tokenizer.decode(resp, skip_special_tokens=True))
            samples[i] = ids + resp
    return samples


def _collect(d: dict, job_dir: Path, device: torch.device, record: dict) -> None:
    t = d["traces"]
    ds = d["dataset"]
    every = load_prompts(ds["name"], None, ds.get("source"), split="all")
    held = heldout_ids([p.id for p in every])  # the split is a function of the whole dataset's ids
    prompts = every[: d.get("num_prompts") or len(every)]
    lo, hi = len(prompts) * t["part"] // t["parts"], len(prompts) * (t["part"] + 1) // t["parts"]
    mine = prompts[lo:hi]
    record["data_source"] = every.source
    target, tokenizer = load_target_and_tokenizer(d["model"], device, tiny_dirs)
    chat = d["model"].get("chat_template", True)
    out = traces_dir(d["model"], ds["name"], t["part"], t["parts"])
    collection = {
        "dataset": ds["name"],
        "data_source": every.source,
        "num_prompts": d.get("num_prompts"),
        "part": t["part"],
        "parts": t["parts"],
        "samples": len(mine),
        "response_tokens": t["response_tokens"],
        "chat_template": chat,
    }
    main = env_rank() == 0  # a tensor-parallel job: every rank traces, rank 0 writes
    if d.get("force") and main and (out / "manifest.json").exists():
        import shutil

        shutil.rmtree(out)
    writer = TraceWriter(out, target_meta(target), t["shard_size"], collection, write=main, fresh=bool(d.get("force")))
    resumed = writer.samples
    t0 = time.perf_counter()
    bar = tqdm(
        total=len(mine),
        initial=resumed,
        desc=f"traces {ds['name']}",
        unit="sample",
        disable=not d.get("progress", True),
    )
    todo = iter(mine[resumed:])
    made = 0
    while batch := list(itertools.islice(todo, t["batch_size"])):
        seqs = conversations(target, tokenizer, batch, t["response_tokens"], chat)
        for p, seq, routes in zip(batch, seqs, route_batch(target, seqs), strict=True):
            writer.add(seq, routes, p.id)
            made += len(seq)
        bar.update(len(batch))
    bar.close()
    writer.close()
    seconds = time.perf_counter() - t0
    m = writer.manifest
    record["summary"] = {
        "trace_dir": str(out),
        "samples": m["samples"],
        "tokens": m["tokens"],
        "heldout_samples": sum(p.id in held for p in mine),
        "resumed_samples": resumed,
        "seconds": seconds,
        "tokens_per_s": made / seconds if seconds > 0 and made else None,
    }


def _made(d: dict) -> bool:
    t = d["traces"]
    manifest = traces_dir(d["model"], d["dataset"]["name"], t["part"], t["parts"]) / MANIFEST
    try:
        return bool(json.loads(manifest.read_text()).get("complete"))
    except (OSError, ValueError):
        return False


def run_traces(cfg, job_dir: str | Path) -> dict:
    """Run (or skip) one traces job and return its record."""
    return run_job(cfg, job_dir, _collect, made=_made)
