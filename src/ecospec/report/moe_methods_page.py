"""The MoE methods side by side (`experiment=moe_methods`): per engine and temperature, each method's speedup over
the same engine's AR (interleaved in the job) with its interval, against EAGLE-3's static tree with a paired
interval, α, E, per-position acceptance, T_verify, the share of steps that speculated and the mean block; per engine
the verify-cost profile the cost-model methods priced with and its upper bound; then the issue's goals, checked.

    python -m ecospec.report.moe_methods --records experiments/moe_methods --out reports/tiny   # moe_methods.md

The upper bound is the best speedup the profile allows at the measured acceptance: over a chain of K drafted tokens
(K = 0 .. γ − 1, at the chain's per-position acceptance) and the static tree (at its own), the most expected tokens
per second of a step, 1 + the acceptance summed over the drafted positions, over the profile's step time, against
the profile's AR step.
"""

from __future__ import annotations

import pandas as pd

from ecospec.analysis.profiles import ProfileMissing, load_profile
from ecospec.methods import TREE
from ecospec.report.compare import bracket, cell_interval, change, mean_interval, ratio_interval
from ecospec.report.lineup import adaptive, baseline, lineup
from ecospec.report.lineup import chain as chain_of
from ecospec.report.records import mean_positions
from ecospec.report.write import Page

NAME = "moe_methods"
TITLE = "The MoE methods side by side"
FLOOR = 0.95  # the adaptive methods' goal against AR on every benchmark


def cells(frame: pd.DataFrame) -> pd.DataFrame:
    """The ok records of our engine in experiments that ran one sequence at a time."""
    batched = set(frame.loc[frame["batch_size"].fillna(1) > 1, "experiment"])
    f = frame[(frame["status"] == "ok") & (frame["backend"] != "vllm")]
    return f[~f["experiment"].isin(batched)]


def ran(frame: pd.DataFrame) -> bool:
    """Whether `frame` holds an experiment this page shows: an adaptive method at batch size 1."""
    f = cells(frame)
    return bool(adaptive(f).any())


def from_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """The newest ok record of each (engine, temperature, method, benchmark) in `frame` of the newest experiment
    that ran an adaptive method (`MethodSpec.adaptive`) at batch size 1 alone (`make tables` reads every
    experiment; the table compares one run; `experiment=batch_methods` has its own page)."""
    f = cells(frame)
    runs = f[adaptive(f)].sort_values("finished")
    if runs.empty:
        raise ValueError("no ok records of the moe_methods methods (run python run.py -m experiment=moe_methods)")
    f = f[f["experiment"] == runs["experiment"].iloc[-1]]
    f = f.sort_values("finished").drop_duplicates(["engine", "temperature", "method", "dataset"], keep="last")
    return f.reset_index(drop=True)


def _exact(g: pd.DataFrame) -> str:
    """Prompts whose greedy output equals AR's (T = 0), over the benchmarks."""
    m = g["matches_ar"]
    if m.isna().all():
        return "—"
    total = int(g["num_prompts"].sum())
    return f"{round(float((m * g['num_prompts']).sum()))}/{total}"


def group_table(df: pd.DataFrame, engine: str, temperature: float) -> tuple[pd.DataFrame, dict]:
    """One (engine, temperature) table as printed and its numbers for the goals."""
    sub = df[(df["engine"] == engine) & (df["temperature"] == temperature)]
    per = sub.groupby("method")["dataset"].apply(set)
    common = sorted(set.intersection(*per.tolist())) if len(per) else []
    by = {m: g.set_index("dataset").loc[common] for m, g in sub[sub["dataset"].isin(common)].groupby("method")}
    entries = lineup(df)
    first = baseline(entries)
    head = [
        "Method",
        "Speedup",
        *common,
        f"vs {entries[first].label}" if first else "vs the baseline",
        "α",
        "E",
        "acceptance by position",
        "T_verify ms",
        "speculating",
        "mean block",
        "token-exact",
    ]
    rows = []
    facts: dict = {"common": common, "speedup": {}, "bench": {}, "vs": {}, "exact": {}, "cells": by, "entries": entries}
    base = by.get(first)
    for m in entries:
        g = by.get(m)
        if g is None:
            continue
        cells = [r for _, r in g.iterrows()]
        iv = mean_interval(cells, "speedup")
        facts["speedup"][m] = (float(g.speedup.mean()), iv)
        facts["bench"][m] = {d: (float(r.speedup), cell_interval(r)) for d, r in g.iterrows()}
        facts["exact"][m] = bool((g["matches_ar"].fillna(-1) == 1).all()) if temperature == 0 else None
        vs = ""
        if base is not None and m != first:
            r = ratio_interval([(g.loc[d], base.loc[d]) for d in common], "speedup")
            facts["vs"][m] = r
            vs = change(r["estimate"], r["low"], r["high"]) if r else change(g.speedup.mean() / base.speedup.mean())
        pos = "/".join(f"{a:.2f}" for a in mean_positions(g["acceptance_by_position"]))
        bench = [f"{r.speedup:.2f}×{bracket(cell_interval(r))}" for _, r in g.iterrows()]
        rows.append(
            [
                entries[m].label,
                f"{g.speedup.mean():.2f}×{bracket(iv)}",
                *bench,
                vs,
                f"{g.alpha.mean():.2f}",
                f"{g.E.mean():.1f}",
                pos,
                f"{1e3 * g.t_verify_s.mean():.2f}",
                f"{g.speculating.mean():.0%}",
                f"{g.mean_block.mean():.2f}",
                _exact(g),
            ]
        )
    facts["positions"] = {m: mean_positions(g["acceptance_by_position"]) for m, g in by.items()}
    return pd.DataFrame(rows, columns=head), facts


def upper_bound(profile, chain: list[float], tree: list[float], gamma: int, tree_depth: int = 3) -> tuple[float, str]:
    """(the best speedup of a speculative step the profile allows at this acceptance, its shape): chains of K = 1
    .. γ − 1 drafted tokens at the chain's per-position acceptance, the static tree (γ − 1 nodes, `tree_depth`
    levels) at the tree's. Below 1, AR (K = 0) is the bound."""
    ar = profile.ar_step_s
    shapes = {}
    for k in range(1, min(gamma - 1, len(chain)) + 1):
        t = profile.t_step(k * profile.draft_pass_s.get("chain", 0.0), k + 1)
        shapes[f"chain K={k}"] = (1 + sum(chain[:k])) * ar / t
    if tree:
        t = profile.t_step(tree_depth * profile.draft_pass_s.get("tree", 0.0), gamma)
        shapes["tree"] = (1 + sum(tree[:tree_depth])) * ar / t
    return max(shapes.items(), key=lambda kv: kv[1])[::-1] if shapes else (1.0, "AR")


def _profile_lines(profile, digest: str, current: str | None) -> list[str]:
    p = profile
    sizes = sorted((p.verify_by_tokens or {}), key=int)
    verify = ", ".join(f"{q}: {1e3 * p.t_verify(int(q), p.experts(int(q))):.2f}" for q in sizes)
    note = "" if current is None or current == digest else f" (the cells used {current}; remeasured since)"
    return [
        f"Profile `{p.key}` (hash {digest}{note}): AR step {1e3 * p.ar_step_s:.3f} ms; verify pass by block size at "
        f"its expected experts (ms) {verify}; {1e3 * p.per_expert_layer_s:.4f} ms per unique expert per layer x "
        f"{p.layers} layers; head pass tree {1e3 * p.draft_pass_s.get('tree', 0):.3f} ms, chain "
        f"{1e3 * p.draft_pass_s.get('chain', 0):.3f} ms; predictor {1e3 * (p.predictor_pass_s or 0):.3f} ms; "
        f"unique experts per layer by block size "
        + ", ".join(f"{t}: {e:.1f}" for t, e in sorted(p.experts_by_tokens.items(), key=lambda x: int(x[0])))
        + "."
    ]


def _profiles(df: pd.DataFrame) -> dict:
    """engine -> (profile, its hash now, the hash the cells used) from the records' `profile` keys."""
    out = {}
    for engine, g in df.groupby("engine"):
        refs = [r for r in g["profile"] if isinstance(r, dict)]
        if not refs:
            continue
        ref = refs[-1]
        model, hardware, dtype = g["model"].iloc[0], g["hardware"].iloc[0], "float32"
        try:
            prof, digest = load_profile(model, engine, dtype, hardware)
        except ProfileMissing:
            continue
        out[engine] = (prof, digest, ref.get("hash"))
    return out


def goals(facts: dict) -> list[str]:
    """The issue's goals, each with what the run measured."""
    out = []
    label = {m: e.label for f in facts.values() for m, e in f["entries"].items()}
    kinds = {m: e for f in facts.values() for m, e in f["entries"].items()}
    adapting = [m for m, e in kinds.items() if e.adaptive]
    static = [m for m, e in kinds.items() if not e.adaptive and e.spec.drafts == TREE]
    exact = [f"{e} {label[m]}" for (e, t), f in facts.items() for m, ok in f["exact"].items() if ok is False]
    n_exact = sum(ok is True for f in facts.values() for ok in f["exact"].values())
    out.append(
        f"- Every method token-exact against AR at T = 0 on every prompt: {'yes' if not exact else 'NO'} "
        f"({n_exact} method-engine groups checked" + (f"; not exact: {', '.join(exact)}" if exact else "") + ")."
    )
    for (engine, t), f in sorted(facts.items()):
        low = [f"{label[m]} {d} {s:.2f}×" for m in adapting for d, (s, _) in f["bench"].get(m, {}).items() if s < FLOOR]
        out.append(
            f"- {engine}, T = {t:g}: {', '.join(label[m] for m in adapting)} ≥ {FLOOR:.2f}× AR on every benchmark: "
            + ("yes" if not low else "no: " + ", ".join(low))
            + "."
        )
    f = facts.get(("eager", 0.0))
    if f:
        best = max((m for m in static if m in f["speedup"]), key=lambda m: f["speedup"][m][0], default=None)
        for m in adapting:
            if m in f["speedup"] and best:
                out.append(
                    f"- eager, T = 0: {label[m]} not slower than the best static method "
                    f"({label[best]}): {_not_slower(f, m, best)}."
                )
    f = facts.get(("compiled", 0.0))
    if f:
        above = [m for m, (s, iv) in f["speedup"].items() if iv and iv[0] > 1.0]
        out.append(
            "- compiled, T = 0: a method above 1.00× AR with its interval above 1: "
            + (", ".join(label[m] for m in above) if above else "none (see the profile's upper bound)")
            + "."
        )
    for (engine, t), f in sorted(facts.items()):
        for m, e in f["entries"].items():
            named = [r for r in e.spec.rivals if any(x.spec.name == r for x in f["entries"].values())]
            rivals = [n for r in named for n, x in f["entries"].items() if x.spec.name == r and n in f["speedup"]]
            best = max(rivals, key=lambda n: f["speedup"][n][0], default=None)
            if m in f["speedup"] and best:
                out.append(
                    f"- {engine}, T = {t:g}: {label[m]} not slower than the better of "
                    f"{' and '.join(label[n] for n in rivals)} ({label[best]}): {_not_slower(f, m, best)}."
                )
    return out


def _not_slower(f: dict, a: str, b: str) -> str:
    """Whether `a` is not slower than `b`: the paired ratio of their speedups over the four-benchmark average, on
    the prompts both decoded, has an interval reaching 1.00."""
    sa, sb = f["speedup"][a][0], f["speedup"][b][0]
    ga, gb = f["cells"][a], f["cells"][b]
    r = ratio_interval([(ga.loc[d], gb.loc[d]) for d in f["common"]], "speedup")
    if r is None:
        return f"{'yes' if sa >= sb else 'no'} ({sa:.2f}× against {sb:.2f}×, no interval)"
    ratio = change(r["estimate"], r["low"], r["high"])
    return f"{'yes' if r['high'] >= 1.0 else 'no'} ({sa:.2f}× against {sb:.2f}×: {ratio})"


def page(df: pd.DataFrame, gamma: int = 6) -> Page:
    """The whole page (module docstring), from `from_frame`'s cells."""
    profiles = _profiles(df)
    blocks: list = []
    facts = {}
    for engine in ("eager", "compiled"):
        for t in sorted(df.loc[df["engine"] == engine, "temperature"].unique()):
            table, f = group_table(df, engine, float(t))
            facts[(engine, float(t))] = f
            n = int(df[(df["engine"] == engine) & (df["temperature"] == t)]["num_prompts"].max())
            blocks += [f"## {engine} engine, T = {t:g} ({n} prompts per benchmark)", table]
        if engine in profiles:
            prof, digest, used = profiles[engine]
            blocks += _profile_lines(prof, digest, used)
            f0 = facts.get((engine, 0.0))
            if f0:
                positions = f0["positions"]
                tree = positions.get(baseline(f0["entries"]), [])
                chain = positions.get(chain_of(f0["entries"]), [])
                bound, shape = upper_bound(prof, chain, tree, gamma)
                lines = [
                    f"Upper bound at T = 0 (the profile at the measured acceptance): "
                    f"{max(bound, 1.0):.2f}× AR; the best speculative step: {bound:.2f}× ({shape}).",
                ]
                if bound < 1.0 and chain:
                    need = (1 + chain[0]) * prof.ar_step_s
                    have = prof.t_step(prof.draft_pass_s.get("chain", 0.0), 2)
                    lines.append(
                        f"What would have to change: a chain of one token pays when its step costs under "
                        f"(1 + {chain[0]:.2f}) x the AR step = {1e3 * need:.2f} ms; it costs "
                        f"{1e3 * have:.2f} ms (head pass {1e3 * prof.draft_pass_s.get('chain', 0.0):.2f}, a "
                        f"2-token verify {1e3 * prof.t_verify(2, prof.experts(2)):.2f} against "
                        f"{1e3 * prof.t_verify(1, prof.experts(1)):.2f} for one)."
                    )
                blocks.append("\n".join(lines))
    blocks += ["## Goals", "\n".join(goals(facts))]
    return Page(NAME, "MoE methods", TITLE, blocks, df)
