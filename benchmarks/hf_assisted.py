"""The SD every HF user already has, as the peer to beat: transformers' assisted generation
(`target.generate(assistant_model=draft)`, greedy) against `ecospec.generate` with `DraftModelDrafter` on the
same target / draft pair and prompts, interleaved in one process, same drafting policy: a chain of `--chain`
draft tokens per step (HF: `num_assistant_tokens` constant, `assistant_confidence_threshold=0`; ecospec: depth =
chain, top-1, gamma = chain + 1). Outputs must be identical token for token (all four decoders are greedy).
Second table: both with an adaptive draft stop (HF's confidence threshold 0.4, its default; ecospec's
`draft_stop=0.4`, the same rule: stop drafting once the draft's top token has probability below it).

    python benchmarks/hf_assisted.py [--prompts 8] [--tokens 64] [--chain 3] [--draft-layers 2] [--rounds 2]

Target: the embedded default's (built on first use); draft: its first `--draft-layers` decoder layers with its
embedding, final norm and lm_head (a cut of the target, so it shares the vocabulary). One torch thread.
"""

from __future__ import annotations

import argparse
import copy
import time

import torch

import ecospec
from ecospec.drafters.draft_model import DraftModelDrafter
from ecospec.tiny import load_tiny_target, load_tiny_tokenizer
from ecospec.tiny.evaluate import humaneval_ids


def cut_layers(target, layers: int):
    """A draft LM made of the target's first `layers` decoder layers (+ its embedding, final norm, lm_head)."""
    draft = copy.deepcopy(target)
    draft.model.layers = draft.model.layers[:layers]
    draft.config.num_hidden_layers = layers
    if getattr(draft.config, "layer_types", None):
        draft.config.layer_types = draft.config.layer_types[:layers]
    return draft.eval()


def _hf(target, ids, tokens, draft=None, threshold=0.0, chain=3):
    kwargs = {}
    if draft is not None:
        g = draft.generation_config
        g.num_assistant_tokens, g.num_assistant_tokens_schedule = chain, "constant"
        g.assistant_confidence_threshold = threshold
        kwargs["assistant_model"] = draft
    out = target.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=tokens,
        do_sample=False,
        temperature=None,
        top_p=None,
        top_k=None,
        **kwargs,
    )
    return out[0, ids.shape[1] :].tolist()


def _ours(target, ids, tokens, drafter=None, stop=None, chain=3):
    res = ecospec.generate(
        target, ids, drafter=drafter, gamma=chain + 1, depth=chain, topk=1, max_new_tokens=tokens, draft_stop=stop
    )
    return list(res.tokens)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--chain", type=int, default=3)
    ap.add_argument("--draft-layers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(1)
    target = load_tiny_target()
    draft = cut_layers(target, a.draft_layers)
    prompts = humaneval_ids(load_tiny_tokenizer(), a.prompts)
    drafter = DraftModelDrafter(draft)
    eos = target.generation_config.eos_token_id
    print(
        f"target {target.config.num_hidden_layers} layers, draft {a.draft_layers} layers (cut), chain {a.chain}, "
        f"{a.prompts} HumanEval prompts x {a.tokens} tokens x {a.rounds} rounds, eos {eos}, 1 thread"
    )
    runs = {
        "HF greedy (AR)": lambda ids: _hf(target, ids, a.tokens),
        "ecospec AR": lambda ids: _ours(target, ids, a.tokens),
        "HF assisted, fixed chain": lambda ids: _hf(target, ids, a.tokens, draft, 0.0, a.chain),
        "ecospec SD, fixed chain": lambda ids: _ours(target, ids, a.tokens, drafter, None, a.chain),
        "HF assisted, stop < 0.4": lambda ids: _hf(target, ids, a.tokens, draft, 0.4, a.chain),
        "ecospec SD, stop < 0.4": lambda ids: _ours(target, ids, a.tokens, drafter, 0.4, a.chain),
    }
    seconds = dict.fromkeys(runs, 0.0)
    tokens = dict.fromkeys(runs, 0)
    outputs: dict[str, list] = {name: [] for name in runs}
    for run in runs.values():  # warm-up
        run(prompts[0])
    for _ in range(a.rounds):
        for ids in prompts:  # interleaved: every decoder on this prompt before the next prompt
            for name, run in runs.items():
                t0 = time.perf_counter()
                out = run(ids)
                seconds[name] += time.perf_counter() - t0
                tokens[name] += len(out)
                outputs[name].append(out)
    reference = outputs["HF greedy (AR)"]
    print(f"\n{'decoder':<28}{'tokens/s':>10}{'vs HF':>8}  identical to HF greedy")
    rows = list(runs)
    for i, name in enumerate(rows):
        tps = tokens[name] / seconds[name]
        peer = rows[i - 1] if name.startswith("ecospec") else name
        ratio = tps / (tokens[peer] / seconds[peer])
        same = outputs[name] == reference
        print(f"{name:<28}{tps:>10.1f}{ratio:>7.2f}x  {'yes' if same else 'NO'}")
    if any(outputs[name] != reference for name in runs):
        raise SystemExit("outputs differ from HF greedy decoding")


if __name__ == "__main__":
    main()
