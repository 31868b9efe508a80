"""`make tables` at scale: 10,000 synthetic result records written as files, then the whole report (every table,
the modeled numbers, the figures and the index) built by `python -m ecospec.report` in a fresh interpreter,
imports included. Prints the wall-clock and CPU seconds; exits non-zero when the wall clock reaches the 20 s goal
(2 CPU cores; other load on the machine shows as wall time above the CPU time).

    python benchmarks/report_bench.py [--records 10000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL_S = 20.0


def write_records(root: Path, n: int) -> None:
    """One `<experiment>/<cell>/result.json` per synthetic record, laid out as run.py writes them (indent=1)."""
    from ecospec.report.synthetic import synthetic_records

    for rec in synthetic_records(n, seed=0):
        cell = root / rec["experiment"] / rec["cell"]
        cell.mkdir(parents=True, exist_ok=True)
        (cell / "result.json").write_text(json.dumps(rec, indent=1))


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
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # CPU time: what other load on the machine leaves alone
        if run.returncode:
            print(run.stdout, run.stderr, sep="\n")
            return run.returncode
        print(run.stdout.strip().splitlines()[-1])
        cpu = usage.ru_utime + usage.ru_stime
        print(f"make tables on {args.records} records: {seconds:.1f} s wall, {cpu:.1f} s CPU (goal < {GOAL_S:.0f} s)")
    return 0 if seconds < GOAL_S else 1


if __name__ == "__main__":
    sys.exit(main())
