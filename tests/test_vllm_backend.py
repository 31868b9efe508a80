"""The vLLM side's pure parts, in the default suite (no vLLM needed): server and speculative arguments, the dataset
text that must tokenize back to the cell's ids, the summary from bench result files, the metadata shim."""

from __future__ import annotations

import importlib.metadata as md
import json

import pytest

from ecospec.vllm_backend.args import server_args, speculative_config
from ecospec.vllm_backend.env import _shim
from ecospec.vllm_backend.routes import decode_routes
from ecospec.vllm_backend.summary import cell_summary

SETTINGS = {"served_name": "m", "dtype": "bfloat16", "tp": 4, "max_model_len": 4096, "enforce_eager": False}


def test_the_methods_speculative_configs_draft_gamma_minus_one_tokens():
    assert speculative_config("ar", 4, None) is None
    assert speculative_config("eagle3", 4, "/h") == {"method": "eagle3", "model": "/h", "num_speculative_tokens": 3}
    assert speculative_config("draft", 6, "d")["method"] == "draft_model"
    assert speculative_config("mtp", 2, None) == {"method": "mtp", "num_speculative_tokens": 1}
    ngram = speculative_config("ngram", 4, None)
    assert ngram["method"] == "ngram" and ngram["prompt_lookup_max"] >= ngram["prompt_lookup_min"] >= 1


def test_server_args_carry_the_settings_that_change_what_is_measured():
    gpu = server_args({**SETTINGS, "extra_args": ["--max-num-seqs", 8]}, "eagle3", 4, "/h", 7, cpu=False)
    for flag, value in (
        ("--dtype", "bfloat16"),
        ("--tensor-parallel-size", "4"),
        ("--max-model-len", "4096"),
        ("--seed", "7"),
        ("--served-model-name", "m"),
    ):
        assert gpu[gpu.index(flag) + 1] == value
    assert "--no-enable-prefix-caching" in gpu and "--enforce-eager" not in gpu and gpu[-2:] == ["--max-num-seqs", "8"]
    assert json.loads(gpu[gpu.index("--speculative-config") + 1])["num_speculative_tokens"] == 3
    cpu = server_args({**SETTINGS, "enforce_eager": True}, "ar", 4, None, 0, cpu=True, kv_bytes=123 << 20)
    assert "--enforce-eager" in cpu and "--speculative-config" not in cpu and "--gpu-memory-utilization" not in cpu
    assert cpu[cpu.index("--kv-cache-memory-bytes") + 1] == str(123 << 20)
    fixed = server_args({**SETTINGS, "cpu_kv_cache_mib": 40}, "ar", 4, None, 0, cpu=True, kv_bytes=123 << 20)
    assert fixed[fixed.index("--kv-cache-memory-bytes") + 1] == str(40 << 20)  # the setting wins


def test_cpu_kv_cache_is_sized_from_the_cell_not_the_node():
    from ecospec.vllm_backend.args import kv_cache_bytes

    tiny = {
        "num_hidden_layers": 20,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "hidden_size": 64,
        "num_attention_heads": 2,
    }
    per_token = 2 * 21 * 1 * 32 * 4  # K and V, 20 target layers + the head's, fp32
    assert kv_cache_bytes(tiny, 2048, 4, "float32") == 2 * per_token * 2048 * 4  # x2 margin: 84 MiB
    assert kv_cache_bytes(tiny, 2048, 8, "float32") == 2 * kv_cache_bytes(tiny, 2048, 4, "float32")
    assert kv_cache_bytes(tiny, 128, 1, "bfloat16") == 64 << 20  # the floor


def _round(tpot_ms: float, accepted: int | None = None) -> dict:
    r = {
        "mean_tpot_ms": tpot_ms,
        "median_tpot_ms": tpot_ms,
        "mean_ttft_ms": 10.0,
        "output_throughput": 1000 / tpot_ms,
        "completed": 8,
        "total_output_tokens": 512,
    }
    if accepted is not None:
        r.update(
            spec_decode_acceptance_length=1 + accepted / 100,
            spec_decode_num_drafts=100,
            spec_decode_draft_tokens=300,
            spec_decode_accepted_tokens=accepted,
            spec_decode_per_position_acceptance_rates=[0.8, 0.5, 0.3],
        )
    return r


def test_summary_divides_ar_tpot_by_the_methods_and_reads_acceptance():
    s = cell_summary("eagle3", [_round(5.0, 160), _round(7.0, 140)], [_round(9.0), _round(11.0)], 4)
    assert s["tpot_s"] == pytest.approx(0.006) and s["ar_tpot_s"] == pytest.approx(0.010)
    assert s["speedup"] == pytest.approx(10 / 6) and s["batch_size"] == 4 and s["rounds"] == 2
    assert s["alpha"] == pytest.approx(1 + 300 / 200)  # accepted draft tokens / drafts, the bonus token counted
    assert s["acceptance_by_position"] == pytest.approx([0.8, 0.5, 0.3]) and s["requests"] == 16
    ar = cell_summary("ar", [_round(9.0)], [], 1)
    assert ar["speedup"] == 1.0 and ar["alpha"] == 1.0


def test_the_shim_makes_vllms_own_metadata_lookups_answer(tmp_path):
    site = tmp_path / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    info = _shim(tmp_path, "0.32.0")
    dist = next(md.distributions(name="vllm", path=[str(site)]))
    assert dist.version == "0.32.0+cpu" and dist.metadata["Name"] == "vllm"  # vLLM's CPU platform check: "+cpu"
    _shim(tmp_path, "0.32.1")  # a second run replaces its own shim, nothing else
    assert not info.exists() and [d.version for d in md.distributions(name="vllm", path=[str(site)])] == ["0.32.1+cpu"]


def test_dataset_texts_tokenize_back_to_the_cells_ids():
    """What the server receives: the ids decoded minus the special tokens its tokenizer adds itself."""
    from ecospec.data import load_prompts
    from ecospec.experiment.vllm_cell import dataset_prompts
    from ecospec.models.byte_tokenizer import byte_tokenizer

    tok = byte_tokenizer()
    texts, ids = dataset_prompts(False, tok, load_prompts("humaneval", 3, None, split="heldout"))
    assert all(x[0] == tok.bos_token_id for x in ids)  # the HF engine's encoding: bos, then the text
    assert [tok(t, add_special_tokens=True).input_ids for t in texts] == ids


def test_a_tokenizer_that_adds_bos_itself_gets_the_text_without_it():
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    from ecospec.data import load_prompts
    from ecospec.experiment.vllm_cell import dataset_prompts
    from ecospec.models.byte_tokenizer import byte_tokenizer

    backend = byte_tokenizer().backend_tokenizer
    backend.post_processor = processors.TemplateProcessing(single="<|bos|> $A", special_tokens=[("<|bos|>", 1)])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<|bos|>", eos_token="<|eos|>", pad_token="<|pad|>"
    )
    texts, ids = dataset_prompts(False, tok, load_prompts("humaneval", 2, None))
    assert not any(t.startswith("<|bos|>") for t in texts)
    assert [tok(t).input_ids for t in texts] == ids and all(x.count(1) == 1 for x in ids)


def test_routed_experts_decode_from_the_servers_base64_npy():
    """vLLM sends `routed_experts` as a base64 `.npy` of the narrowest int dtype; we read [tokens, layers, k]."""
    import base64
    import io

    import numpy as np

    routes = np.random.default_rng(0).integers(0, 128, size=(7, 4, 8)).astype(np.uint8)
    buf = io.BytesIO()
    np.save(buf, routes, allow_pickle=False)
    got = decode_routes(base64.b64encode(buf.getvalue()).decode("ascii"))
    assert got.dtype == np.int64 and (got == routes).all()
    buf = io.BytesIO()
    np.save(buf, routes[0], allow_pickle=False)
    with pytest.raises(ValueError, match=r"\[tokens, MoE layers, k\], got shape \(4, 8\)"):
        decode_routes(base64.b64encode(buf.getvalue()).decode("ascii"))
