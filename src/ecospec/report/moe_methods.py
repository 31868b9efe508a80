"""The MoE methods side by side (`moe_methods_page.py`) from the records under `--records`: printed, and written
to `--out` when given.

    python -m ecospec.report.moe_methods --records experiments/moe_methods --out reports/tiny   # moe_methods.md
"""

from __future__ import annotations

from ecospec.report.moe_methods_page import NAME, from_frame, page
from ecospec.report.records import render_cli
from ecospec.report.write import page_markdown


def main(argv=None) -> int:
    return render_cli(
        "python -m ecospec.report.moe_methods",
        __doc__,
        "experiments/moe_methods",
        f"{NAME}.md",
        lambda frame: page_markdown(page(from_frame(frame))),
        argv,
    )


if __name__ == "__main__":
    raise SystemExit(main())
