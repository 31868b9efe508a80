"""The embedded default's corpus, tokenizer, target trainer, routing statistics and build cache."""

import importlib
import json
import math
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

import ecospec
from ecospec.cache import cache_root
from ecospec.data import humaneval_prompts
from ecospec.models import tiny_model
from ecospec.tiny.budgets import BUDGETS, Budget, get_budget
from ecospec.tiny.corpus import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    encode_documents,
    load_corpus,
    stdlib_files,
    train_tokenizer,
)
from ecospec.tiny.drafter import stream_windows
from ecospec.tiny.stages import StageSpec
from ecospec.tiny.target import (
    TargetRecipe,
    check_routing,
    eval_batches,
    routing_load_stats,
    routing_stats_from_routes,
    train_target,
)

# the modules (``ecospec.tiny.build`` the attribute is the build function)
tiny_build = importlib.import_module("ecospec.tiny.build")
tiny_target = importlib.import_module("ecospec.tiny.target")
MICRO = BUDGETS["micro"]


@pytest.fixture(scope="module")
def micro_data():
    corpus = load_corpus(MICRO.corpus.max_bytes, MICRO.corpus.val_every)
    tok = train_tokenizer(corpus.train, MICRO.corpus.vocab_size)
    return corpus, tok, encode_documents(tok, corpus.train), encode_documents(tok, corpus.val)


# ------------------------------------------------------------------------------------------------ corpus


def test_stdlib_file_list_sorted_capped_no_tests():
    everything = stdlib_files(1 << 40)
    files = stdlib_files(2_000_000)
    names = [f for f, _ in files]
    assert names == sorted(names) and len(names) == len(set(names))
    assert names == [f for f, _ in everything[: len(names)]]  # a prefix of the full sorted list
    assert sum(s for _, s in files) <= 2_000_000 < sum(s for _, s in everything)
    for name in [f for f, _ in everything]:
        parts = name.split("/")
        assert not {"test", "tests", "idle_test", "site-packages"} & set(parts[:-1]), name
        assert not parts[-1].startswith("test_") and not parts[-1].startswith("_sysconfigdata"), name
        assert name.endswith(".py")
    assert any(name.startswith("asyncio/") for name, _ in everything)


def test_stdlib_file_rules_on_synthetic_tree(tmp_path):
    files = {
        "a.py": 10,
        "b/c.py": 10,
        "b/test_c.py": 10,
        "test/x.py": 10,
        "lib2to3/tests/data/y.py": 10,
        "idlelib/idle_test/z.py": 10,
        "tkinter/test/w.py": 10,
        "site-packages/pkg/m.py": 10,
        "_sysconfigdata__linux.py": 10,
        "config-3.11-x86_64/python-config.py": 10,
        "encodings/cp1252.py": 10,
        "d.txt": 10,
        "e.py": 30,
        "f.py": 10,
    }
    for name, size in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"#" * size)
    assert stdlib_files(10_000, tmp_path) == [("a.py", 10), ("b/c.py", 10), ("e.py", 30), ("f.py", 10)]
    assert stdlib_files(49, tmp_path) == [("a.py", 10), ("b/c.py", 10)]  # e.py would cross the cap: stop there


def test_corpus_deterministic_and_split():
    a = load_corpus(400_000, val_every=4)
    b = load_corpus(400_000, val_every=4)
    assert a.sha256 == b.sha256 and len(a.sha256) == 64
    assert a.files == b.files and a.train == b.train
    assert a.num_bytes <= 400_000 and len(a.files) == len(a.train) + len(a.val)
    assert a.val_files == a.files[2::4]
    assert load_corpus(300_000, val_every=4).sha256 != a.sha256
    meta = a.metadata()
    assert meta["num_files"] == len(a.files) and meta["num_bytes"] == a.num_bytes


# --------------------------------------------------------------------------------------------- tokenizer


def test_tokenizer_round_trip_and_autotokenizer(micro_data, tmp_path):
    from transformers import AutoTokenizer

    corpus, tok, _, _ = micro_data
    assert len(tok) == MICRO.corpus.vocab_size
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (PAD_ID, BOS_ID, EOS_ID)
    text = 'def f(x):\n    """Docstring: é ∑ 🙂."""\n\treturn {"a": x ** 2}  # done\r\n'
    ids = tok(text)["input_ids"]
    assert ids[0] == BOS_ID and BOS_ID not in ids[1:]
    assert tok.decode(ids, skip_special_tokens=True) == text
    tok.save_pretrained(tmp_path / "tok")
    loaded = AutoTokenizer.from_pretrained(tmp_path / "tok")
    assert loaded(text)["input_ids"] == ids and loaded.decode(ids[1:]) == text
    sample = corpus.val[0][:2000]
    assert len(tok(sample)["input_ids"]) < 0.9 * len(sample.encode())  # merges learned: fewer tokens than bytes
    # deterministic: same texts -> same vocabulary and merges
    again = train_tokenizer(corpus.train, MICRO.corpus.vocab_size)
    assert again.backend_tokenizer.to_str() == tok.backend_tokenizer.to_str()


def test_encode_documents_stream(micro_data):
    _, tok, _, _ = micro_data
    stream = encode_documents(tok, ["x = 1\n", "y = 2\n"])
    assert stream.dtype == np.uint16
    docs = np.split(stream, np.where(stream == EOS_ID)[0] + 1)[:-1]
    assert len(docs) == 2 and all(d[0] == BOS_ID and d[-1] == EOS_ID for d in docs)
    assert tok.decode(docs[1][1:-1].tolist()) == "y = 2\n"


# ------------------------------------------------------------------------------------------------ target


def test_micro_target_training_lowers_loss(micro_data):
    _, tok, train, val = micro_data
    recipe = replace(MICRO.target, steps=40)
    model, m = train_target(recipe, train, val, len(tok))
    assert type(model).__name__ == "Qwen3MoeForCausalLM" and not model.training
    assert m["heldout_loss_init"] == pytest.approx(math.log(len(tok)), abs=0.5)
    assert m["heldout_loss"] < m["heldout_loss_init"] - 1.0
    stats = m["routing"]
    assert len(stats["loads"]) == recipe.num_layers and len(stats["loads"][0]) == recipe.num_experts
    assert all(sum(row) == stats["num_tokens"] * recipe.top_k for row in stats["loads"])
    assert set(m["recipe"]) == set(TargetRecipe.__dataclass_fields__)
    # same recipe and data -> same weights
    model2, _ = train_target(replace(recipe, steps=3), train, val, len(tok))
    model3, _ = train_target(replace(recipe, steps=3), train, val, len(tok))
    for p, q in zip(model2.parameters(), model3.parameters(), strict=True):
        assert torch.equal(p, q)


def test_routing_stats_synthetic():
    # 2 layers, N = 4 experts, k = 2; two sequences of 4 tokens each.
    # layer 0: every token -> {0, 1}; consecutive overlap 1, loads [8, 8, 0, 0]
    # layer 1: sets alternate {0, 1}, {2, 3}: overlap 0, loads [4, 4, 4, 4]
    a, b = [0, 1], [2, 3]
    layer0 = torch.tensor([[a, a, a, a], [a, a, a, a]])
    layer1 = torch.tensor([[a, b, a, b], [b, a, b, a]])
    routes = torch.stack([layer0, layer1])  # [L=2, B=2, T=4, k=2]
    s = routing_stats_from_routes(routes, num_experts=4)
    assert s["loads"] == [[8, 8, 0, 0], [4, 4, 4, 4]]
    assert s["num_tokens"] == 8
    assert s["min_share"] == [0.0, 0.25] and s["max_share"] == [0.5, 0.25]
    assert s["max_over_mean"] == [2.0, 1.0]
    ov = s["overlap"]
    assert ov["empirical_per_layer"] == [1.0, 0.0]
    # pi = k * share: layer 0 [1, 1, 0, 0] -> sum pi^2 / k = 1; layer 1 [.5] * 4 -> 0.5
    assert ov["independence_per_layer"] == pytest.approx([1.0, 0.5])
    assert ov["empirical"] == pytest.approx(0.5) and ov["independence"] == pytest.approx(0.75)
    assert ov["uniform"] == 0.5
    # pairs never cross sequences: the same tokens as one sequence of 8 add one {0,1}->{2,3}... pair
    flat = routing_stats_from_routes(routes.reshape(2, 1, 8, 2), num_experts=4)
    assert flat["overlap"]["empirical_per_layer"][1] == pytest.approx(1 / 7)
    # a list of per-batch tensors (different lengths) is the same as their union
    parts = [routes[:, :1], routes[:, 1:, :3]]
    s2 = routing_stats_from_routes(parts, num_experts=4)
    assert s2["num_tokens"] == 7
    assert s2["overlap"]["empirical_per_layer"] == pytest.approx([1.0, 0.0])
    assert check_routing(s, min_share=0.001, max_over_mean=5.0) == [
        "layer 0: an expert gets 0.0000% of routed tokens (< 0.10%)"
    ]
    assert check_routing(s, min_share=0.0, max_over_mean=1.5) == [
        "layer 0: busiest expert at 2.00x the mean load (> 1.5x)"
    ]


def test_routing_load_stats_on_a_model():
    from ecospec.engine.routing import RoutingCapture

    model = tiny_model("qwen3_moe-a")
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(3, 256, (3, 16), generator=g), torch.randint(3, 256, (2, 9), generator=g)]
    s = routing_load_stats(model, batches)
    routes = []
    with torch.no_grad(), RoutingCapture(model) as cap:
        for x in batches:
            for row in x:  # one sequence at a time: [L, T, k]
                model(input_ids=row[None])
                routes.append(cap.take())
    ref = routing_stats_from_routes(routes, num_experts=8)
    assert s["loads"] == ref["loads"] and s["num_tokens"] == 3 * 16 + 2 * 9
    assert s["overlap"]["empirical_per_layer"] == pytest.approx(ref["overlap"]["empirical_per_layer"])
    assert s["overlap"]["uniform"] == 2 / 8


def test_eval_batches_spread():
    ids = np.arange(1000, dtype=np.uint16)
    batches = eval_batches(ids, seq_len=10, max_tokens=100, batch_size=4)
    windows = torch.cat(batches)
    assert windows.shape == (10, 10) and [b.shape[0] for b in batches] == [4, 4, 2]
    assert windows[:, 0].tolist() == list(range(0, 1000, 100))


# ------------------------------------------------------------------------------------------------- build


def _check_generated_windows(target, stream):
    """The GTO stage's texts: seeded train-split prompts, each continued by the target's greedy choice (checked
    by one teacher-forced forward: every continuation token is the argmax, end-of-text aside, up to float noise)."""
    from ecospec.tiny.budgets import GtoRecipe
    from ecospec.tiny.gto import generated_windows

    r = GtoRecipe(seq_len=24, prompt_len=8, train_windows=5, gen_batch=2)
    texts = generated_windows(target, stream, r)
    prompts = stream_windows(stream, r.prompt_len, r.train_windows, r.seed)
    assert [t.shape[0] for t in texts] == [24] * 5
    assert all(torch.equal(t[:8], p) for t, p in zip(texts, prompts, strict=True))
    with torch.no_grad():
        logits = target(torch.stack(texts)).logits[:, 7:-1].float()
    logits[..., EOS_ID] = -float("inf")  # the stage suppresses end-of-text so every text is full length
    chosen = logits.gather(-1, torch.stack(texts)[:, 8:, None])[..., 0]
    assert (chosen >= logits.max(-1).values - 1e-4).all()


def test_build_cache_reuse(tmp_path, monkeypatch, capsys):
    from transformers import AutoTokenizer

    monkeypatch.setenv("ECOSPEC_CACHE", str(tmp_path))
    first = tiny_build.build("micro", progress=False, threads=1)
    root = tmp_path / f"tiny-{tiny_build.version('micro')}"
    assert first["root"] == str(root) and tiny_build.paths("micro")["root"] == root
    default = [st.name for st in tiny_build.STAGES if not st.optional]
    assert list(first["stages"]) == default and "gto" not in default  # optional stages only on request
    assert [s["status"] for s in first["stages"].values()] == ["built"] * len(default)
    for name in ("corpus", "target", "drafter", "traces", "predictor", "evaluate", "calibrate"):
        done = json.loads((root / name / "done.json").read_text())
        assert done["stage"] == name and done["seconds"] >= 0
    cal = first["stages"]["calibrate"]["metrics"]  # the head's draft temperature, one per depth, fitted
    assert len(cal["temperature"]) == 3 and all(t > 0 for t in cal["temperature"]) and cal["samples"] > 0
    assert cal["nll_after"] <= cal["nll_before"] + 1e-9
    target_metrics = first["stages"]["target"]["metrics"]
    assert target_metrics["heldout_loss"] < target_metrics["heldout_loss_init"]
    assert first["stages"]["corpus"]["metrics"]["sha256"]

    def boom(*args, **kwargs):
        raise AssertionError("retrained although cached")

    monkeypatch.setattr(tiny_target, "train_target", boom)
    t0 = time.perf_counter()
    second = tiny_build.build("micro", progress=False, threads=1)
    assert time.perf_counter() - t0 < 5
    assert [s["status"] for s in second["stages"].values()] == ["cached"] * len(default)
    assert second["stages"]["target"]["metrics"] == target_metrics
    assert not list(root.glob(".*tmp*"))
    gto = tiny_build.build("micro", until="gto", progress=False, threads=1)  # the optional stage, on request
    assert gto["stages"]["gto"]["status"] == "built" and gto["stages"]["target"]["status"] == "cached"
    assert (root / "gto" / "head" / "config.json").exists()
    assert tiny_build.build("micro", until="gto", progress=False)["stages"]["gto"]["status"] == "cached"
    _check_generated_windows(tiny_build.load_tiny_target("micro", progress=False), np.load(root / "corpus/train.npy"))

    p = tiny_build.paths("micro")
    assert AutoTokenizer.from_pretrained(p["tokenizer"]).bos_token_id == BOS_ID
    model = tiny_build.load_tiny_target("micro", progress=False)
    assert type(model).__name__ == "Qwen3MoeForCausalLM"
    assert model.config.num_experts == MICRO.target.num_experts
    assert tiny_build.load_tiny_tokenizer("micro", progress=False).eos_token_id == EOS_ID
    st = tiny_build.status("micro")
    assert {s["status"] for s in st["stages"].values()} == {"done"}
    from ecospec.tiny.__main__ import main

    assert main(["info", "--budget", "micro"]) == 0
    assert main(["build", "--budget", "micro", "--quiet", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "held-out loss" in out and str(root) in out

    # a recipe that differs only downstream: new root, corpus and target copied, not retrained
    other = replace(MICRO, evaluate=replace(MICRO.evaluate, prompts=1))
    third = tiny_build.build(other, progress=False, threads=1)
    assert third["root"] != first["root"]
    assert [s["status"] for s in third["stages"].values()] == ["copied"] * 5 + ["built"] * 2  # evaluate, calibrate
    monkeypatch.undo()


def test_build_stage_failure_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("ECOSPEC_CACHE", str(tmp_path))

    def fail(ctx):
        (ctx.out / "partial").write_text("x")
        raise RuntimeError("stage failed")

    stages = [tiny_build.STAGES[0], tiny_build.Stage(StageSpec("broken"), fail)]
    monkeypatch.setattr(tiny_build, "STAGES", stages)
    with pytest.raises(RuntimeError, match="stage failed"):
        tiny_build.build("micro", progress=False, threads=1)
    root = tiny_build.paths("micro")["root"]
    assert (root / "corpus" / "done.json").exists()
    assert not (root / "broken").exists() and not list(root.glob(".broken*"))


def test_budgets_and_versions(monkeypatch, tmp_path):
    monkeypatch.setenv("ECOSPEC_CACHE", str(tmp_path))
    assert cache_root() == tmp_path
    versions = {tiny_build.version(name) for name in BUDGETS}
    assert len(versions) == len(BUDGETS)
    assert tiny_build.version("full") == tiny_build.version(Budget("full"))
    full = BUDGETS["full"].target
    assert tiny_build.version(replace(BUDGETS["full"], target=replace(full, steps=1))) != tiny_build.version("full")
    assert full.num_experts >= 32 and full.top_k >= 4 and full.num_layers >= 4
    monkeypatch.delenv("ECOSPEC_CACHE")
    assert cache_root() == Path.home() / ".cache" / "ecospec"
    with pytest.raises(ValueError, match="unknown budget"):
        get_budget("huge")


# --------------------------------------------------------------------------------------------- humaneval


def test_humaneval_prompts_offline():
    prompts = humaneval_prompts()
    assert len(prompts) == 164
    assert prompts[0]["task_id"] == "HumanEval/0" and prompts[-1]["task_id"] == "HumanEval/163"
    assert all(set(p) == {"task_id", "prompt"} and p["prompt"].strip() for p in prompts)
    assert "def " in prompts[0]["prompt"]
    assert len(humaneval_prompts(limit=5)) == 5


# ------------------------------------------------------------------------------------------------- slow


@pytest.mark.slow
def test_build_small_end_to_end(tmp_path, monkeypatch):
    monkeypatch.setenv("ECOSPEC_CACHE", str(tmp_path))
    summary = tiny_build.build("small", progress=False)
    m = summary["stages"]["target"]["metrics"]
    assert m["heldout_loss"] < 0.75 * m["log_vocab"]
    assert not m["routing_violations"]
    ov = m["routing"]["overlap"]
    assert ov["empirical"] > ov["independence"] > 0
    model = tiny_build.load_tiny_target("small", progress=False)
    tok = tiny_build.load_tiny_tokenizer("small", progress=False)
    ids = tok(humaneval_prompts(limit=1)[0]["prompt"], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    loss = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:]).item()
    assert loss < m["log_vocab"]
    # the drafter, predictor and evaluation stages, and one EcoSpec generation end to end
    ev = summary["stages"]["evaluate"]["metrics"]["methods"]
    assert all(x["matches_ar"] == 1.0 for x in ev.values())
    pm = summary["stages"]["predictor"]["metrics"]
    assert pm["accuracy"] > 2 * pm["chance"]
    from ecospec.components import load_build
    from ecospec.tiny.evaluate import humaneval_ids

    target, tokenizer, drafter, predictor = load_build(tiny_build.paths("small"))
    ids = humaneval_ids(tokenizer, 1)[0]
    ar = ecospec.generate(target, ids, max_new_tokens=24)
    sd = ecospec.generate(target, ids, drafter=drafter, selector="ecospec", predictor=predictor, max_new_tokens=24)
    assert sd.tokens == ar.tokens and sd.alpha > 1.0 and all(s.t_pred > 0 for s in sd.steps)


def test_sorted_experts_kernel_is_the_eager_loop_and_deterministic_on_two_threads():
    """The training kernel computes what the decode-time per-expert loop computes (outputs and gradients), and
    two runs of it on 2 threads give the same weights (transformers' grouped_mm does not on a 2-core CPU)."""
    from ecospec.models import tiny_model
    from ecospec.tiny.experts import NAME

    x = torch.randn(2, 24, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    grads = {}
    for impl in ("eager", NAME):
        model = tiny_model("qwen3_moe-b", experts_implementation=impl, dtype=torch.float64).train()
        out = model(inputs_embeds=x).logits
        out.square().mean().backward()
        grads[impl] = (out.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None])
    (a, ga), (b, gb) = grads.values()
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    for p, q in zip(ga, gb, strict=True):
        torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12)

    def train(threads: int) -> list[torch.Tensor]:
        old = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            model = tiny_model("qwen3_moe-b", experts_implementation=NAME).train()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
            gen = torch.Generator().manual_seed(1)
            for _ in range(3):
                ids = torch.randint(3, 256, (4, 64), generator=gen)
                model(input_ids=ids, labels=ids).loss.backward()
                opt.step()
                opt.zero_grad()
            return [p.detach().clone() for p in model.parameters()]
        finally:
            torch.set_num_threads(old)

    assert all(torch.equal(p, q) for p, q in zip(train(2), train(2), strict=True))


def test_seed_budgets_are_the_full_recipe_with_every_seed_moved():
    """The across-builds study's builds (benchmarks/studies/across_builds.py): the full recipe, each stage's seed
    moved, so another draw of the same weights; never the release."""
    full, one = BUDGETS["full"], BUDGETS["full-seed1"]
    for stage in ("target", "drafter", "traces", "predictor"):
        assert getattr(one, stage).seed == getattr(full, stage).seed + 1000, stage
        assert replace(getattr(one, stage), seed=getattr(full, stage).seed) == getattr(full, stage), stage
    assert one.corpus == full.corpus and one.evaluate == full.evaluate
    assert tiny_build.source("full-seed1") == "cache" and tiny_build.source("full") == "release"
