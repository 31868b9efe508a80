"""`make tables` at scale: 10,000 synthetic result records written by the cells' own writer
(`experiment.job.write_record`), each ok record with a row per prompt (its generated tokens), the AR baseline's
rows, its expert load and, where a real cell of its kind has them, verify-pass traces; then the whole report
(every table, the modeled numbers, the figures and the index) built by `python -m ecospec.report` in a fresh
interpreter, imports included. Nothing is precomputed or indexed in the untimed step: the records are files as
run.py leaves them. Prints the wall-clock and CPU seconds (the build's, its figure processes included); exits
non-zero when the CPU time reaches the 10 s goal (wall time depends on the machine's other load).

    python benchmarks/report_bench.py [--records 10000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL_CPU_S = 10.0


def write_records(root: Path, n: int) -> None:
    """One `<experiment>/<cell>/` per synthetic record, written as a cell writes its record."""
    from ecospec.experiment.job import write_record
    from ecospec.report.synthetic import iter_records

    for rec in iter_records(n, seed=0, full_rows=True):
        cell = root / rec["experiment"] / rec["cell"]
        cell.mkdir(parents=True, exist_ok=True)
        write_record(cell, rec)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=10_000)
    ap.add_argument("--keep", type=Path, help="write the records and reports here and keep them (reuses records)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ecospec-report-bench-") as tmp:
        root = args.keep or Path(tmp)
        t0 = time.perf_counter()
        if not (root / "experiments").exists():
            write_records(root / "experiments", args.records)
            print(f"wrote {args.records} synthetic records in {time.perf_counter() - t0:.1f} s (not timed)")
        t0 = time.perf_counter()
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "ecospec.report",
                "--records",
                str(root / "experiments"),
                "--out",
                str(root / "reports"),
            ],
            capture_output=True,
            text=True,
        )
        seconds = time.perf_counter() - t0
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # the build and its figure processes, waited for
        if run.returncode:
            print(run.stdout, run.stderr, sep="\n")
            return run.returncode
        print(run.stdout.strip().splitlines()[-1])
        cpu = usage.ru_utime + usage.ru_stime
        print(
            f"make tables on {args.records} records: {cpu:.1f} s CPU (goal < {GOAL_CPU_S:.0f} s), {seconds:.1f} s wall"
        )
    return 0 if cpu < GOAL_CPU_S else 1


if __name__ == "__main__":
    sys.exit(main())
