"""The MoE methods side by side (`moe_methods_page.py`) from the records under `--records`: printed, and written
to `--out` when given.

    python -m ecospec.report.moe_methods --records experiments/moe_methods --out reports/tiny   # moe_methods.md
"""

from __future__ import annotations

from ecospec.report.moe_methods_page import from_frame, page
from ecospec.report.records import render_cli


def main(argv=None) -> int:
    return render_cli(
        "python -m ecospec.report.moe_methods",
        __doc__,
        "experiments/moe_methods",
        lambda frame: page(from_frame(frame)),
        argv,
    )


if __name__ == "__main__":
    raise SystemExit(main())
