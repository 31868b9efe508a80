"""A `backend=vllm` cell: the cell's prompts through vLLM's server and load generator, AR beside the method.

The first turn of each prompt, encoded as the HF cell encodes it, becomes one line of a dataset file (the ids decoded
back to text; the server must tokenize every line to exactly those ids, checked first). An AR server and the
method's server (a speculative config with gamma - 1 draft tokens) start in vLLM's environment; on a CPU both stay up
and `vllm bench serve` rounds alternate (AR, method, AR, method, ...), on a GPU they run one after the other. Both are
always stopped (`vllm_backend.server`). The record has the usual schema with vLLM's metrics (`vllm_backend.summary`).
"""

from __future__ import annotations

import json
import re
from contextlib import ExitStack
from pathlib import Path

import torch

from ecospec import sources
from ecospec.drafters.registry import kind as drafter_kind
from ecospec.drafters.registry import names as drafter_names
from ecospec.experiment.config import ROUTED_ON_CPU
from ecospec.experiment.job import run_job
from ecospec.experiment.spec import Cell
from ecospec.methods import AR
from ecospec.tiny.build import tiny_dirs
from ecospec.vllm_backend.args import kv_cache_bytes, server_args
from ecospec.vllm_backend.bench import BenchSettings, check_tokenization, run_round, write_dataset
from ecospec.vllm_backend.env import vllm_cli
from ecospec.vllm_backend.routes import record_routes
from ecospec.vllm_backend.server import Server, stop_on_signals
from ecospec.vllm_backend.summary import cell_summary

VLLM_DIR = "vllm"  # logs, the dataset file and the bench result files, inside the cell's directory


def run_vllm_cell(cfg, cell_dir: str | Path) -> dict:
    """Run (or skip) one vLLM cell and return its record."""
    return run_job(cfg, cell_dir, _vllm_cell)


def settings(backend: dict, model: dict) -> dict:
    """The backend settings with the model's defaults filled in (what the record's config shows)."""
    b = dict(backend)
    b["dtype"] = b.get("dtype") or model.get("dtype") or "auto"
    b["tp"] = int(b.get("tp") or model.get("vllm_tp") or 1)
    b["served_name"] = model["name"]
    return b


def checkpoints(model: dict, kind: str | None) -> tuple[str, str, str | None]:
    """(target, tokenizer, drafter checkpoint) as vLLM loads them, `kind` the drafter's: the tiny build's folders,
    or HF ids / paths."""
    spec = (model.get("drafters") or {}).get(kind) or {}
    source = sources.of(model)
    target = source.checkpoint(model, tiny_dirs)
    draft = spec.get("path")
    stage = drafter_kind(kind).build_stage if kind in drafter_names() else None
    if draft is None and source.builtin and stage:  # the build's own head
        draft = str(tiny_dirs(model)[stage] / "head")
    return target, target, draft


def dataset_prompts(chat: bool, tokenizer, prompts) -> tuple[list[str], list[list[int]]]:
    """(texts, ids): the first turn of every prompt of the cell, as the HF engine encodes it (`chat`: through the
    chat template), and its text for the server (the ids decoded, minus the special tokens the tokenizer adds by
    itself, which the server adds back)."""
    from ecospec.data import encode_turn

    ids = [encode_turn(tokenizer, p.turns, [], p.completion, chat) for p in prompts]
    auto = tokenizer("x", add_special_tokens=True).input_ids
    plain = tokenizer("x", add_special_tokens=False).input_ids
    prefix = auto[: len(auto) - len(plain)] if auto[len(auto) - len(plain) :] == plain else []
    texts = [tokenizer.decode(x[len(prefix) :] if x[: len(prefix)] == prefix else x) for x in ids]
    return texts, ids


def _vllm_cell(cell: Cell, cell_dir: Path, device: torch.device, record: dict) -> None:
    from transformers import AutoTokenizer

    from ecospec.experiment.cell import cell_prompts

    s, dec = settings(cell.backend, cell.model), cell.decoding
    method = cell.method.name
    prompts = cell_prompts(cell)
    record["data_source"] = prompts.source
    target, tokenizer_path, draft = checkpoints(cell.model, cell.method.drafter)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    texts, ids = dataset_prompts(cell.chat, tokenizer, prompts)
    out = Path(cell_dir) / VLLM_DIR
    data = write_dataset(out / "prompts.jsonl", texts)
    requests = max(s.get("requests") or len(texts), (s.get("requests_per_seq") or 0) * dec.batch_size)
    bench = BenchSettings(
        output_len=dec.max_new_tokens,
        concurrency=dec.batch_size,
        requests=requests,
        temperature=dec.temperature,
        top_p=dec.top_p,
        seed=dec.seed,
        warmups=s["warmups"],
    )
    cpu = device.type == "cpu"
    routed = bool(s.get("routed_experts"))
    if routed and cpu:
        raise ValueError(f"backend.routed_experts=true: {ROUTED_ON_CPU}")
    cli = vllm_cli(s.get("python"))  # vllm serve, and vllm bench serve even against a server someone else runs
    names = [AR] if method == AR else [AR, method]
    urls = {AR: s.get("ar_url") if method != AR else s.get("url"), method: s.get("url")}
    if s.get("url") and method != AR and not s.get("ar_url"):
        raise ValueError("backend.url names the method's server: the AR denominator needs backend.ar_url too")
    kv = _kv_bytes(target, s, dec.batch_size) if cpu else None
    servers = {
        n: Server(
            cli,
            target,
            server_args(s, n, dec.gamma, draft, dec.seed, cpu, kv),
            out / f"{n}.server.log",
            url=urls[n],
            startup_timeout_s=s["startup_timeout_s"],
            model_name=s["served_name"],
            env={"VLLM_USE_V2_MODEL_RUNNER": "1"} if routed else None,
        )  # routes come from the V2 runner only
        for n in names
    }
    rounds: dict[str, list[dict]] = {n: [] for n in names}
    log = out / "bench.log"
    with stop_on_signals(), ExitStack() as stack:
        if cpu:  # both up, rounds alternating: a machine that slows down slows both alike
            for srv in servers.values():
                stack.enter_context(srv)
            check_tokenization(servers[AR], texts, ids)
            version = servers[AR].get("/version").get("version")
            for r in range(s["rounds"]):
                for n in names:
                    rounds[n].append(run_round(cli, servers[n], tokenizer_path, data, bench, out, f"{n}-round{r}", log))
        else:  # one GPU (or node) at a time: each server alone on the hardware
            for n in names:
                with servers[n] as srv:
                    if n == AR:
                        check_tokenization(srv, texts, ids)
                        version = srv.get("/version").get("version")
                    for r in range(s["rounds"]):
                        rounds[n].append(run_round(cli, srv, tokenizer_path, data, bench, out, f"{n}-round{r}", log))
                    if routed and n == method:  # after the timed rounds: the committed sequences' routes
                        pairs = [(p.id, x) for p, x in zip(prompts, ids, strict=True)]
                        record["routes"] = record_routes(srv, pairs, dec.max_new_tokens, dec.temperature, dec.seed)
    record["summary"] = cell_summary(method, rounds[method], rounds[AR], dec.batch_size)
    record["summary"]["prompts"] = len(texts)
    record["summary"]["matches_ar"] = _matches(rounds, method, dec.temperature)
    if routed:  # N for the overlap analysis's baselines (the routes alone may miss an expert no token chose)
        record["summary"]["num_experts"] = _num_experts(target)
    record["env"]["vllm_version"] = version
    record["env"]["storage"] = {"quantization": _quantization(servers[AR].log), "dtype": s["dtype"]}
    record["server_args"] = {n: srv.args for n, srv in servers.items()}
    record["server_startup_s"] = {n: srv.startup_s for n, srv in servers.items()}
    record["prompts"] = [{"id": p.id, "turn": 0, "prompt_tokens": len(x)} for p, x in zip(prompts, ids, strict=True)]


def _matches(rounds: dict, method: str, temperature: float) -> float | None:
    """Greedy: the share of requests of the first round whose text equals AR's (vLLM is lossless too)."""
    if temperature != 0 or method == AR:
        return 1.0 if method == AR and temperature == 0 else None
    a, b = rounds[AR][0].get("generated_texts"), rounds[method][0].get("generated_texts")
    if not a or not b or len(a) != len(b):
        return None
    return sum(x == y for x, y in zip(a, b, strict=True)) / len(a)


def _num_experts(target: str) -> int:
    from transformers import AutoConfig

    from ecospec.models.adapters import config_moe_info

    return config_moe_info(AutoConfig.from_pretrained(target)).num_experts


def _quantization(log: Path) -> str | None:
    """What the server reports it runs (its engine config line: `quantization=...`)."""
    try:
        m = re.search(r"quantization=([\w.-]+)", log.read_text(errors="replace"))
    except OSError:
        return None
    return None if m is None or m.group(1) == "None" else m.group(1)


def _kv_bytes(target: str, s: dict, batch_size: int) -> int | None:
    """The CPU server's KV cache for this cell, from the target's config.json (None: no local config to read)."""
    try:
        config = json.loads((Path(target) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return kv_cache_bytes(config, s["max_model_len"], batch_size, s["dtype"])
