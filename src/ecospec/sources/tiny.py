"""tiny: the embedded default, a Qwen3-MoE target trained on CPU by the package's recipe (`ecospec.tiny`), with its
EAGLE-3 head, GTO head, expert predictor and draft calibration; released with the package, or built into the cache
where the release does not match this machine's recipe."""

from __future__ import annotations

from collections.abc import Mapping

from ecospec.sources import Source, TinyDirs, dtype_of, register
from ecospec.tiny.budgets import get_budget


def load_trained(path, **kwargs):
    """A trained tiny target from its HF folder, in eval mode, as every caller decodes with it: SDPA attention and
    the eager experts loop unless `kwargs` say otherwise (the build's batched stages pick the sorted kernel)."""
    from transformers import AutoModelForCausalLM

    kwargs.setdefault("attn_implementation", "sdpa")
    kwargs.setdefault("experts_implementation", "eager")
    return AutoModelForCausalLM.from_pretrained(path, **kwargs).eval()


def config(model: Mapping) -> dict:
    """The recipe's target config (the requested BPE vocabulary: a build's tokenizer fills it on the full corpus)."""
    budget = get_budget(model.get("budget", "full"))
    return budget.target.hf_config(budget.corpus.vocab_size)


def load(model: Mapping, device, dirs_of: TinyDirs, mode: str):
    from transformers import AutoTokenizer

    dirs = dirs_of(model)
    tokenizer = AutoTokenizer.from_pretrained(dirs["corpus"] / "tokenizer")
    if mode != "device_map":
        from ecospec.models import load_target

        target = load_target(
            str(dirs["target"] / "model"),
            dtype=dtype_of(model.get("dtype")),
            attn_implementation="sdpa",
            experts_implementation="eager",
            parallel=mode,
        )
        return target, tokenizer
    target = load_trained(dirs["target"] / "model", dtype=dtype_of(model.get("dtype")))
    return target.to(device), tokenizer


SOURCE = register(
    Source(
        name="tiny",
        builtin=True,
        real=False,
        config=config,
        load=load,
        checkpoint=lambda model, dirs_of: str(dirs_of(model)["target"] / "model"),
        order=10,
    )
)
