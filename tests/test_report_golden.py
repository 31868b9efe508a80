"""The report writes the golden pages on the golden records (tests/golden/report_golden.py says what they are and
how to rewrite them when a change to a page is meant)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "golden"))
from report_golden import build, golden, isolated  # noqa: E402


@pytest.mark.slow
def test_report_pages_equal_the_golden_files(tmp_path, monkeypatch):
    for k, v in isolated(tmp_path).items():
        monkeypatch.setenv(k, v)
    pages, want = build(tmp_path), golden()
    assert sorted(pages) == sorted(want), "files written differ from the golden set"
    changed = [name for name in want if pages[name] != want[name]]
    assert not changed, f"pages differ from the golden files: {changed}"
