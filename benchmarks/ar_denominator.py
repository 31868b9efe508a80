"""The speedup's denominator: ecospec AR (our own loop, `ecospec.generate(drafter=None)`) against transformers' greedy
`generate` on the same model object and prompts, interleaved prompt by prompt in one process, outputs checked equal;
with `--profile`, where each spends its aten ops per new token (inside the target's forward / outside it).

    python benchmarks/ar_denominator.py [--models tiny,qwen3_moe-a,gpt_oss-a,deepseek_v3-a,mixtral-a]
                                        [--prompts 8] [--tokens 64] [--rounds 2] [--profile]

`tiny` is the embedded default (built on first use; HumanEval prompts); the others are tiny random models of each
family (`ecospec.models.tiny_model`, float32, random prompts, eos off so every output has `--tokens` tokens). One
torch thread. Goal: ecospec AR >= 1.00x HF generate on every model.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import ecospec
from ecospec.experiment.hf_peer import hf_generate


def load(name: str, prompts: int):
    """(target, prompts [1, n] each) of a benchmark model."""
    if name == "tiny":
        from ecospec.tiny import load_tiny_target, load_tiny_tokenizer
        from ecospec.tiny.evaluate import humaneval_ids

        return load_tiny_target(), humaneval_ids(load_tiny_tokenizer(), prompts)
    from ecospec.models.loading import tiny_model

    target = tiny_model(name, seed=0)
    target.generation_config.eos_token_id = None  # random weights: run every output to full length
    gen = torch.Generator().manual_seed(1)
    return target, [torch.randint(3, target.config.vocab_size, (1, 48), generator=gen) for _ in range(prompts)]


class OpCount(TorchDispatchMode):
    """Counts aten ops, split by whether they run inside `model`'s forward (forward hooks keep a depth count)."""

    def __init__(self, model):
        super().__init__()
        self.counts, self.depth = Counter(), 0
        self._hooks = [
            model.register_forward_pre_hook(lambda *a: setattr(self, "depth", self.depth + 1)),
            model.register_forward_hook(lambda *a: setattr(self, "depth", self.depth - 1)),
        ]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts["inside" if self.depth else "outside"] += 1
        return func(*args, **(kwargs or {}))

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()


def compare(target, prompts: list[torch.Tensor], tokens: int, rounds: int, profile: bool = False) -> dict:
    """HF generate and ecospec AR on `prompts`, interleaved: tokens/s of each, their ratio, whether every output is
    equal; with `profile`, aten ops per new token inside / outside the target's forward."""
    runs = {
        "HF generate": lambda ids: hf_generate(target, ids, 0.0, 1.0, tokens, 0)[:2],  # (tokens, wall seconds)
        "ecospec AR": lambda ids: _timed(lambda: ecospec.generate(target, ids, max_new_tokens=tokens).tokens),
    }
    for run in runs.values():  # warm-up
        run(prompts[0])
    seconds, count, same = dict.fromkeys(runs, 0.0), dict.fromkeys(runs, 0), True
    for _ in range(rounds):
        for ids in prompts:  # interleaved: both decoders on this prompt before the next one
            outs = {}
            for label, run in runs.items():
                outs[label], dt = run(ids)
                seconds[label] += dt
                count[label] += len(outs[label])
            same &= outs["HF generate"] == outs["ecospec AR"]
    out = {"same": same, **{f"{k} tok/s": count[k] / seconds[k] for k in runs}}
    out["ratio"] = out["ecospec AR tok/s"] / out["HF generate tok/s"]
    if profile:
        for label, run in runs.items():
            counter = OpCount(target)
            with counter:
                n = sum(len(run(ids)[0]) for ids in prompts[:2])
            counter.remove()
            out[f"{label} ops"] = {k: v / n for k, v in counter.counts.items()}
    return out


def _timed(run) -> tuple[list[int], float]:
    t0 = time.perf_counter()
    out = list(run())
    return out, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="tiny,qwen3_moe-a,gpt_oss-a,deepseek_v3-a,mixtral-a")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--profile", action="store_true", help="also count aten ops per new token, inside/outside")
    a = ap.parse_args()
    torch.set_num_threads(1)
    print(f"{a.prompts} prompts x {a.tokens} tokens x {a.rounds} rounds, greedy, 1 thread, interleaved per prompt")
    head = f"{'model':<16}{'HF generate tok/s':>19}{'ecospec AR tok/s':>18}{'ratio':>8}  outputs equal"
    print(head)
    results = [{"model": m, **compare(*load(m, a.prompts), a.tokens, a.rounds, a.profile)} for m in a.models.split(",")]
    for r in results:
        print(
            f"{r['model']:<16}{r['HF generate tok/s']:>19.1f}{r['ecospec AR tok/s']:>18.1f}{r['ratio']:>7.2f}x  "
            f"{'yes' if r['same'] else 'NO'}"
        )
    if a.profile:
        print("\naten ops per new token (inside the target's forward / outside it: the decoder's own work)")
        for r in results:
            cells = [
                f"{k.removesuffix(' ops')}: {v.get('inside', 0):.0f} / {v.get('outside', 0):.1f}"
                for k, v in r.items()
                if k.endswith(" ops")
            ]
            print(f"{r['model']:<16}" + "   ".join(cells))
    if not all(r["same"] for r in results):
        raise SystemExit("ecospec AR and HF generate disagree on some prompt")


if __name__ == "__main__":
    main()
