"""Several methods in one job, interleaved prompt by prompt (`interleave=[eagle3,oracle]` beside the cell's own
method): each prompt is decoded by the cell's method, then by each listed method, then by AR, so a machine that
slows down slows them all alike and a method-against-method ratio is a ratio of one run (paired; `make demo`
is one such job).

Each listed method gets the record it would have had run alone, in its own cell directory (the same cell id: the
knob is no part of any cell's identity), and every record of the group carries `summary.intervals.run`, the
run's id, by which the reports know two cells were measured together (`report.compare`: paired; otherwise weakly
paired). A listed method whose ok record exists is not rerun (force=true reruns it), so nothing is overwritten.
Batch 1, our engine, no expert budget: where the methods share everything but their drafter, selector and
predictor (`config.validate_interleave`). Here: the listed methods' components, loaded beside the cell's; the cell
(`experiment.cell`) decodes them and writes the group's records.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ecospec.experiment.components import CellComponents, load_components
from ecospec.experiment.config import companion, interleave_methods, job_name
from ecospec.experiment.job import kept


def companions(
    d: dict, cell_dir: Path, device: torch.device, comp: CellComponents, record: dict
) -> list[tuple[dict, CellComponents, Path]]:
    """(config, components, cell directory) of each listed method to decode beside the cell's own, sharing its
    target; a listed method whose ok record stands is kept, not rerun (`record["_kept"]` names them)."""
    out = []
    for name in interleave_methods(d):
        cd = companion(d, name)
        cdir = cell_dir.parent / job_name(cd)
        if kept(cdir, cd) is not None:
            record.setdefault("_kept", []).append(name)
            continue
        out.append((cd, load_components(cd, device, loaded=comp), cdir))
    return out
