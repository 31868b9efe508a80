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


def eagle3_drafter(target):
    """A random-weight EAGLE-3 head (one layer, 4 heads of 8) over `target`'s last hidden states, in its dtype."""
    from ecospec.drafters.eagle3 import Eagle3Config, Eagle3Drafter, Eagle3Head, init_random_weights

    cfg = target.config
    head = Eagle3Head(
        Eagle3Config(
            hidden_size=cfg.hidden_size,
            intermediate_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            vocab_size=cfg.vocab_size,
            draft_vocab_size=cfg.vocab_size,
            target_hidden_size=cfg.hidden_size,
            aux_hidden_layers=(0, 1, 2),
        )
    )
    init_random_weights(head, std=0.3, seed=0)
    return Eagle3Drafter(head.to(target.dtype), target.get_input_embeddings())


def batch_predictor(target):
    """A learned expert predictor of random weights for `target` (float64)."""
    from transformers import Qwen3Config

    from ecospec.predictor import ExpertPredictor

    torch.manual_seed(0)
    backbone = Qwen3Config(
        vocab_size=8,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=512,
        attn_implementation="sdpa",
    )
    return ExpertPredictor.from_target(target, backbone, dtype=torch.float64)
