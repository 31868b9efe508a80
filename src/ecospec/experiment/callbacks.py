"""Hydra callback: at the end of a multirun, one table of every cell in the sweep directory (status, α, E,
speedup; what a traces or predictor job made), read back from the result records (so it works the same for local
and Slurm launchers). A sweep only submitted (cluster=slurm with hydra.launcher.wait=false) has no table yet."""

from __future__ import annotations

import sys
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from ecospec.experiment.records import FAILED, RESULT, now, read_record

LEGEND = {
    "ok*": "ok* = kept: an ok record from an earlier run, not run again",
    "failed*": "failed* = this run failed, the earlier ok record is kept (see failed.json)",
}


def _fmt(x, spec: str) -> str:
    """`spec` applied to a number; a missing value as "—" right-aligned to the same width."""
    return format(x, spec) if x is not None else "—".rjust(int(spec.split(".")[0]))


def sweep_table(sweep_dir: Path, since: str | None = None) -> tuple[str, int]:
    """The table's text and the number of cells whose latest run failed. `since`: when the sweep started (UTC, as
    records write `finished`); an ok record finished before it was kept from an earlier run (marked ok*)."""
    lines = [f"{'cell':<64} {'status':<7} {'alpha':>6} {'E':>7} {'speedup':>8}"]
    failed = 0
    marks = set()
    for path in sorted(Path(sweep_dir).glob(f"*/{RESULT}")):
        rec = read_record(path, parts=False)  # the summary only
        if rec is None:
            lines.append(f"{path.parent.name:<64} {'corrupt':<7}")
            failed += 1
            continue
        status = rec["status"]
        if (path.parent / FAILED).exists():  # a forced rerun failed; the ok record above it was kept
            status = "failed*"
            failed += 1
        elif status == "ok" and since is not None and rec.get("finished", since) < since:
            status = "ok*"
        failed += status == "failed"
        marks.add(status)
        s = rec.get("summary") or {}
        if rec.get("kind") in ("traces", "predictor"):  # the jobs that make a predictor: what they made
            what = (
                f"{s.get('samples', 0)} samples, {s.get('tokens', 0):,} tokens"
                if rec["kind"] == "traces"
                else f"held-out accuracy {s.get('final_accuracy', float('nan')):.3f}"
            )
            lines.append(f"{rec['cell']:<64} {status:<7} {what if s else ''}")
            continue
        x = "x" if s.get("speedup") is not None else " "
        lines.append(
            f"{rec['cell']:<64} {status:<7} {_fmt(s.get('alpha'), '6.2f')} "
            f"{_fmt(s.get('experts_per_layer'), '7.2f')} {_fmt(s.get('speedup'), '7.2f')}{x}"
        )
    legend = "; ".join(text for mark, text in LEGEND.items() if mark in marks)
    lines.append(f"{len(lines) - 1} cells in {sweep_dir}; {failed} failed" + (f" ({legend})" if legend else ""))
    return "\n".join(lines), failed


class SweepTable(Callback):
    def __init__(self) -> None:
        self.started: str | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        self.started = now()

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        if config.get("dry_run") or not config.hydra.launcher.get("wait", True):
            return  # planned only, or submitted and not run: the jobs write their records when Slurm runs them
        text, failed = sweep_table(Path(config.hydra.sweep.dir), since=self.started)
        print(text, flush=True)
        if failed:
            sys.exit(1)
