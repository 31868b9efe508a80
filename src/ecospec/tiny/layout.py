"""Where the released embedded default lives (package data) and the name of its manifest: plain paths, importable
without torch, for what reads the release's files without loading it (the cost model)."""

from pathlib import Path

RELEASE_DIR = Path(__file__).with_name("release")
MANIFEST = "manifest.json"
