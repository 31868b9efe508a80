"""docs/methods.md answers "which method should I use?" before anything else: the first section after its title and
intro is the guide; the guide quotes its figures from the measured table (reports/tiny/moe_methods.md) and from the
papers' values (src/ecospec/report/paper*/) as quoted-figure links (docs/reports.md, "Quoting a figure in the docs"),
each borne out by its file; it labels them paper, ours and modeled; and every `method=` it recommends exists in
conf/method. When a rerun changes a number the guide quotes, this fails until the guide follows."""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

import docs_pages
from docs_pages import FENCE, HEADING, ROOT, quotes, rel

PAGE = ROOT / "docs" / "methods.md"
GUIDE = "Which method to use"
MEASURED = "reports/tiny/moe_methods.md"
PAPERS = "src/ecospec/report/paper"  # paper/ and paper_overlap/
# How many figures the guide quotes at least, from each source: raise as it quotes more, never lower to pass.
AT_LEAST = {MEASURED: 41, PAPERS: 30}
LABELS = ("**paper**", "**ours**", "**modeled**")
INTRO_LINES = 6  # the page's intro: one short paragraph
LONGEST = 140  # source lines: a screen or two rendered (the links make the source longer)


class Heading(NamedTuple):
    index: int  # 0-based line
    level: int
    title: str


def headings(lines: list[str]) -> list[Heading]:
    """The page's headings, outside fenced code."""
    out, fenced = [], False
    for i, line in enumerate(lines):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and (m := HEADING.match(line)):
            out.append(Heading(i, len(m.group(1)), m.group(2)))
    return out


def page_quotes(page: Path) -> list[docs_pages.Quote]:
    """`quotes` of the page: the reports' figures and the papers' transcribed values."""
    return quotes(page)


def first_section(lines: list[str]) -> tuple[Heading | None, int]:
    """The heading of the page's first section after its title, and the line its section ends before."""
    heads = headings(lines)[1:]
    if not heads:
        return None, len(lines)
    return heads[0], next((h.index for h in heads[1:] if h.level <= heads[0].level), len(lines))


def guide_quotes(page: Path) -> list[docs_pages.Quote]:
    """The figures the page's first section after its title quotes."""
    first, end = first_section(page.read_text().splitlines())
    return [q for q in page_quotes(page) if first and first.index < q.line <= end]  # q.line counts from 1


def guide_problems(page: Path, at_least: dict[str, int] = AT_LEAST) -> list[str]:
    """Why the page does not open with the guide, or the guide falls short; [] when it holds."""
    lines = page.read_text().splitlines()
    heads = headings(lines)
    if not heads or heads[0].index != 0 or heads[0].level != 1:
        return [f"{rel(page)}: no title on its first line"]
    first, end = first_section(lines)
    if first is None or (first.level, first.title) != (2, GUIDE):
        found = f"{first.title!r}" if first else "nothing"
        return [f"{rel(page)}: the first section after the intro is {found}, not the guide ({GUIDE!r})"]
    problems = []
    intro = [line for line in lines[1 : first.index] if line.strip()]
    if not intro or len(intro) > INTRO_LINES or any(line.lstrip().startswith("|") for line in intro):
        problems.append(f"{rel(page)}: the intro before the guide is not one short paragraph ({len(intro)} lines)")
    guide = lines[first.index : end]
    text = "\n".join(guide)
    if len(guide) > LONGEST:
        problems.append(f"{rel(page)}: the guide runs {len(guide)} lines, more than {LONGEST}")

    quoted = guide_quotes(page)
    problems += [p for q in quoted if (p := q.problem())]
    for source, floor in at_least.items():
        n = sum(rel(q.path).startswith(source) for q in quoted)
        if n < floor:
            problems.append(f"{rel(page)}: the guide quotes {n} figures from {source}, fewer than {floor}")

    problems += [f"{rel(page)}: the guide does not say what {label} means" for label in LABELS if label not in text]
    names = re.findall(r"`method=([A-Za-z0-9_]+)`", text)
    have = {p.stem for p in (docs_pages.ROOT / "src" / "ecospec" / "conf" / "method").glob("*.yaml")}
    if not names:
        problems.append(f"{rel(page)}: the guide recommends no `method=`")
    problems += [
        f"{rel(page)}: the guide recommends method={n}, which conf/method lacks" for n in names if n not in have
    ]
    rows = [line for line in guide if line.lstrip().startswith("|")][2:]  # the header and its rule dropped
    if not rows:
        problems.append(f"{rel(page)}: the guide has no table of regime, method and why")
    problems += [
        f"{rel(page)}: a row of the guide's table names no `method=`: {r[:60]}" for r in rows if "`method=" not in r
    ]
    return problems


def test_methods_md_opens_with_the_guide(capsys):
    quoted = guide_quotes(PAGE)
    counts = ", ".join(f"{sum(rel(q.path).startswith(s) for q in quoted)} from {s}" for s in AT_LEAST)
    with capsys.disabled():
        print(f"\nthe guide quotes {len(quoted)} figures: {counts}")
    assert guide_problems(PAGE) == []


GOOD = """# The methods

A method decides each step what the target verifies.

## Which method to use

**paper**, **ours** and **modeled** figures. Ours: EcoSpec [1.55×](../reports/tiny/moe_methods.md "1.55× [1.47, 1.63]")
at α [3.33](../reports/tiny/moe_methods.md "1.55× [1.47, 1.63]"); paper:
[1.36×](../src/ecospec/report/paper/table01.csv "1,qwen3,ecospec,avg,0,4,1,,speedup").

| Regime | Use | Why |
|---|---|---|
| eager, T = 0 | `method=ecospec` | fewer experts |
| compiled | `method=ar` | nothing pays |

## What each method does

| `method=` | Source |
|---|---|
| `eagle3` | EAGLE-3 |
"""


def fake_repo(tmp_path: Path, monkeypatch, page: str) -> Path:
    """A repository of one measured table, one paper CSV and two methods, and `page` as its docs/methods.md."""
    monkeypatch.setattr(docs_pages, "ROOT", tmp_path)
    files = {
        "reports/tiny/moe_methods.md": "| EcoSpec | 1.55× [1.47, 1.63] | 3.33 |\n",
        "src/ecospec/report/paper/table01.csv": "1,qwen3,ecospec,avg,0,4,1,,speedup,1.36,x\n",
        "src/ecospec/conf/method/ecospec.yaml": "name: ecospec\n",
        "src/ecospec/conf/method/ar.yaml": "name: ar\n",
        "docs/methods.md": page,
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path / "docs" / "methods.md"


def test_the_check_fails_a_page_without_the_guide(tmp_path, monkeypatch):
    few = {MEASURED: 2, PAPERS: 1}
    assert guide_problems(fake_repo(tmp_path, monkeypatch, GOOD), few) == []
    guide = GOOD[GOOD.index("## Which") : GOOD.index("## What")]
    bad = {
        GOOD.replace(guide, ""): "is 'What each method does', not the guide",  # no guide
        GOOD.replace("## Which method to use", "## Choosing"): "not the guide",
        GOOD.replace("\n## Which", "\n## Setup\n\nFirst.\n\n## Which"): "is 'Setup', not the guide",  # not first
        GOOD.replace("A method decides", "| a | table |\n\nA method decides"): "not one short paragraph",
        GOOD.replace(
            "[3.33](../reports/tiny/moe_methods.md", "3.33 ("
        ): f"quotes 1 figures from {MEASURED}, fewer than 2",
        GOOD.replace("[1.36×](../src", "1.36× (../src"): f"quotes 0 figures from {PAPERS}, fewer than 1",
        GOOD.replace("[1.55×]", "[1.56×]"): "1.56 on no line",  # a figure its file does not bear out
        GOOD.replace("`method=ecospec`", "`method=ecospec_v2`"): "method=ecospec_v2, which conf/method lacks",
        GOOD.replace("`method=ar`", "AR"): "a row of the guide's table names no `method=`",
        GOOD.replace("**modeled**", "modeled"): "does not say what **modeled** means",
        GOOD.replace(guide, guide.replace("| eager", "| eager" + "\n" * 150 + "| eager")): "more than 140",
    }
    for page, why in bad.items():
        problems = guide_problems(fake_repo(tmp_path, monkeypatch, page), few)
        assert any(why in p for p in problems), (why, problems)


def test_the_real_page_without_its_guide_fails(tmp_path):
    text = PAGE.read_text()
    lines = text.splitlines(keepends=True)
    first, end = first_section([line.rstrip("\n") for line in lines])
    assert first and first.title == GUIDE
    start = first.index
    page = tmp_path / "docs" / "methods.md"
    page.parent.mkdir()
    page.write_text("".join(lines[:start] + lines[end:]))
    [problem] = guide_problems(page)
    assert "not the guide" in problem
