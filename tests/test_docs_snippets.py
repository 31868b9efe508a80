"""The library page's first snippet runs as shown: a reader can paste it (docs/engine.md, "The engine in one call")."""

import re

import torch
from docs_pages import ROOT


def test_engine_page_snippet_runs():
    text = (ROOT / "docs" / "engine.md").read_text()
    snippet = re.findall(r"```python\n(.*?)```", text, flags=re.S)[0]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls (conftest): more threads only slow a busy machine
    try:
        scope: dict = {}
        exec(compile(snippet, "docs/engine.md", "exec"), scope)
    finally:
        torch.set_num_threads(threads)
    assert scope["res"].tokens, "the snippet decoded nothing"
