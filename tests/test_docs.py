"""The docs tell the truth: every `make` target and `python -m ecospec...` module the README and docs name exists,
every `run.py` command line they show composes with Hydra (nothing runs), every relative link resolves, and the
README's Python snippet runs on the released embedded default."""

import re
import runpy
import sys

import pytest
from docs_commands import first_values, run_py_args
from docs_pages import DOCS, ROOT, commands

from ecospec import conf_dir


def test_every_make_target_named_exists():
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][a-z-]*):", makefile, flags=re.M))
    named = {(page, cmd.split()[1]) for page, cmd in commands("make ") if len(cmd.split()) > 1}
    assert named, "no make command found in the docs"
    missing = sorted(f"{page}: make {t}" for page, t in named if t not in targets and "=" not in t)
    assert not missing, missing


MODULES = sorted({cmd.split()[2] for _, cmd in commands("python -m ecospec")} - {"ecospec..."})  # a placeholder


@pytest.mark.parametrize("module", MODULES)
def test_every_module_named_answers_help(module, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [module, "--help"])
    with pytest.raises(SystemExit) as done:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    assert done.value.code in (0, None), module
    assert "usage" in capsys.readouterr().out.lower(), module


def test_every_run_py_line_composes():
    from hydra import compose, initialize_config_dir

    lines = commands("python run.py")
    assert len(lines) >= 10
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        for page, line in lines:
            overrides = first_values(
                run_py_args(line)[1]
            )  # a sweep composes as each of its values; the first stands for them
            try:
                compose(config_name="config", overrides=overrides)
            except Exception as e:  # noqa: BLE001
                raise AssertionError(f"{page}: {line!r} does not compose: {e}") from e


def test_every_relative_link_resolves():
    broken = []
    for page in DOCS:
        for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", page.read_text()):  # a title after it
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = (page.parent / target.split("#")[0]).resolve()
            if not path.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken


def test_no_page_cites_what_the_repository_lacks():
    for page in DOCS:
        text = page.read_text()
        for gone in ("shared/DESIGN.md", "shared/papers", "huggingface-cli"):
            assert gone not in text, f"{page.relative_to(ROOT)} cites {gone}"


def test_readme_python_snippet_runs_on_the_release():
    readme = (ROOT / "README.md").read_text()
    snippets = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    assert snippets, "the README shows no Python"
    import torch

    threads = torch.get_num_threads()
    try:
        exec(compile(snippets[0], "README.md", "exec"), {})  # it asserts its own claim (tokens equal AR's)
    finally:
        torch.set_num_threads(threads)
