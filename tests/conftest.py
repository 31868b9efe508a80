import pytest
import torch

from ecospec.models.loading import perturbed_copy, tiny_model

# Tiny models gain nothing from intra-op threads, and OpenMP spinning on a loaded 2-core machine
# slows small matmuls by orders of magnitude.
torch.set_num_threads(1)

FAMILY_PRESETS = [
    "qwen3_moe-a",
    "qwen3_moe-b",
    "gpt_oss-a",
    "gpt_oss-b",
    "deepseek_v3-a",
    "deepseek_v3-b",
    "mixtral-a",
    "mixtral-b",
]


@pytest.fixture(scope="session")
def models64():
    """Tiny targets in float64 (exact comparisons) and perturbed copies as draft models."""
    cache = {}

    def get(preset: str, scale: float = 0.1):
        key = (preset, scale)
        if key not in cache:
            target = tiny_model(preset, seed=0, dtype=torch.float64)
            cache[key] = (target, perturbed_copy(target, scale=scale, seed=1))
        return cache[key]

    return get


def prompt(n: int, vocab: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (1, n), generator=g)


@pytest.fixture
def no_release_traces(tmp_path, monkeypatch):
    """Report tests on synthetic tiny records: an empty cache build stands in for the embedded default, so that the
    report finds no corpus traces instead of tracing the release on first use (tiny.build, ~35 s)."""
    monkeypatch.setenv("ECOSPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("ECOSPEC_TINY", "cache")
