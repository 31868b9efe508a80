"""What the docs tests read from the Markdown pages: the pages, the code they show (with the headings it sits under)
and the figures they quote from committed files (docs/reports.md, "Quoting a figure in the docs")."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def pages() -> list[Path]:
    """Every page a reader is sent to: the README, docs/, slurm/README.md, the paper READMEs, CONTRIBUTING and
    CHANGELOG where they exist."""
    papers = (ROOT / "src" / "ecospec" / "report").glob("paper*/README.md")
    extra = [ROOT / name for name in ("CONTRIBUTING.md", "CHANGELOG.md") if (ROOT / name).exists()]
    return sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), ROOT / "slurm" / "README.md", *papers, *extra])


DOCS = pages()


def rel(page: Path) -> str:
    """A page's path from the repository root (a page outside it: its own path)."""
    return page.relative_to(ROOT).as_posix() if page.is_relative_to(ROOT) else page.as_posix()


@dataclass(frozen=True)
class Shown:
    """One command line a page shows, where it shows it, and the headings above it (innermost last; a table row's
    own text, outside its code, counts as one more)."""

    page: str
    line: int
    headings: tuple[str, ...]
    command: str


FENCE = re.compile(r"^\s*```\s*(\S*)")
SHELL = ("", "bash", "sh", "shell", "console", "zsh")  # blocks of commands; ```text, ```python, ... hold none
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def split_commands(text: str) -> list[str]:
    """The commands of one shown line: a trailing comment, a `$ ` prompt and `&&` / `;` chains taken apart."""
    line = text.split("  #")[0].strip().removeprefix("$ ")
    return [part for part in re.split(r"\s*(?:&&|;)\s*", line) if part]


def shown(page: Path) -> list[Shown]:
    """Every command line a page shows, in fenced shell blocks (continuation lines joined) and inline code spans."""
    out: list[Shown] = []
    stack: list[tuple[int, str]] = []
    block: list[tuple[int, str]] | None = None
    language = ""
    name = rel(page)

    def add(lineno: int, text: str, row: str | None = None) -> None:
        headings = tuple(h for _, h in stack) + ((row,) if row else ())
        out.extend(Shown(name, lineno, headings, cmd) for cmd in split_commands(text))

    for lineno, line in enumerate(page.read_text().splitlines(), 1):
        if fence := FENCE.match(line):
            if block is None:
                block, language = [], fence.group(1)
                continue
            joined: list[tuple[int, str]] = []
            for n, text in block:  # continuation lines joined onto the line they continue
                if joined and joined[-1][1].endswith("\\"):
                    joined[-1] = (joined[-1][0], joined[-1][1][:-1].rstrip() + " " + text.strip())
                else:
                    joined.append((n, text))
            for n, text in joined if language in SHELL else []:
                add(n, text)
            block = None
            continue
        if block is not None:
            block.append((lineno, line))
            continue
        m = HEADING.match(line)
        if m:
            level = len(m.group(1))
            stack = [(lv, h) for lv, h in stack if lv < level] + [(level, m.group(2))]
            continue
        row = re.sub(r"`[^`\n]*`", "", line) if line.lstrip().startswith("|") else None
        for span in re.findall(r"`([^`\n]+)`", line):
            add(lineno, span, row)
    return out


def commands(prefix: str) -> list[tuple[str, str]]:
    """(page, command line) for every shown command that starts with `prefix`."""
    return [(s.page, s.command) for page in DOCS for s in shown(page) if s.command.startswith(prefix)]


# A figure: a number, possibly signed, with an optional %, ×, x or unit, and optionally its interval "[lo, hi]"
# and the within-noise mark ≈ (`+2 % [−4, +10] ≈`); every number of it is checked.
NUM = r"[+-]?\d[\d,]*(?:\.\d+)?(?:[eE][+-]?\d+)?"
UNIT = r"(?:\s*(?:%|×|x|[A-Za-zµ]+(?:/[A-Za-z]+)?))?"
FIGURE = re.compile(rf"{NUM}{UNIT}(?:\s*\[{NUM}{UNIT},\s*{NUM}{UNIT}\])?(?:\s*≈)?")
LINK = re.compile(r"\[((?:[^\[\]\n]|\[[^\[\]\n]*\])+)\]\(([^)\s]+)(?:\s+\"([^\"]*)\")?\)")
NUMBER = re.compile(rf"(?<![\w.]){NUM}|\d[\d,]*(?:\.\d+)?(?:[eE][+-]?\d+)?")
SPACES = dict.fromkeys(map(ord, "\u2009\u202f\u00a0\u200a\u2007"), None)
# committed files a figure may be quoted from: the reports, the benchmarks' results and the papers' transcribed values
QUOTED_FROM = ("reports", "benchmarks", "src/ecospec/report/paper", "src/ecospec/report/paper_overlap")


def normalise(text: str) -> str:
    """Unicode minus to "-", thin and no-break spaces removed."""
    return text.replace("−", "-").translate(SPACES)


def figure_numbers(figure: str) -> list[str]:
    """The numbers a figure's text states (its value, and its interval's bounds): normalised, units and a leading +
    stripped."""
    return [n.removeprefix("+").rstrip(",") for n in re.findall(NUM, normalise(figure))]


def numbers(line: str) -> set[str]:
    """The numbers a line states, as written (a leading + dropped; a "-" after a letter or digit is a hyphen; a CSV's
    "3,4" states 3,4 and each of 3 and 4)."""
    found = {n.removeprefix("+").rstrip(",") for n in NUMBER.findall(normalise(line))}
    return found | {part for n in found if "," in n for part in n.split(",") if part}


def file_lines(path: Path) -> list[str]:
    """A quoted file's lines; a JSON file's pretty-printed."""
    text = path.read_text()
    if path.suffix == ".json":
        text = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    return text.splitlines()


@dataclass(frozen=True)
class Quote:
    """A figure a page quotes from a committed file: `[figure](target "title")`."""

    page: str
    line: int
    figure: str
    target: str
    title: str | None
    path: Path

    def problem(self) -> str | None:
        """Why the file does not bear the figure out, or None."""
        where = f"{self.page}:{self.line}: [{self.figure}]({self.target})"
        if not self.path.is_file():
            return f"{where}: no such file"
        if not self.title:
            return f"{where}: no title naming the line it is on"
        lines = [x for x in file_lines(self.path) if self.title in x]
        if not lines:
            return f"{where}: no line of {rel(self.path)} holds {self.title!r}"
        stated = set().union(*map(numbers, lines))
        missing = [n for n in figure_numbers(self.figure) if n not in stated]
        if missing:
            return f"{where}: {', '.join(missing)} on no line of {rel(self.path)} holding {self.title!r}"
        return None


def quotes(page: Path) -> list[Quote]:
    """The figures a page quotes from a file under one of ``QUOTED_FROM`` (links in code are not quotes)."""
    out = []
    text = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), page.read_text(), flags=re.S)
    for lineno, line in enumerate(text.splitlines(), 1):
        for figure, target, title in LINK.findall(re.sub(r"`[^`\n]*`", "", line)):
            if not FIGURE.fullmatch(normalise(figure).strip()) or re.match(r"[a-z]+:", target):
                continue
            path = (page.parent / target.split("#")[0]).resolve()
            if path.is_relative_to(ROOT) and any(path.relative_to(ROOT).is_relative_to(f) for f in QUOTED_FROM):
                out.append(Quote(rel(page), lineno, figure, target, title or None, path))
    return out
