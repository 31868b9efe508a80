"""vLLM's own load generator, `vllm bench serve`, against a running server: one call = one round of requests.

The cell's prompts go in as a `custom` dataset file (`{"prompt": text}` per line, sent as is: `--skip-chat-template`,
the text being the cell's token ids decoded, so the server tokenizes it back to them: `check_tokenization`), in file
order (`--disable-shuffle`), every request generating exactly `output_len` tokens (`--ignore-eos`), at most
`concurrency` in flight (`--max-concurrency` = the cell's batch size). Its result file (`--save-result`) has TTFT,
TPOT, throughput and, for a speculative server, the acceptance it read from the server's metrics.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ecospec.vllm_backend.server import Server


@dataclass(frozen=True)
class BenchSettings:
    output_len: int
    concurrency: int
    requests: int  # requests per round (more than the prompts: the file is oversampled, as the overlap paper did)
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    warmups: int = 1
    timeout_s: float = 3600


def write_dataset(path: Path, texts: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    return path


def check_tokenization(server: Server, texts: list[str], ids: list[list[int]]) -> None:
    """The server must tokenize each dataset prompt to the cell's token ids (`/tokenize`, special tokens added as
    the completions endpoint adds them), or TPOT would be measured on other prompts than the HF engine's."""
    bad = []
    for i, (text, want) in enumerate(zip(texts, ids, strict=True)):
        got = server.post("/tokenize", {"model": server.model_name, "prompt": text})["tokens"]
        if got != want:
            pairs = enumerate(zip(got, want, strict=False))
            first = next((j for j, (a, b) in pairs if a != b), min(len(got), len(want)))
            bad.append(f"prompt {i}: {len(got)} tokens vs {len(want)}, first difference at {first}")
    if bad:
        raise ValueError(f"the server tokenizes {len(bad)} of {len(texts)} prompts differently: {'; '.join(bad[:3])}")


def run_round(
    cli: Path, server: Server, tokenizer: str, dataset: Path, s: BenchSettings, out: Path, label: str, log: Path
) -> dict:
    """One `vllm bench serve` round; its result JSON (plus `wall_s`)."""
    out.mkdir(parents=True, exist_ok=True)
    name = f"{label}.json"
    (out / name).unlink(missing_ok=True)
    cmd = [
        str(cli),
        "bench",
        "serve",
        "--backend",
        "vllm",
        "--base-url",
        server.url,
        "--model",
        server.model_name,
        "--tokenizer",
        tokenizer,
        "--dataset-name",
        "custom",
        "--dataset-path",
        str(dataset),
        "--skip-chat-template",
        "--disable-shuffle",
        "--custom-output-len",
        str(s.output_len),
        "--ignore-eos",
        "--num-prompts",
        str(s.requests),
        "--max-concurrency",
        str(s.concurrency),
        "--seed",
        str(s.seed),
        "--temperature",
        str(s.temperature),
        "--top-p",
        str(s.top_p),
        "--num-warmups",
        str(s.warmups),
        "--save-result",
        "--save-detailed",
        "--result-dir",
        str(out),
        "--result-filename",
        name,
        "--disable-tqdm",
    ]
    t0 = time.perf_counter()
    with open(log, "ab") as f:
        f.write(("\n$ " + " ".join(cmd) + "\n").encode())
        f.flush()
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=s.timeout_s)
    if proc.returncode != 0 or not (out / name).exists():
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"vllm bench serve failed (exit {proc.returncode}) against {server.url}: {tail}")
    result = json.loads((out / name).read_text())
    if result.get("failed"):
        raise RuntimeError(
            f"vllm bench serve: {result['failed']} of {result.get('completed', 0) + result['failed']}"
            f" requests failed against {server.url} (see {log})"
        )
    result["wall_s"] = time.perf_counter() - t0
    return result
