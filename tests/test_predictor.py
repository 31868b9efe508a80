"""Expert predictor: tree inference equals sequential, traces resume, training learns, checkpoints."""

import json

import numpy as np
import pytest
import torch
from conftest import prompt
from safetensors.torch import load_file, save_file
from transformers import Qwen3Config

import ecospec
from ecospec.drafters.draft_model import DraftModelDrafter
from ecospec.engine.routing import RoutingCapture, expert_bitmasks
from ecospec.engine.tree import grow_tree
from ecospec.models import tiny_model
from ecospec.predictor import (
    CheckpointMismatchError,
    ExpertPredictor,
    Traces,
    collect_traces,
    evaluate,
    load_traces,
    topk_accuracy,
    train_predictor,
)
from ecospec.predictor.traces import route_batch
from ecospec.predictor.train import split_samples, windows


def backbone_config(**overrides) -> Qwen3Config:
    kwargs = dict(
        vocab_size=8,  # unused: the predictor feeds embeddings
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=512,
        initializer_range=0.2,
        attn_implementation="sdpa",  # float64 softmax (eager softmaxes in float32)
    )
    return Qwen3Config(**(kwargs | overrides))


@pytest.fixture(scope="module")
def setup64(models64):
    target, draft = models64("qwen3_moe-a")
    torch.manual_seed(0)
    return target, draft, ExpertPredictor.from_target(target, backbone_config(), dtype=torch.float64)


def random_sequences(n: int, length: int, vocab: int = 256, seed: int = 0) -> list[list[int]]:
    g = np.random.default_rng(seed)
    return [g.integers(3, vocab, size=int(length)).tolist() for _ in range(n)]


def test_forward_shapes(setup64):
    target, _, p = setup64
    ids = prompt(7, 256).repeat(2, 1)
    logits = p(ids)
    assert logits.shape == (2, 7, 2, 8)  # [B, T, L, N]
    emb = target.get_input_embeddings()(ids)
    torch.testing.assert_close(p(embeds=emb), logits, rtol=0, atol=0)
    with pytest.raises(ValueError, match="exactly one"):
        p(ids, embeds=emb)


def test_tree_scores_equal_sequential(setup64):
    """Every node's logits from one tree forward equal a fresh causal forward over its path, also on a
    second step that reuses the cached context."""
    target, draft, p = setup64
    drafter = DraftModelDrafter(draft)
    seq = prompt(12, 256, seed=4)

    def check(new_tokens, seq):
        tree = grow_tree(*drafter.begin(new_tokens, None, 2), drafter.expand, 3)
        scores = p.score_rows([new_tokens[0]], [tree])[0]
        assert scores.shape == (len(tree) + 1, 2, 8)
        torch.testing.assert_close(scores[0], p(seq)[0, -1], rtol=1e-10, atol=1e-10)
        for node in range(len(tree)):
            path = torch.tensor([[tree.tokens[i] for i in tree.path(node)]])
            expect = p(torch.cat([seq, path], 1))[0, -1]
            torch.testing.assert_close(scores[node + 1], expect, rtol=1e-10, atol=1e-10)
        return tree

    drafter.reset()
    p.reset()
    tree = check(seq, seq)
    deepest = len(tree) - 1
    accepted = torch.tensor([[tree.tokens[i] for i in tree.path(deepest)] + [7]])  # accepted path + bonus
    check(accepted, torch.cat([seq, accepted], 1))

    # predict = per-layer top-k of the same scores, as bitmasks
    drafter.reset()
    p.reset()
    tree = grow_tree(*drafter.begin(seq, None, 2), drafter.expand, 3)
    root_mask, node_masks = p.predict(seq, tree)
    p.reset()
    routes = p.score_rows([seq[0]], [tree])[0].topk(2, dim=-1).indices.transpose(0, 1)
    assert [root_mask] + node_masks == expert_bitmasks(routes, 8)
    assert all(m.bit_count() == 2 * 2 for m in node_masks)


def test_generate_with_predictor_is_lossless(setup64):
    target, draft, p = setup64
    ids = prompt(10, 256, seed=2)
    ar = ecospec.generate(target, ids, max_new_tokens=16, eos_token_id=[])
    for gamma in (3, 4):
        sd = ecospec.generate(
            target,
            ids,
            drafter=DraftModelDrafter(draft),
            selector="ecospec",
            predictor=p,
            gamma=gamma,
            max_new_tokens=16,
            eos_token_id=[],
        )
        assert sd.tokens == ar.tokens
        assert all(s.t_pred > 0 for s in sd.steps)
        assert any(s.accepted > 1 for s in sd.steps)
        # the predictor saw the prompt, the prefill's token and what every step but the last committed
        assert p.session.slots.n[0] == ids.shape[1] + 1 + sum(s.accepted for s in sd.steps[:-1])


def test_topk_accuracy():
    logits = torch.tensor([[[0.0, 3.0, 2.0, 1.0]], [[5.0, 4.0, 0.0, 1.0]]])  # [T=2, L=1, N=4]
    routes = torch.tensor([[[1, 2]], [[2, 3]]])
    assert topk_accuracy(logits, routes, 2) == pytest.approx(0.5)


def test_traces_round_trip(tmp_path):
    target = tiny_model("qwen3_moe-b")  # dense layers 0 and 2: L = 2 MoE layers, N = 16, k = 4
    seqs = [s[: 3 + 4 * i] for i, s in enumerate(random_sequences(5, 40, seed=1))]
    collect_traces(target, seqs, tmp_path, shard_size=2)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["complete"] and manifest["samples"] == 5 and len(manifest["shards"]) == 3
    tr = load_traces(tmp_path)
    assert tr.routes.dtype == np.uint8 and tr.tokens.dtype == np.int32
    assert (tr.num_samples, tr.num_experts, tr.top_k, tr.moe_layers) == (5, 16, 4, (1, 3))
    for i, seq in enumerate(seqs):
        tokens, routes = tr.sample(i)
        assert tokens.tolist() == seq
        with RoutingCapture(target) as cap:
            target(torch.tensor([seq]))
            assert np.array_equal(routes, cap.take().transpose(0, 1).numpy())


def test_traces_resume_after_kill(tmp_path):
    target = tiny_model("qwen3_moe-a")
    seqs = random_sequences(8, 6, seed=2)
    collect_traces(target, seqs, tmp_path / "ref", shard_size=3)

    def dying():
        for i, s in enumerate(seqs):
            if i == 7:
                raise KeyboardInterrupt
            yield s

    with pytest.raises(KeyboardInterrupt):
        collect_traces(target, dying(), tmp_path / "run", shard_size=3)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["samples"] == 6 and not manifest["complete"]
    assert not list((tmp_path / "run").glob("*.tmp"))
    collect_traces(target, seqs, tmp_path / "run", shard_size=3)
    ref, run = load_traces(tmp_path / "ref"), load_traces(tmp_path / "run")
    for name in ("tokens", "offsets", "routes"):
        assert np.array_equal(getattr(ref, name), getattr(run, name))
    with pytest.raises(ValueError, match="shard size"):
        collect_traces(target, seqs, tmp_path / "run", shard_size=4)


def test_split_and_windows():
    train, test = split_samples(10, 0.2, seed=3)
    assert len(test) == 2 and sorted(train + test) == list(range(10))
    assert split_samples(10, 0.2, seed=3) == (train, test)
    tr = Traces(np.zeros(12, np.int32), np.array([0, 5, 5, 12]), np.zeros((12, 1, 2), np.uint8), 8, 2, (0,))
    assert windows(tr, [0, 1, 2], 4) == [(0, 4), (4, 5), (5, 9), (9, 12)]


def test_training_learns_and_checkpoints(tmp_path):
    target = tiny_model("qwen3_moe-a", num_experts=16)
    collect_traces(target, random_sequences(200, 32, seed=5), tmp_path / "traces", shard_size=64)
    torch.manual_seed(0)
    p = ExpertPredictor.from_target(target, backbone_config(hidden_size=64, intermediate_size=128, num_hidden_layers=1))
    chance = 2 / 16
    s = train_predictor(
        p,
        tmp_path / "traces",
        steps=160,
        lr=1e-3,
        window=32,
        eval_every=40,
        out_dir=tmp_path / "ckpt",
        checkpoint_at_accuracy=(chance + 0.05, 0.99),
    )
    assert s.chance == chance and len(s.losses) == 160 and len(s.test_samples) == 40
    assert np.mean(s.losses[-20:]) < np.mean(s.losses[:20]) - 0.5
    assert s.evals[0][1] < chance + 0.05 and s.final_accuracy > 2.2 * chance
    reasons = [c.reason for c in s.checkpoints]
    assert reasons == [f"accuracy>={chance + 0.05}", "final"]  # 0.99 is never reached
    first = s.checkpoints[0]
    assert first.accuracy >= chance + 0.05 and first.step == next(st for st, a in s.evals if a >= chance + 0.05)
    final = ExpertPredictor.load(tmp_path / "ckpt" / "final")
    assert final.info["heldout_topk_accuracy"] == s.final_accuracy
    tr = load_traces(tmp_path / "traces")
    assert evaluate(final, tr, windows(tr, s.test_samples, 32)) == pytest.approx(s.final_accuracy, abs=1e-6)
    assert json.loads((tmp_path / "ckpt" / "summary.json").read_text())["final_accuracy"] == s.final_accuracy


def test_save_load_and_mismatch(setup64, tmp_path):
    _, _, p = setup64
    p.save(tmp_path / "p", info={"note": "x"})
    q = ExpertPredictor.load(tmp_path / "p")
    ids = prompt(9, 256, seed=6)
    assert q.dtype == torch.float64 and q.config == p.config and q.info == {"note": "x"}
    torch.testing.assert_close(q(ids), p(ids), rtol=0, atol=0)

    weights = load_file(str(tmp_path / "p" / "model.safetensors"))
    del weights["head.bias"]
    save_file(weights, str(tmp_path / "p" / "model.safetensors"))
    with pytest.raises(CheckpointMismatchError, match="missing head.bias"):
        ExpertPredictor.load(tmp_path / "p")
    weights["head.bias"] = torch.zeros(3)
    save_file(weights, str(tmp_path / "p" / "model.safetensors"))
    with pytest.raises(CheckpointMismatchError, match=r"head.bias: shape \(3,\)"):
        ExpertPredictor.load(tmp_path / "p")


def test_killed_training_resumes_to_the_weights_of_an_uninterrupted_run(tmp_path):
    target = tiny_model("qwen3_moe-a", num_experts=16)
    collect_traces(target, random_sequences(40, 24, seed=7), tmp_path / "traces", shard_size=16, batch_size=8)
    tr = load_traces(tmp_path / "traces")

    def fresh():
        torch.manual_seed(0)
        return ExpertPredictor.from_target(target, backbone_config(num_hidden_layers=1))

    kw = dict(
        steps=12,
        lr=1e-3,
        batch_size=4,
        window=16,
        eval_every=3,
        checkpoint_at_accuracy={"lvl": 0.0},
        split=(list(range(30)), list(range(30, 40))),
        resume=True,
        save_every_s=0,
    )
    ref = train_predictor(fresh(), tr, out_dir=tmp_path / "ref", **kw)

    def killed_at(step, steps, loss, acc):
        if step == 8:
            raise KeyboardInterrupt  # a kill between two steps (the state of step 7 is on disk)

    with pytest.raises(KeyboardInterrupt):
        train_predictor(fresh(), tr, out_dir=tmp_path / "run", on_step=killed_at, **kw)
    assert json.loads((tmp_path / "run" / "resume" / "state.json").read_text())["step"] == 7
    run = train_predictor(fresh(), tr, out_dir=tmp_path / "run", **kw)
    assert run.resumed_at == [7] and run.losses == ref.losses and run.evals == ref.evals
    assert [c.name for c in run.checkpoints] == ["lvl", "final"] and run.test_samples == list(range(30, 40))
    a, b = (ExpertPredictor.load(tmp_path / d / "final").state_dict() for d in ("ref", "run"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not (tmp_path / "run" / "resume").exists()  # a finished run keeps no resume state
    assert len(run.layer_accuracy) == 2 and np.mean(run.layer_accuracy) == pytest.approx(run.final_accuracy)
    with pytest.raises(KeyboardInterrupt):
        train_predictor(fresh(), tr, out_dir=tmp_path / "run2", on_step=killed_at, **kw)  # leaves a state
    with pytest.raises(ValueError, match="other data or settings"):
        train_predictor(fresh(), tr, out_dir=tmp_path / "run2", **(kw | {"lr": 2e-3}))


def test_batched_routing_equals_one_forward_per_sequence(models64):
    target, _ = models64("gpt_oss-a")  # sliding windows: padding must not shift any real token's window
    seqs = [s[: 5 + 9 * i] for i, s in enumerate(random_sequences(4, 40, seed=3))]
    batched = route_batch(target, seqs)
    for seq, routes in zip(seqs, batched, strict=True):
        with RoutingCapture(target) as cap:
            target(torch.tensor([seq]))
            assert np.array_equal(routes, cap.take().transpose(0, 1).numpy())
