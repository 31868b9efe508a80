"""The engine-by-method page (`engines_page.py`) from the records under `--records`: printed, and written to
`--out` when given.

    python -m ecospec.report.engines --records experiments/engines --out reports/tiny     # writes engines.md
"""

from __future__ import annotations

from ecospec.report.engines_page import from_frame, page
from ecospec.report.records import render_cli


def main(argv=None) -> int:
    return render_cli(
        "python -m ecospec.report.engines",
        __doc__,
        "experiments/engines",
        lambda frame: page(from_frame(frame)),
        argv,
    )


if __name__ == "__main__":
    raise SystemExit(main())
