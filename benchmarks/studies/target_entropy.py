"""How flat is the embedded default's target at T = 1, and what does that leave speculative decoding?

    python benchmarks/studies/target_entropy.py [--prompts 4] [--tokens 64] [--seed 0] [--out reports/tiny]

A draft token at T > 0 is accepted with the target's probability of it (`engine.acceptance.accept_sampling`:
deterministic top-k drafts, q = 1), so a step's first drafted token is accepted at most as often as the target's
top-1 (a top-2 level: its top-1 + top-2) probability. This measures that probability, the entropy and the loss of
the release's target over three texts: the build's held-out corpus windows (the stdlib the corpus keeps out of
training: the figure the manifest calls held-out loss), the held-out HumanEval prompts (Python source from outside
its corpus), and the target's own T = 1 samples from the first held-out prompts of the four offline benchmarks (the
states a T = 1 cell verifies at). Writes target_entropy.md and target_entropy.json under --out (default: print only),
each naming the commit it ran at.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from provenance import run_commit

from ecospec.tiny.budgets import get_budget
from ecospec.tiny.build import load_tiny_target, load_tiny_tokenizer, paths
from ecospec.tiny.evaluate import heldout_ids
from ecospec.tiny.target import eval_batches

DATASETS = ("gsm8k", "humaneval", "math500", "mtbench")


@dataclass
class Flatness:
    """Means over the predicted positions of one text (nats; nll only where the next token is the text's own)."""

    text: str
    positions: int
    nll: float | None
    top1: float
    top2: float
    entropy: float


class Sums:
    """Running sums of the per-position figures of one text."""

    def __init__(self) -> None:
        self.n, self.nll, self.top1, self.top2, self.entropy = 0, 0.0, 0.0, 0.0, 0.0

    def add(self, logits: torch.Tensor, targets: torch.Tensor | None = None) -> None:
        """`logits` [positions, V]; `targets` [positions]: the tokens that followed (None: sampled text)."""
        logp = torch.log_softmax(logits.double(), dim=-1)
        p = logp.exp()
        top = p.topk(2, dim=-1).values
        self.n += len(logits)
        self.top1 += float(top[:, 0].sum())
        self.top2 += float(top.sum())
        self.entropy += float(-(p * logp).sum())
        if targets is not None:
            self.nll += float(-logp.gather(-1, targets[:, None]).sum())

    def result(self, text: str, with_nll: bool = True) -> Flatness:
        n = self.n
        return Flatness(text, n, self.nll / n if with_nll else None, self.top1 / n, self.top2 / n, self.entropy / n)


@torch.inference_mode()
def on_text(model, windows: list[torch.Tensor], text: str) -> Flatness:
    """Each window [1 or B, T] scored at its own next tokens."""
    s = Sums()
    for x in windows:
        logits = model(input_ids=x).logits[:, :-1]
        s.add(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
    return s.result(text)


@torch.inference_mode()
def on_samples(model, prompts: list[torch.Tensor], tokens: int, seed: int, text: str) -> Flatness:
    """The target's own T = 1 continuations of `prompts`, scored at every state they pass through."""
    s, gen = Sums(), torch.Generator().manual_seed(seed)
    for ids in prompts:
        out = model(input_ids=ids, use_cache=True)
        for _ in range(tokens):
            logits = out.logits[:, -1]
            s.add(logits)
            nxt = torch.multinomial(torch.softmax(logits.double(), -1), 1, generator=gen)
            out = model(input_ids=nxt, cache=out.cache, use_cache=True)
    return s.result(text, with_nll=False)


def table(rows: list[Flatness], vocab: int) -> list[str]:
    lines = [
        "| text | positions | loss (nats/token) | mean top-1 probability | mean top-1 + top-2 "
        "probability | mean entropy (nats) |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        nll = "—" if r.nll is None else f"{r.nll:.3f}"
        lines.append(f"| {r.text} | {r.positions} | {nll} | {r.top1:.3f} | {r.top2:.3f} | {r.entropy:.2f} |")
    lines += ["", f"A uniform distribution over the {vocab} tokens: entropy log V = {math.log(vocab):.3f} nats."]
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=4, help="held-out prompts per benchmark (as make demo)")
    ap.add_argument("--humaneval", type=int, default=8, help="held-out HumanEval prompts scored as text")
    ap.add_argument("--tokens", type=int, default=64, help="T = 1 tokens sampled per prompt")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    torch.set_num_threads(1)
    model, tokenizer = load_tiny_target(progress=False), load_tiny_tokenizer(progress=False)
    recipe = get_budget("full").target
    val = np.load(paths()["corpus"] / "val.npy")
    corpus = eval_batches(val, recipe.seq_len, recipe.eval_tokens)
    code = heldout_ids(tokenizer, ("humaneval",), a.humaneval)["humaneval"]
    prompts = [x for v in heldout_ids(tokenizer, DATASETS, a.prompts).values() for x in v]
    rows = [
        on_text(model, corpus, "held-out corpus (the build's held-out windows)"),
        on_text(model, code, f"HumanEval prompts ({len(code)} held-out; Python source outside the corpus)"),
        on_samples(model, prompts, a.tokens, a.seed, f"T = 1 samples ({len(prompts)} prompts x {a.tokens} tokens)"),
    ]
    cmd = "python benchmarks/studies/target_entropy.py " + " ".join(sys.argv[1:])
    lines = [
        "### How flat the embedded default's target is at T = 1",
        "",
        "The release's target, one thread. A drafted token at T > 0 is accepted with the target's probability of it,",
        "so a step's first drafted token is accepted at most as often as the top-1 probability (a top-2 tree level:",
        "top-1 + top-2). T = 1 samples: the target's own continuations of the first "
        f"{a.prompts} held-out prompts of {', '.join(DATASETS)} (seed {a.seed}).",
        "",
        *table(rows, model.config.vocab_size),
        "",
        f"`{cmd.strip()}` at commit {run_commit()}.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out is not None:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "target_entropy.md").write_text(text)
        result = {"commit": run_commit(), "args": vars(a) | {"out": str(a.out)}, "rows": [asdict(r) for r in rows]}
        (a.out / "target_entropy.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
