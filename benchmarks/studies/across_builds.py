"""The embedded default's answer across builds: EcoSpec against EAGLE-3 on three draws of the same recipe.

    python benchmarks/studies/across_builds.py [--budgets full full-seed1 full-seed2] [--out DIR]

The release is the full recipe at seed 0; `full-seed1` and `full-seed2` (ecospec.tiny.budgets.BUDGETS) move every
stage's seed, trained into the cache on first use (about 25 minutes each on 2 cores; never released). On each
build, in a fresh process, `make demo`'s job (`python run.py experiment=demo model.budget=<b> force=true`: AR,
EAGLE-3 and EcoSpec interleaved prompt by prompt on 16 held-out prompts x 64 tokens, 4 from each offline
benchmark, at the model's γ, one torch thread, the decoding thread's CPU time), then one table: per build α, E,
both speedups and EcoSpec against EAGLE-3 with its paired 95 % interval; across builds the mean and range of that
ratio and whether its sign holds. Writes across_builds.md and across_builds.json under --out (default: print only),
each naming the commit it ran at.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from provenance import run_commit  # noqa: E402

from ecospec import conf_dir  # noqa: E402
from ecospec.report.compare import change  # noqa: E402
from ecospec.report.demo import build  # noqa: E402
from ecospec.tiny.release import processor  # noqa: E402

GPU = OmegaConf.load(conf_dir() / "experiment" / "demo.yaml").demo.gpu  # the demo's modeled column


def run_demo(budget: str, out_dir: Path) -> dict:
    """One demo on build `budget` in a fresh process; its table's numbers (report.demo), with the build's cache
    identity."""
    name = f"across-{budget}"
    cmd = [
        sys.executable,
        "run.py",
        "experiment=demo",
        f"model.budget={budget}",
        "force=true",
        f"name={name}",
        f"out_dir={out_dir}",
        "progress=false",
    ]
    t0 = time.time()
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, env={**os.environ, "ECOSPEC_TINY": ""})
    (cell_dir,) = [p.parent for p in (out_dir / name).glob("*/demo.md")]  # the demo's cell (run.py wrote its table)
    demo = build(cell_dir, GPU)
    rows = {r.role: asdict(r) for r in demo.rows}
    return {
        "budget": budget,
        "seconds": time.time() - t0,
        "tiny": json.loads((cell_dir / "result.json").read_text())["env"].get("tiny"),
        "prompts": demo.prompts,
        "max_new_tokens": demo.max_new_tokens,
        "gamma": demo.gamma,
        "clock": demo.clock,
        "baseline": rows["baseline"],
        "ecospec": rows["ecospec"],
        "ecospec_vs_baseline": demo.pair,
    }


def table(rows: list[dict]) -> str:
    lines = [
        "| build | α EAGLE-3 | α EcoSpec | E EAGLE-3 | E EcoSpec | speedup EAGLE-3 | speedup EcoSpec | "
        "EcoSpec vs EAGLE-3 [95 %] |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    ratios = []
    for r in rows:
        e, c = r["baseline"], r["ecospec"]
        iv = r.get("ecospec_vs_baseline")
        versus = change(iv["estimate"], iv["low"], iv["high"]) if iv else "(no interval)"
        ratios.append(iv["estimate"] if iv else c["speedup"] / e["speedup"])
        band = lambda m: f"{m['speedup']:.2f}x [{m['interval'][0]:.2f}, {m['interval'][1]:.2f}]"  # noqa: E731
        lines.append(
            f"| {r['budget']} | {e['alpha']:.2f} | {c['alpha']:.2f} | {e['E']:.2f} | {c['E']:.2f} | "
            f"{band(e)} | {band(c)} | {versus.replace(' ≈', ' (within noise)')} |"
        )
    mean = sum(ratios) / len(ratios)
    signs = {x > 1 for x in ratios}
    lines += [
        "",
        f"Across the {len(rows)} builds: EcoSpec against EAGLE-3 {100 * (mean - 1):+.1f} % on average, from "
        f"{100 * (min(ratios) - 1):+.1f} % to {100 * (max(ratios) - 1):+.1f} %; the sign "
        f"{'holds' if len(signs) == 1 else 'does not hold'} across builds.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budgets", nargs="+", default=["full", "full-seed1", "full-seed2"])
    ap.add_argument("--out", type=Path, default=None, help="write across_builds.md / .json here")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        rows = [run_demo(b, Path(tmp)) for b in args.budgets]
    text, commit = table(rows), run_commit()
    head = (
        f"# The embedded default's answer across builds\n\n`python benchmarks/studies/across_builds.py` on "
        f"{processor()}, {os.cpu_count()} cores, one torch thread per demo; {rows[0]['prompts']} held-out prompts "
        f"x {rows[0]['max_new_tokens']} tokens, greedy, γ = {rows[0]['gamma']}, speedups on "
        f"{'the decoding thread' + chr(39) + 's CPU time' if rows[0].get('clock') == 'thread_cpu' else 'wall'}"
        f" (paired bootstrap over prompts). Builds: full = the release (seed 0), full-seed1/2 = the same recipe "
        "with every stage's seed moved (ecospec.tiny.budgets.with_seed), trained on this machine. Commit "
        f"{commit}.\n"
    )
    print(head + "\n" + text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "across_builds.md").write_text(head + "\n" + text + "\n")
        (args.out / "across_builds.json").write_text(
            json.dumps({"commit": commit, "rows": rows}, indent=1, default=str)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
