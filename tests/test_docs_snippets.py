"""The library page's snippets run as shown: a reader can paste them (docs/engine.md, "The engine in one call" and
the compiled engine's, which continues the first)."""

import re

import pytest
import torch
from docs_pages import ROOT


def run_snippets(count: int) -> dict:
    """The first `count` Python snippets of docs/engine.md, run one after another in one namespace."""
    snippets = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "engine.md").read_text(), flags=re.S)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls (conftest): more threads only slow a busy machine
    scope: dict = {}
    try:
        for i, snippet in enumerate(snippets[:count], 1):
            exec(compile(snippet, f"docs/engine.md, snippet {i}", "exec"), scope)
    finally:
        torch.set_num_threads(threads)
    return scope


def test_engine_page_snippet_runs():
    assert run_snippets(1)["res"].tokens, "the snippet decoded nothing"


@pytest.mark.compiled
def test_engine_page_compiled_snippet_runs():
    scope = run_snippets(2)
    assert scope["prepared"].compile_s > 0
    assert scope["res"].tokens
