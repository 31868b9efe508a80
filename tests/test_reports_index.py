"""reports/tiny is what a reproducer reads first: its index (`README.md`) links every file of the directory, figures/
included, the list of the files beside its tables being what the report's own code writes (`report/outputs.py`'s
BESIDE, `python -m ecospec.report --out reports/tiny --relist`), and every script or `python -m` module one of its
pages names exists."""

import importlib.util
import re
import shutil
from pathlib import Path

from ecospec.report.outputs import BESIDE
from ecospec.report.write import INDEX, LINK, relist, relisted

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "reports" / "tiny"
TEXT = (".md", ".json", ".tex", ".csv")
COMMAND = re.compile(r"\bpython3?\s+(-m\s+)?([\w./-]+)")
RELIST = "python -m ecospec.report --out reports/tiny --relist"


def unindexed(report: Path) -> list[str]:
    """The files under `report` (figures/ included) that its index links nowhere, or lists as on no list of
    report/outputs.py."""
    index = (report / INDEX).read_text()
    linked = set(LINK.findall(index))
    stray = {
        t for line in index.splitlines() if "on no list of `report/outputs.py`" in line for t in LINK.findall(line)
    }
    files = sorted(p.relative_to(report).as_posix() for p in report.rglob("*") if p.is_file())
    return [f for f in files if f != INDEX and (f not in linked or f in stray)]


def missing_commands(report: Path, root: Path = ROOT) -> list[str]:
    """`page: command` for every `python <script>` whose script is not under `root` and every `python -m <module>`
    that does not import, in the text files under `report`."""
    out = []
    for page in sorted(p for p in report.rglob("*") if p.suffix in TEXT):
        for module, target in COMMAND.findall(page.read_text()):
            exists = importlib.util.find_spec(target) is not None if module else (root / target).is_file()
            if not exists:
                out.append(f"{page.relative_to(report).as_posix()}: python {module}{target}")
    return out


def test_the_index_links_every_file_of_reports_tiny():
    assert not unindexed(TINY), f"files reports/tiny/README.md does not index ({RELIST}): {unindexed(TINY)}"


def test_the_committed_index_lists_what_the_report_code_writes():
    assert (TINY / INDEX).read_text() == relisted(TINY, BESIDE), f"reports/tiny/README.md is stale: {RELIST}"


def test_every_script_and_module_a_page_of_reports_tiny_names_exists():
    assert not missing_commands(TINY), missing_commands(TINY)


def test_the_checks_fail_a_made_up_file_script_and_module(tmp_path):
    report = tmp_path / "tiny"
    shutil.copytree(TINY, report)
    assert not unindexed(report) and relisted(report, BESIDE) == (report / INDEX).read_text()

    (report / "figures" / "made_up.png").write_bytes(b"x")  # a file no index line links
    (report / "made_up_study.md").write_text("# A study\n\n`python benchmarks/studies/made_up.py --out DIR`\n")
    assert unindexed(report) == ["figures/made_up.png", "made_up_study.md"]
    assert relisted(report, BESIDE) != (report / INDEX).read_text()  # the committed-index test fails
    relist(report, BESIDE)  # the list now names them, as on no list of report/outputs.py: still unindexed
    assert unindexed(report) == ["figures/made_up.png", "made_up_study.md"]
    assert (
        "- `made_up_study`, on no list of `report/outputs.py`: [md](made_up_study.md)" in (report / INDEX).read_text()
    )
    assert relisted(report, BESIDE) == (report / INDEX).read_text()  # relisting again changes nothing

    (report / "made_up_module.md").write_text("`python -m ecospec.report.made_up --out DIR`\n")
    assert missing_commands(report) == [
        "made_up_module.md: python -m ecospec.report.made_up",
        "made_up_study.md: python benchmarks/studies/made_up.py",
    ]


def test_relisting_keeps_the_rest_of_the_index(tmp_path):
    (tmp_path / "a.md").write_text("# A\n")
    (tmp_path / "across_builds.md").write_text("# Across builds\n")
    head = "# Reports\n\n## Tables\n\n| [md](a.md) |\n"
    skipped = "## Skipped files\n\n- `x/result.json`\n"
    (tmp_path / INDEX).write_text(head + "\n## Other outputs in this directory\n\n- stale\n\n" + skipped)
    text = relist(tmp_path, BESIDE).read_text()
    assert text.startswith(head) and text.endswith("\n\n" + skipped) and "stale" not in text
    assert "[md](across_builds.md); `python benchmarks/studies/across_builds.py --out DIR`" in text
    assert "a.md" not in text.split("## Other outputs")[1]
