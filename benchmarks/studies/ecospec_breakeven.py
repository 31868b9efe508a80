"""When does EcoSpec pay in wall clock on the embedded default? Its selection saves experts in the verify pass
and its predictor costs time every step; this measures both on the same prompts, interleaved, one thread.

Per SD step (EAGLE-3 = confidence selection; EcoSpec with the learned predictor; the oracle = EcoSpec's rule on
the target router's true expert sets, its extra target pass not counted): alpha, E (unique experts per MoE layer
of the verify pass), T_pred, T_verify and the time the target spends inside its experts modules per verify pass.
From those: the cost of one expert in one layer (expert time / (E x layers)), the E saving the predictor's cost
buys back (break-even: T_pred / (layers x that cost)), and the saving that would put EcoSpec 3 % ahead of
EAGLE-3 at equal alpha.

    python benchmarks/studies/ecospec_breakeven.py [--prompts 8] [--tokens 64] [--datasets gsm8k,humaneval,...]

Eager engine only: it times the experts modules inside the eager target's verify passes (`EagerTarget.verify`);
the compiled engine's experts run inside one graph, which no hook can split, so it decodes with engine="eager" and
refuses to report when no verify pass reached the hooks. It prints its result, with the commit it ran at.
"""

from __future__ import annotations

import argparse
import time

import torch
from provenance import run_commit

import ecospec
from ecospec.components import load_build
from ecospec.engine import targets
from ecospec.tiny.build import paths
from ecospec.tiny.evaluate import heldout_ids

METHODS = (("eagle3", "confidence", None), ("ecospec", "ecospec", "learned"), ("oracle", "oracle", "oracle"))


class ExpertClock:
    """Seconds spent inside every MoE layer's experts module (forward hooks) during the eager target's verify
    passes (`EagerTarget.verify`: not the prefill, not the oracle's extra look-up pass)."""

    def __init__(self, target):
        self.verify_seconds = 0.0
        self._inside = 0.0
        self._start: list[float] = []
        for layer in target.model.layers:
            layer.mlp.experts.register_forward_pre_hook(lambda m, a: self._start.append(time.perf_counter()))
            layer.mlp.experts.register_forward_hook(self._stop)
        inner = targets.EagerTarget.verify

        def verify(tgt, *args, **kwargs):
            before = self._inside
            out = inner(tgt, *args, **kwargs)
            self.verify_seconds += self._inside - before
            return out

        targets.EagerTarget.verify = verify

    def _stop(self, module, args, out) -> None:
        self._inside += time.perf_counter() - self._start.pop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--datasets", default="gsm8k,humaneval,math500,mtbench")
    args = parser.parse_args()
    torch.set_num_threads(1)
    target, tokenizer, drafter, predictor = load_build(paths("full"))
    layers = len(target.model.layers)
    clock = ExpertClock(target)
    stats = {
        name: {"steps": 0, "acc": 0, "e": 0.0, "pred": 0.0, "verify": 0.0, "experts": 0.0, "total": 0.0}
        for name, _, _ in METHODS
    }
    for ids_list in heldout_ids(tokenizer, args.datasets.split(","), args.prompts).values():
        for ids in ids_list:
            for name, selector, kind in METHODS:
                pred = {"learned": predictor, "oracle": "oracle", None: None}[kind]
                clock.verify_seconds = 0.0
                res = ecospec.generate(
                    target,
                    ids,
                    drafter=drafter,
                    selector=selector,
                    predictor=pred,
                    gamma=4,
                    depth=3,
                    topk=2,
                    max_new_tokens=args.tokens,
                    engine="eager",
                )
                s = stats[name]
                steps = res.steps
                s["steps"] += len(steps)
                s["acc"] += sum(x.accepted for x in steps)
                s["e"] += sum(sum(x.experts) / len(x.experts) for x in steps)
                s["verify"] += sum(x.t_verify for x in steps)
                s["pred"] += 0.0 if kind == "oracle" else sum(x.t_pred for x in steps)
                s["total"] += sum(x.t_total - (x.t_pred if kind == "oracle" else 0.0) for x in steps)
                s["experts"] += clock.verify_seconds
    if not stats["eagle3"]["experts"]:
        raise SystemExit("ecospec_breakeven is eager-only: no verify pass went through EagerTarget.verify's hooks")
    print(
        f"{args.prompts} held-out prompts x {args.tokens} tokens of {args.datasets}, greedy, depth 3, top-2, "
        f"gamma 4, 1 thread, methods interleaved per prompt; commit {run_commit()}"
    )
    print(f"{'method':<8} {'alpha':>6} {'E':>6} {'T_step':>8} {'T_verify':>9} {'experts':>8} {'T_pred':>7}  (ms)")
    per = {}
    for name, s in stats.items():
        n = s["steps"]
        per[name] = {k: s[k] / n for k in ("acc", "e", "pred", "verify", "experts", "total")}
        x = per[name]
        print(
            f"{name:<8} {x['acc']:>6.2f} {x['e']:>6.2f} {1e3 * x['total']:>8.2f} {1e3 * x['verify']:>9.2f} "
            f"{1e3 * x['experts']:>8.2f} {1e3 * x['pred']:>7.2f}"
        )
    base, eco = per["eagle3"], per["ecospec"]
    cost = base["experts"] / (base["e"] * layers)  # seconds per expert per layer in a verify pass
    breakeven = eco["pred"] / (layers * cost)
    ahead = breakeven + 0.03 * base["total"] / (layers * cost)
    print(f"one expert in one layer costs {1e6 * cost:.0f} us in a verify pass ({layers} MoE layers)")
    print(
        f"E saving that pays for T_pred (break-even): {breakeven:.2f} experts per layer; for EcoSpec 3 % ahead of "
        f"EAGLE-3 at equal alpha: {ahead:.2f}"
    )
    for name in ("ecospec", "oracle"):
        x = per[name]
        tput = (x["acc"] / x["total"]) / (base["acc"] / base["total"])
        print(
            f"measured E saving, {name}: {base['e'] - x['e']:.2f} per layer (E x{x['e'] / base['e']:.3f}, alpha "
            f"x{x['acc'] / base['acc']:.3f}); tokens per step-second vs EAGLE-3 x{tput:.3f}"
        )


if __name__ == "__main__":
    main()
