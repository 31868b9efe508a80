"""How long a preset takes is said in one place: docs/grids.md's "How long the presets take" (the GPU check's, in
docs/cluster.md's "Before your first GPU run"). Every other page and every config comment links there instead of
saying a number, so a new measurement changes one line. A count of cells or jobs said beside a preset's name,
anywhere, is the one its config composes to: docs/grids.md's preset tables, which tests/test_grids_doc.py composes
from the configs."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from docs_pages import DOCS, ROOT, rel
from test_grids_doc import rows

from ecospec import conf_dir

CONF = conf_dir()
GPU_CHECK = "gpu_check"
PRESETS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
HOME = ("docs/grids.md", "How long the presets take")
HOMES = {GPU_CHECK: ("docs/cluster.md", "Before your first GPU run")}

# A preset is named by its code form; a name with an underscore or a digit also as a plain word.
PLAIN = [p for p in PRESETS if re.search(r"[_\d]", p)] + [GPU_CHECK]
MENTION = re.compile(
    rf"experiment=(?P<exp>\w+)|`(?P<code>{'|'.join(PRESETS)})`|\bmake (?P<make>demo)\b|\b(?P<the>[Tt]he demo)\b"
    rf"|\b(?P<plain>{'|'.join(PLAIN)})\b"
)
DURATION = re.compile(
    r"(?<![\w.])\d[\d,.]*(?:\s*[-–]\s*\d[\d,.]*)?\s*(?:s|seconds?|min|minutes?|h|hours?|GPU-hours?|GPU-h)(?![\w-])"
    r"|\ban? (?:few )?(?:minute|hour)s?\b|\b(?:minutes|hours)\b|\bnot yet measured\b"
)
COUNT = re.compile(r"(?<![\w.])(\d[\d,]*) (cells|jobs)\b")
LINK = re.compile(r"\[((?:[^\[\]\n]|\[[^\[\]\n]*\])+)\]\([^)\n]*\)")


@dataclass(frozen=True)
class Said:
    """A duration or a count said of a preset: where, what, and the words it was read from."""

    page: str
    section: str  # the page's `##` section ("" above the first, and in a config)
    line: int
    preset: str
    kind: str  # "duration", "cells" or "jobs"
    value: str
    text: str

    @property
    def place(self) -> tuple[str, str]:
        return (self.page, self.section)

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.kind} of {self.preset}: {self.value!r} in {self.text.strip()!r}"


def name(match: re.Match) -> str | None:
    """The preset a mention names (None: `experiment=X` of no preset)."""
    found = next(v for v in match.groupdict().values() if v)
    found = "demo" if found.lower() == "the demo" else found
    return found if found in PRESETS or found == GPU_CHECK else None


def clauses(unit: str) -> list[str]:
    """A table row's cells, a paragraph's sentences and semicolon clauses: what a mention and a number must share."""
    text = LINK.sub(r"\1", unit)
    parts = text.strip().strip("|").split("|") if text.lstrip().startswith("|") else [text]
    return [c for part in parts for c in re.split(r"(?<=[.;])\s+(?=\S)", part) if c.strip()]


def subject(row: str) -> str | None:
    """The preset a table row is about: the one its first cell names, if it names one."""
    first = LINK.sub(r"\1", row).strip().strip("|").split("|")[0]
    named = {p for m in MENTION.finditer(first) if (p := name(m))}
    return named.pop() if len(named) == 1 else None


THE_PRESET = re.compile(r"\b(?:the|this|its) (?:preset|sweep)\b", re.I)


def said_in(
    unit: str, page: str, section: str, line: int, default: str | None = None, context: str | None = None
) -> list[Said]:
    """What one unit of text says of which preset. Each duration or count goes to the nearest preset named before it
    in its clause, else the first named after it, else `default` (a table row's subject, a config's own preset).
    Failing those, a count goes to `context`, the one preset its section runs; so does a duration in a clause that
    says "the preset" or "the sweep" or that counts cells or jobs."""
    out = []
    for clause in clauses(unit):
        mentions = [(m.start(), p) for m in MENTION.finditer(clause) if (p := name(m))]
        found = [(m.start(), "duration", m.group(0)) for m in DURATION.finditer(clause)]
        counts = [(m.start(), m.group(2), m.group(1).replace(",", "")) for m in COUNT.finditer(clause)]
        about_one = bool(counts or THE_PRESET.search(clause))
        for at, kind, value in found + counts:
            before = [p for pos, p in mentions if pos < at]
            after = [p for pos, p in mentions if pos > at]
            preset = before[-1] if before else after[0] if after else default
            if preset is None and (kind != "duration" or about_one):
                preset = context
            if preset:
                out.append(Said(page, section, line, preset, kind, value, clause))
    return out


def markdown(path: Path) -> list[Said]:
    """What a page says: its paragraphs, list items, table rows and headings, and each line of its code blocks."""
    units: list[tuple[int, str, str, int, str | None]] = []  # line, text, `##` section, heading index, row subject
    section, heading, fenced = "", 0, False
    paragraph: list[tuple[int, str]] = []

    def flush() -> None:
        if paragraph:
            units.append((paragraph[0][0], " ".join(t for _, t in paragraph), section, heading, None))
            paragraph.clear()

    for n, line in enumerate(path.read_text().splitlines(), 1):
        text = line.strip()
        if text.startswith(("```", "~~~")):
            flush()
            fenced = not fenced
        elif fenced or text.startswith(("|", "#")):
            flush()
            if m := re.match(r"(#+)\s+(.*)", text):
                heading = n
                section = m.group(2) if len(m.group(1)) <= 2 else section
            units.append((n, text, section, heading, subject(text) if text.startswith("|") else None))
        elif not text or text.startswith(("- ", "* ")) or re.match(r"\d+\. ", text):
            flush()
            paragraph.extend([(n, text)] if text else [])
        else:
            paragraph.append((n, text))
    flush()
    named: dict[int, set[str]] = {}  # heading -> the presets its text (down to the next heading) runs
    for _, text, _, heading, _ in units:
        runs = (m for m in MENTION.finditer(text) if m.group("exp") or m.group("make"))
        named.setdefault(heading, set()).update(p for m in runs if (p := name(m)))
    context = {h: next(iter(ps)) if len(ps) == 1 else None for h, ps in named.items()}
    page = rel(path)
    return [s for n, text, sec, h, row in units for s in said_in(text, page, sec, n, row, context[h])]


def config(path: Path) -> list[Said]:
    """What a config's comments say; an experiment config's comments speak of its own preset unless they name one."""
    own = path.stem if path.parent.name == "experiment" else None
    units: list[tuple[int, str]] = []  # a comment and the whole-line comments that go on from it: one unit
    going = False
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if "#" not in line:
            going = False
            continue
        code, text = line.split("#", 1)
        if going and not code.strip():
            units[-1] = (units[-1][0], units[-1][1] + " " + text.strip())
        else:
            units.append((n, text.strip()))
        going = True
    return [s for n, text in units for s in said_in(text, rel(path), "", n, own)]


def everything() -> list[Said]:
    return [s for page in DOCS for s in markdown(page)] + [s for p in sorted(CONF.rglob("*.yaml")) for s in config(p)]


def homeless(said: list[Said]) -> list[str]:
    """Each duration said of a preset outside its home, and each preset whose duration is said in several places."""
    problems, places = [], {}
    for s in said:
        if s.kind == "duration":
            places.setdefault(s.preset, set()).add(s.place)
            home = HOMES.get(s.preset, HOME)
            if s.place != home:
                problems.append(f"{s}: say it once, in {home[0]}, '{home[1]}', and link there")
    problems += [f"{p}: its duration is said in {len(w)} places: {sorted(w)}" for p, w in places.items() if len(w) > 1]
    return problems


def composed() -> dict[str, dict[str, set[int]]]:
    """preset -> {"cells": ..., "jobs": ...} as docs/grids.md's tables count them from the configs (the laptop table:
    cells (jobs), then the cells where the Hub-only benchmarks load)."""
    out = {}
    for preset, said in rows("Laptop presets").items():
        numbers = [int(n) for n in re.findall(r"(?<!\w)\d+(?!\w)", said)]
        out[preset] = {"cells": {numbers[0], *numbers[2:]}, "jobs": {numbers[1]}}
    for preset, said in rows("GPU cluster presets").items():
        n = int(re.findall(r"\d+", said)[0])
        out[preset] = {"jobs": {n}} if "jobs" in said else {"cells": {n}, "jobs": {n}}
    return out


def miscounted(said: list[Said], counts: dict[str, dict[str, set[int]]]) -> list[str]:
    """Each count of cells or jobs said of a preset that is not what the preset composes to."""
    problems = []
    for s in said:
        if s.kind in ("cells", "jobs"):
            want = counts.get(s.preset, {}).get(s.kind)
            if want is None:
                problems.append(f"{s}: docs/grids.md's preset tables give no {s.kind} count for {s.preset}")
            elif int(s.value) not in want:
                problems.append(f"{s}: {s.preset} composes to {' or '.join(map(str, sorted(want)))} {s.kind}")
    return problems


def test_each_duration_is_said_in_one_place():
    said = everything()
    assert {s.preset for s in said if s.kind == "duration" and s.place == HOME} >= {"demo", "tiny_repro", "engines"}
    assert any(s.preset == GPU_CHECK and s.kind == "duration" for s in said)
    problems = homeless(said)
    assert not problems, "\n".join(problems)


def test_every_count_said_is_the_composed_one():
    said = everything()
    assert sum(s.kind == "cells" and s.page != HOME[0] for s in said) >= 3
    problems = miscounted(said, composed())
    assert not problems, "\n".join(problems)


def test_the_gpu_check_on_a_gpu_is_not_yet_measured():
    """No GPU has run it: its home says so in those words, and the README's GPU row says the same."""
    said = [s for s in everything() if s.preset == GPU_CHECK and s.kind == "duration"]
    assert [s.value for s in said] == ["not yet measured"], [str(s) for s in said]
    readme = (ROOT / "README.md").read_text()
    row = next(line for line in readme.splitlines() if GPU_CHECK in line and line.startswith("|"))
    assert "not yet measured" in row and not DURATION.search(row.replace("not yet measured", ""))


def test_a_second_statement_fails(tmp_path, monkeypatch):
    """The checks see a made-up second place that says a preset's time, and a made-up wrong count."""
    import docs_pages

    monkeypatch.setattr(docs_pages, "ROOT", tmp_path)
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "page.md"
    page.write_text(
        "# A page\n\n## Run\n\n```bash\nmake demo   # about 40 s\n```\n\n"
        "The preset `tiny_repro` (144 cells) takes\nan hour or more. `experiment=engines` is 8 cells.\n\n"
        "| preset | time |\n| --- | --- |\n| `moe_methods` | 22 min |\n\n"
        "`python -m ecospec.bench.gpu_check --device cuda` takes minutes on one H200.\n"
    )
    said = markdown(page)
    problems = homeless(said)
    for preset, text in [("demo", "40 s"), ("tiny_repro", "an hour"), ("moe_methods", "22 min")]:
        assert any(f"duration of {preset}: {text!r}" in p for p in problems), (preset, problems)
    assert any("duration of gpu_check: 'minutes'" in p and "docs/cluster.md" in p for p in problems), problems
    counts = {"tiny_repro": {"cells": {144, 192}}, "engines": {"cells": {16}}}
    [wrong] = miscounted(said, counts)
    assert "cells of engines: '8'" in wrong and "16 cells" in wrong
    conf = tmp_path / "conf" / "experiment" / "demo.yaml"
    conf.parent.mkdir(parents=True)
    conf.write_text("# runs in about a minute on 2 cores\nname: demo\n")
    [wrong] = homeless(config(conf))
    assert "duration of demo: 'a minute'" in wrong
    home = [Said(*HOME, 1, "demo", "duration", "53 s", "53 s")]
    assert homeless(home) == []
    twice = home + [Said("README.md", "Set up", 9, "demo", "duration", "40 s", "about 40 s")]
    assert any("said in 2 places" in p for p in homeless(twice))
