"""The MoE methods against batch size (`batch_methods_page.py`) from the records under `--records`: printed, and
written to `--out` with its figures (under `figures/`, PNG and PDF) when given.

    python -m ecospec.report.batch_methods --records experiments/batch_methods --out reports/tiny   # batch_methods.md
"""

from __future__ import annotations

from ecospec.report.batch_methods_page import from_frame, page, write_figures
from ecospec.report.outputs import FIGURES
from ecospec.report.records import render_cli


def _build(frame, out=None):
    built, figures = page(from_frame(frame))
    if out is not None:
        write_figures(figures, out / FIGURES)
    return built


def main(argv=None) -> int:
    return render_cli(
        "python -m ecospec.report.batch_methods", __doc__, "experiments/batch_methods", _build, argv, with_out=True
    )


if __name__ == "__main__":
    raise SystemExit(main())
