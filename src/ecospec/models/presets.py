"""Tiny configurations of the real HF MoE architectures, for tests and CPU experiments: every family's presets
(`ecospec.families`, where each family's module lists and describes its own). Each entry is a ``model_type`` plus
keyword arguments for that family's config class (the real architecture code runs; only the sizes are tiny). A
forward over 64 tokens takes milliseconds on CPU. Token ids: pad 0, bos 1, eos 2 (vocab 256).
"""

from __future__ import annotations

from ecospec.families import presets

PRESETS: dict[str, dict] = presets()
