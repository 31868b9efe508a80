"""A report build on the W&B dashboard, beside the cells' runs: one run per build (`job_type` "tables") in the
cells' project, holding each table (its CSV) as a W&B table and each figure (its PNG) as an image.

    python -m ecospec.report                    # W&B when the cells logged to it (their logger setting)
    python -m ecospec.report --logger none      # never; --logger wandb: always (the cells' project, else ecospec)

The files stay the report; the run mirrors them for browsing, as a cell's run mirrors its record. Online with a
key, offline without one, as the cells are (`experiment.tracking`); offline runs land under the first records
directory's `wandb/`, where `make sync` finds the cells' runs too. wandb is imported only when a run is made, so a
build that logs nothing pays nothing for it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

LOGGERS = ("cells", "none", "wandb")  # --logger: the records' own setting, never, always
KINDS = {"tables": ".csv", "figures": ".png"}  # what a run holds of a build's files


def table_key(path: Path, out: Path) -> str:
    """A file's key in the run: its path under the report directory, without its suffix (`figures/fig3`)."""
    return path.relative_to(out).with_suffix("").as_posix()


def chosen_logger(choice: str, cells: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The logger setting a build logs with (`LOGGERS`), or None: `cells` takes the records' W&B setting when
    they had one."""
    if choice not in LOGGERS:
        raise ValueError(f"--logger {choice!r}: allowed: {', '.join(LOGGERS)}")
    if choice == "none" or (choice == "cells" and not cells):
        return None
    return dict(cells or {}, name="wandb")


def log_tables(written: list[Path], out: Path, logger_cfg: Mapping[str, Any], wandb_dir: Path) -> str | None:
    """One W&B run of this build's tables (`.csv`) and figures (`.png`) among `written`; returns its local
    directory, or None where W&B is disabled or failed (warned, never raised: the files are written already)."""
    import pandas as pd
    import wandb

    from ecospec.experiment.tracking import start_run

    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S-%f")
    try:
        run = start_run(
            logger_cfg,
            wandb_dir,
            id=f"tables-{stamp}",
            name=f"tables {out.name} {stamp[:15]}",
            group="tables",
            job_type="tables",
            tags=["tables"],
            config={"out": str(out), "files": len(written)},
        )
        media: dict[str, Any] = {}
        for path in written:
            if path.suffix == KINDS["tables"]:
                media[table_key(path, out)] = wandb.Table(dataframe=pd.read_csv(path))
            elif path.suffix == KINDS["figures"]:
                media[table_key(path, out)] = wandb.Image(str(path))
        directory = None if run.disabled else str(run.settings.sync_dir)
        try:
            if media:
                run.log(media)
            run.summary.update({kind: sum(p.suffix == suffix for p in written) for kind, suffix in KINDS.items()})
        finally:
            run.finish()
        return directory
    except Exception as err:  # W&B only mirrors the files: the build must not fail because of it
        log.warning("W&B logging of the tables in %s failed: %s", out, err)
        return None
