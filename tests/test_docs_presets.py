"""The docs name what a reader meets: docs/grids.md lists every method preset (one list item per file of
src/ecospec/conf/method/, each with a link to the page that describes it, and none that is gone), and every term on
the README's first screen has an entry in docs/design.md's glossary."""

from __future__ import annotations

import re

from docs_pages import ROOT

from ecospec import conf_dir

PAGE = ROOT / "docs" / "grids.md"
HEADING = "### Method presets"
FIRST_SCREEN_END = "## The demo's output"  # the README above it: what it is, the set-up, what runs where
# A term as the README writes it: the glossary's name for it.
TERMS = {
    "SD": "SD",
    "MoE": "MoE",
    "AR": "AR",
    "EAGLE-3": "EAGLE-3",
    "EcoSpec": "EcoSpec",
    "α": "α",
    "E": "E",
    "γ": "γ",
    "interleaved": "interleaved",
    "paired bootstrap": "paired bootstrap",
    "modeled": "modeled",
    "release": "the release",
    "embedded default": "embedded default",
    "traces": "traces",
    "predictor": "predictor",
    "store": "the store",
    "GTO": "GTO",
    "Figure 1(a)": "Figure 1(a)",
    "Table 1": "Table N",
    "MXFP4": "MXFP4",
    "kernels": "kernels",
    "cell": "cell",
    "preset": "preset",
    "grid": "grid",
    "verify-cost profile": "verify-cost profile",
    "roofline": "roofline",
    "HBM": "HBM",
}


def listed(text: str) -> dict[str, str]:
    """name -> its list item, from the section under HEADING (an item goes on over its indented lines)."""
    start = text.index(HEADING)
    end = text.find("\n#", start + 1)
    items: dict[str, str] = {}
    last = None
    for line in text[start : end if end > 0 else None].splitlines():
        if m := re.match(r"- `(\w+)`", line):
            last = m.group(1)
            items[last] = line
        elif last and line.startswith("  "):
            items[last] += " " + line.strip()
        else:
            last = None
    return items


def problems(items: dict[str, str], presets: set[str]) -> list[str]:
    out = [f"method={p}: not listed under {HEADING!r}" for p in sorted(presets - set(items))]
    out += [f"method={p}: listed, but src/ecospec/conf/method/ has no {p}.yaml" for p in sorted(set(items) - presets)]
    out += [f"method={p}: no link to where it is described" for p, item in items.items() if "](" not in item]
    return out


def test_every_method_preset_is_listed():
    presets = {p.stem for p in (conf_dir() / "method").glob("*.yaml")}
    assert len(presets) >= 10
    found = problems(listed(PAGE.read_text()), presets)
    assert not found, "\n".join(found)


def test_a_missing_or_stale_preset_fails():
    text = (
        f"{HEADING}\n\n- `ar`: AR ([methods](methods.md)).\n- `old`: gone\n  ([methods](methods.md)).\n"
        "- `eagle3`: a tree\n\n## Next\n"
    )
    assert problems(listed(text), {"ar", "eagle3", "ecospec"}) == [
        f"method=ecospec: not listed under {HEADING!r}",
        "method=old: listed, but src/ecospec/conf/method/ has no old.yaml",
        "method=eagle3: no link to where it is described",
    ]


def glossary(text: str) -> set[str]:
    """The names the glossary's table defines: each row's first cell, split at ", " and " (", backticks dropped."""
    start = text.index("## Glossary")
    end = text.find("\n#", start + 1)
    names = set()
    for line in text[start : end if end > 0 else None].splitlines():
        if line.startswith("| ") and not line.startswith(("| term ", "| ---")):
            cell = line.split("|")[1].replace("`", "").strip()
            parts = [n.strip() for n in re.split(r", | \(", cell)]
            names |= {n[:-1] if n.endswith(")") and "(" not in n else n for n in parts}
    return names


def undefined(readme: str, names: set[str]) -> tuple[list[str], list[str]]:
    """(the terms on the README's first screen, those of them the glossary lacks)."""
    screen = readme[: readme.index(FIRST_SCREEN_END)]
    on = [t for t in TERMS if re.search(rf"(?<![\w-]){re.escape(t)}s?(?![\w-])", screen)]
    return on, [f"{t!r} (glossary: {TERMS[t]!r})" for t in on if TERMS[t] not in names]


def test_every_term_on_the_first_screen_is_in_the_glossary():
    on, missing = undefined((ROOT / "README.md").read_text(), glossary((ROOT / "docs" / "design.md").read_text()))
    assert len(on) >= 15, f"the first screen holds only {on}: is FIRST_SCREEN_END still a README heading?"
    assert not missing, f"README terms with no entry in docs/design.md#glossary: {missing}"
    assert "design.md#glossary" in (ROOT / "README.md").read_text().split(FIRST_SCREEN_END)[0]


def test_a_term_without_an_entry_fails():
    table = "## Glossary\n\n| term | meaning |\n| --- | --- |\n| γ (gamma) | x |\n| `acc50`, Figure 1(a) | y |\n"
    assert glossary(table) == {"γ", "gamma", "acc50", "Figure 1(a)"}
    readme = f"GPT-OSS stays MXFP4 with `kernels`, γ 4.\n{FIRST_SCREEN_END}\nE and AR below it.\n"
    on, missing = undefined(readme, glossary(table))
    assert on == ["γ", "MXFP4", "kernels"]
    assert missing == ["'MXFP4' (glossary: 'MXFP4')", "'kernels' (glossary: 'kernels')"]
