"""Every figure the README and docs quote from a committed file under reports/ or benchmarks/ is read from that file:
`[figure](file "title")` holds when a line of the file containing the title states the figure (docs/reports.md,
"Quoting a figure in the docs")."""

from pathlib import Path

from docs_pages import DOCS, Quote, quotes

# How many quoted figures the pages hold at least: raise it as pages mark more, never lower it to pass (deleting
# numbers is not the fix).
FLOOR = 238


def check(page_text: str, tmp: Path) -> list[str | None]:
    page = tmp / "docs" / "page.md"
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(page_text)
    return [q.problem() for q in quotes(page)]


def test_every_quoted_figure_is_in_its_file(capsys):
    found = [q for page in DOCS for q in quotes(page)]
    with capsys.disabled():
        print(f"\n{len(found)} quoted figures checked on {len({q.page for q in found})} pages")
    problems = [p for q in found if (p := q.problem())]
    assert not problems, "\n".join(problems)
    assert len(found) >= FLOOR, f"{len(found)} quoted figures, fewer than the {FLOOR} the pages held"


def test_the_checker_fails_a_changed_figure(tmp_path, monkeypatch):
    import docs_pages

    monkeypatch.setattr(docs_pages, "ROOT", tmp_path)
    report = tmp_path / "reports" / "r.md"
    report.parent.mkdir()
    report.write_text("| idle | 1.107 | −5 % [−13, +6] ≈ |\n| busy | 1.232 | +6 % |\n")
    (tmp_path / "reports" / "r.json").write_text('{"idle": {"spread": 1.107}, "busy": {"spread": 1.232}}')
    ok = (
        '[1.107](../reports/r.md "idle") [−5 %](../reports/r.md "idle") [-5%](../reports/r.md "idle") '
        '[+6 %](../reports/r.md "busy") [6](../reports/r.md "busy") [1.232×](../reports/r.json "1.232") '
        '[−5 % [−13, +6] ≈](../reports/r.md "idle")'
    )
    assert check(ok, tmp_path) == [None] * 7
    bad = {
        '[1.108](../reports/r.md "idle")': "1.108 on no line",
        '[1.232](../reports/r.md "idle")': "1.232 on no line",  # on the file, not on the title's line
        '[1.10](../reports/r.md "idle")': "1.10 on no line",  # a number is matched whole
        '[5 %](../reports/r.md "idle")': "5 on no line",  # the sign is part of it
        '[−5 % [−13, +7]](../reports/r.md "idle")': ": 7 on no line",  # every bound is checked
        '[1.107](../reports/r.md "Idle")': "no line of reports/r.md holds 'Idle'",
        "[1.107](../reports/r.md)": "no title",
        '[1.107](../reports/gone.md "idle")': "no such file",
    }
    for text, why in bad.items():
        [problem] = check(text, tmp_path)
        assert problem and why in problem, (text, problem)
    assert check('[Table 1](../reports/r.md) `[9](../reports/r.md "x")` [9](https://x.org "y")', tmp_path) == []


def test_a_quote_names_its_page_and_line():
    q = Quote("docs/x.md", 3, "1.5", "../reports/x.md", "t", Path("/nonexistent/x.md"))
    assert q.problem() == "docs/x.md:3: [1.5](../reports/x.md): no such file"
