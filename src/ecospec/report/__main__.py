"""`python -m ecospec.report [--records DIR ...] [--out DIR] [--since WHEN] [--logger cells|none|wandb]` (`make
tables`; the logger: report/dashboard.py);
`python -m ecospec.report --out DIR --relist` rewrites only the last list of DIR's index, the files beside its tables
(report/outputs.py's BESIDE), after a page or a study wrote into DIR."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

from ecospec.report import build
from ecospec.report.dashboard import LOGGERS
from ecospec.report.outputs import BESIDE
from ecospec.report.write import relist


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m ecospec.report",
        description="The EcoSpec paper's tables (md, tex, csv) with the paper's values beside ours, modeled GPU "
        "numbers, the figures and an index README.md, from result records.",
    )
    ap.add_argument(
        "--records",
        nargs="+",
        default=["experiments"],
        metavar="DIR",
        help="sweep directories (or result.json files) to read; default experiments/",
    )
    ap.add_argument("--out", default="reports", metavar="DIR", help="where the reports go; default reports/")
    ap.add_argument(
        "--since", metavar="WHEN", help="only records finished at or after this ISO date/time (UTC default)"
    )
    ap.add_argument(
        "--relist",
        action="store_true",
        help="rewrite only the index's list of the other files in --out (after a page or a study wrote one there), "
        "reading no records",
    )
    ap.add_argument(
        "--logger",
        choices=LOGGERS,
        default="cells",
        help="also log the tables and figures as one W&B run (job_type tables): cells (default) where the records' "
        "cells logged to W&B, in their project; wandb always; none never",
    )
    args = ap.parse_args(argv)
    if args.relist:
        print(relist(Path(args.out), BESIDE))
        return 0
    if args.since is not None:
        try:
            pd.Timestamp(args.since)
        except ValueError:
            ap.error(f"--since {args.since!r}: not an ISO date/time, e.g. 2026-05-01 or 2026-05-01T12:00")
    for d in args.records:
        if not Path(d).exists():
            print(f"no records at {d} (run a sweep first: python run.py -m ...)", file=sys.stderr)
    t0 = time.perf_counter()
    written = build(args.records, args.out, args.since, args.logger)
    for path in written:
        print(path)
    print(f"wrote {len(written)} files in {time.perf_counter() - t0:.1f} s (index: {args.out}/README.md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
