"""The overlap paper's analyses in the reports: committed-sequence routes and drafted-token rows from record traces,
accepted vs first-rejected comparisons, target efficiency (measured, predicted, the paper's Table 1 / 11), and the
routing tables and figures written (or skipped) by `make tables`."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from scipy import stats

from ecospec.analysis.acceptance import anchor_drop, compare_by_depth, held_out
from ecospec.analysis.traces import DraftTokens, draft_tokens, sequence_routes, step_draft_tokens
from ecospec.analysis.weight_bytes import ModelCost, target_efficiency, target_efficiency_shares
from ecospec.report.records import records_frame
from ecospec.report.routing import build_routing, distance_table
from ecospec.report.routing_data import CORPUS, RECORDS, VLLM_RECORDS, collect
from ecospec.report.synthetic import synthetic_records
from ecospec.report.target_efficiency import te_paper_table, te_table

K, LAYERS, N = 2, 3, 8


@pytest.fixture(autouse=True)
def no_tiny_build(tmp_path, monkeypatch):
    """No tiny build traces unless a test writes them: the corpus source stays out of the results (an empty cache
    build, not the release, whose traces are made on first use)."""
    monkeypatch.setenv("ECOSPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("ECOSPEC_TINY", "cache")


@pytest.fixture(scope="module")
def recs():
    return synthetic_records(818, seed=0)  # one round of the grid: the tiny model's Table 1 SD cells carry traces


def _random_routes(tokens: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([np.stack([rng.choice(N, K, replace=False) for _ in range(LAYERS)]) for _ in range(tokens)])


def _steps(seq: np.ndarray, accepted: list[int], prompt="p/0", start: int = 0) -> list[dict]:
    """Verify passes over `seq` [tokens, layers, k]: a chain block root + 3 drafts, the first `a` drafts accepted;
    rejected drafts get random routes."""
    out, pos, rng = [], 0, np.random.default_rng(1)
    for step, a in enumerate(accepted):
        block = [seq[pos + j] if j <= a else _random_routes(1, int(rng.integers(1000)))[0] for j in range(4)]
        routes = np.stack(block, axis=1)  # [layers, block tokens, k]
        out.append(
            {
                "prompt": prompt,
                "turn": 0,
                "step": start + step,
                "tokens": [0, 1, 2, 3],
                "parents": [-1, 0, 1, 2],
                "depths": [0, 1, 2, 3],
                "path": list(range(a + 1)),
                "routes": routes.tolist(),
            }
        )
        pos += a + 1
    return out


def test_sequence_routes_concatenate_the_accepted_paths_in_step_order():
    seq = _random_routes(20)
    accepted = [2, 0, 3, 1, 0]
    steps = _steps(seq, accepted)
    shuffled = [steps[i] for i in (3, 0, 4, 2, 1)]  # the record's order does not matter, the step index does
    (key, routes), *rest = sequence_routes(shuffled + _steps(seq, [1], prompt="p/1"))
    consumed = sum(a + 1 for a in accepted)
    assert key == ("p/0", 0) and routes.shape == (consumed, LAYERS, K)
    np.testing.assert_array_equal(routes, seq[:consumed])
    assert [k for k, _ in rest] == [("p/1", 0)]
    # a missing step splits the sequence: no token pair spans the gap
    gap = [s for s in steps if s["step"] != 2]
    runs = sequence_routes(gap)
    assert [len(r) for _, r in runs] == [3 + 1, 2 + 1]
    np.testing.assert_array_equal(runs[1][1], seq[4 + 4 : 4 + 4 + 3])


def test_first_rejected_and_overlaps_on_a_hand_made_block():
    # root 0; 1, 2 children of the root; 3, 4 children of 1; 5 child of 3; 6 child of 2. Accepted: 0 -> 1 -> 3.
    sets = [(0, 1), (0, 2), (1, 2), (0, 2), (5, 6), (0, 3), (2, 4)]  # one layer, k = 2
    step = {
        "tokens": list(range(7)),
        "parents": [-1, 0, 0, 1, 1, 3, 2],
        "depths": [0, 1, 1, 2, 2, 3, 2],
        "path": [0, 1, 3],
        "routes": [[list(s) for s in sets]],
    }
    t = step_draft_tokens(step)
    assert t.depth.tolist() == [1, 1, 2, 2, 3, 2]
    assert t.accepted.tolist() == [True, False, True, False, False, False]
    # 2: parent is the root; 4: parent 1 accepted; 5: parent 3 accepted; 6: parent 2 was rejected
    assert t.first_rejected.tolist() == [False, True, False, True, True, False]
    assert t.overlap.tolist() == [0.5, 0.5, 1.0, 0.0, 0.5, 0.5]  # vs the parent, / k
    assert t.anchor.tolist() == [0.5, 0.5, 0.5, 0.0, 0.5, 0.0]  # vs the root
    assert len(draft_tokens([step, step])) == 12
    with pytest.raises(ValueError, match="parents"):
        step_draft_tokens({**step, "parents": [-1, 0, 0, 5, 1, 3, 2]})


def _tokens(depth, accepted, first_rejected, overlap, anchor) -> DraftTokens:
    return DraftTokens(
        np.array(depth), np.array(accepted), np.array(first_rejected), np.array(overlap, float), np.array(anchor, float)
    )


def test_accepted_vs_first_rejected_by_depth():
    acc1, rej1 = [0.2, 0.3, 0.4, 0.3], [0.5, 0.6, 0.4]
    acc2, rej2 = [0.1, 0.3], [0.5, 0.3, 0.4]
    later = [0.9, 0.9]  # rejected under a rejected parent: in neither group
    t = _tokens(
        depth=[1] * 7 + [2] * 5 + [2, 2],
        accepted=[True] * 4 + [False] * 3 + [True] * 2 + [False] * 5,
        first_rejected=[False] * 4 + [True] * 3 + [False] * 2 + [True] * 3 + [False] * 2,
        overlap=acc1 + rej1 + acc2 + rej2 + later,
        anchor=acc1 + rej1 + [0.0, 0.1] + [0.2, 0.2, 0.3] + [0.0, 0.0],
    )
    c1, c2 = compare_by_depth(t)
    assert (c1.depth, c1.n_accepted, c1.n_first_rejected) == (1, 4, 3)
    assert c1.overlap_accepted == pytest.approx(0.3) and c1.overlap_first_rejected == pytest.approx(0.5)
    assert c1.consecutive.delta == pytest.approx(-0.2)
    assert c1.consecutive.p_value == pytest.approx(stats.ttest_ind(acc1, rej1, equal_var=False).pvalue)
    pooled_sd = np.sqrt((3 * np.var(acc1, ddof=1) + 2 * np.var(rej1, ddof=1)) / 5)
    assert c1.consecutive.cohen_d == pytest.approx(-0.2 / pooled_sd)
    assert c1.sem_accepted == pytest.approx(np.std(acc1, ddof=1) / 2)
    assert c2.consecutive.delta == pytest.approx(0.2 - 0.4) and c2.anchor.delta == pytest.approx(0.05 - 0.7 / 3)
    # anchor drop: consecutive - anchor over the compared depth-2 tokens
    assert anchor_drop(t) == pytest.approx(np.mean([0.1, 0.2, 0.3, 0.1, 0.1]))
    summary = held_out({"a": t, "b": t.select(t.depth == 1), "c": DraftTokens.concat([])})
    assert summary.slices == 2 and summary.delta == {1: pytest.approx(-0.2), 2: pytest.approx(-0.2)}
    assert summary.anchor_drop == pytest.approx(anchor_drop(t))  # slice b has no depth-2 tokens


def test_paper_table_1_and_11_predicted_te_from_its_own_inputs():
    assert target_efficiency(168, 40, 2, 4.99) == pytest.approx(0.4281, abs=1e-4)
    assert target_efficiency(9, 36, 8, 19.49) == pytest.approx(0.5109, abs=1e-4)
    table = te_paper_table()
    t1 = table[table["Setting"].str.startswith("Table 1:")]
    assert len(t1) == 6
    assert np.allclose(t1["Predicted te"], t1["Paper-predicted te"], atol=5e-4)
    assert sorted(set(t1["Predicted te"].round(3))) == [0.428, 0.511]
    t11 = table[table["Setting"].str.contains("step")]
    assert t11["Predicted te"].round(3).tolist() == [0.511, 0.678, 0.842, 0.871]  # paper 0.511 0.679 0.843 0.872
    assert np.allclose(t11["Predicted te"], t11["Paper-predicted te"], atol=1.5e-3)
    assert target_efficiency_shares(72 / 108, 19.49 / 8) == pytest.approx(target_efficiency(9, 36, 8, 19.49))


def _cost(**changes) -> ModelCost:
    base = dict(
        name="tiny",
        num_layers=4,
        moe_layers=4,
        num_experts=32,
        top_k=4,
        expert_params=1000,
        expert_bytes=4000.0,
        dense_params=20000,
        embedding_params=0,
        other_params=0,
        dense_bytes=80000.0,
        shared_expert_params=0,
        storage={},
    )
    return ModelCost(**{**base, **changes})


def _frame(records):
    return records_frame((r, f"/x/{i}/result.json") for i, r in enumerate(records)).frame


def _k3(recs) -> list[dict]:
    """The tiny model's greedy B = 1 SD records at gamma 4 (K = 3: the cells the overlap paper's analyses use; the
    tiny model's own gamma, its Table 1 cells', is another)."""
    return [
        r
        for r in recs
        if r["status"] == "ok"
        and r["config"]["model"]["name"] == "tiny"
        and r["config"]["method"]["name"] != "ar"
        and r["config"]["gamma"] == 4
        and r["config"]["temperature"] == 0
        and r["config"]["batch_size"] == 1
        and r["config"].get("expert_budget") is None
    ]


def test_te_measured_and_predicted_on_a_synthetic_record(recs):
    sd = _k3(recs)[0]
    frame = _frame([sd])
    table, cells = te_table(frame, {"tiny": _cost()})
    ours = table[table["Source"] == "ours"]
    assert len(ours) == 1 and len(cells) == 1
    s = sd["summary"]
    row = ours.iloc[0]
    assert row["Measured te"] == pytest.approx(s["ar_t_step_s"] / s["t_verify_s"])
    # per MoE layer: C_expert = one expert's bytes, C_dense = all non-expert bytes / MoE layers; AR at B=1: k
    assert row["Predicted te"] == pytest.approx(target_efficiency(4000.0, 80000.0 / 4, 4, s["experts_per_layer"]))
    assert row["TE gap"] == pytest.approx(row["Measured te"] - row["Predicted te"])
    assert {"Mixtral-8x7B", "Qwen3-30B", "Qwen3-235B"} <= set(table.loc[table["Source"] == "paper", "Model"])
    # without the model's cost: measured only
    table, _ = te_table(frame, {})
    assert np.isnan(table.loc[table["Source"] == "ours", "Predicted te"]).all()


def _write(root, recs):
    for i, r in enumerate(recs):
        cell = root / r["experiment"] / f"{r['cell']}-{i}"
        cell.mkdir(parents=True)
        (cell / "result.json").write_text(json.dumps(r, indent=1))


def test_routing_tables_and_figures_are_written(recs, tmp_path):
    from ecospec.report import build

    traced = [r for r in recs if r.get("trace")]
    ar = [
        r
        for r in recs
        if r["experiment"] == "table1"
        and r["config"]["model"]["name"] == "tiny"
        and r["config"]["method"]["name"] == "ar"
        and r["status"] == "ok"
    ]
    _write(tmp_path / "experiments", traced[:6] + ar[:4] + _k3(recs)[:2])
    written = {p.name for p in build([tmp_path / "experiments"], tmp_path / "reports")}
    for name in (
        "overlap_te_paper",
        "overlap_te",
        "overlap_step1",
        "overlap_distance",
        "overlap_layers",
        "overlap_unique",
        "overlap_acceptance",
        "overlap_heldout",
    ):
        assert {f"{name}.md", f"{name}.tex", f"{name}.csv"} <= written, name
    for fig in ("fig_overlap_distance_tiny", "fig_layer_overlap_tiny", "fig_ipf_unique", "fig_accept_overlap_tiny"):
        assert {f"{fig}.png", f"{fig}.pdf"} <= written, fig
    index = (tmp_path / "reports" / "README.md").read_text()
    assert "](overlap_acceptance.md)" in index and "figures/fig_ipf_unique.png" in index
    step1 = (tmp_path / "reports" / "overlap_step1.md").read_text()
    assert f"{RECORDS}: pooled" in step1 and "| Qwen3-30B " in step1 and "72.4%" in step1
    acceptance = (tmp_path / "reports" / "overlap_acceptance.csv").read_text()
    assert "1st-rejected overlap" in acceptance.splitlines()[0] and "paper" in acceptance


def test_without_traces_the_routing_tables_and_figures_are_skipped(recs, tmp_path):
    plain = [copy.deepcopy(r) for r in recs if r["config"]["model"]["name"] == "tiny"][:30]
    for r in plain:
        r.pop("trace", None)
    figures = tmp_path / "figures"
    figures.mkdir()
    (figures / "fig_ipf_unique.png").write_bytes(b"stale")
    (figures / "fig1a_verify_latency.png").write_bytes(b"not ours")
    frame = _frame(plain)
    tables, missing, drawn = build_routing(frame, {"tiny": plain[0]["config"]["model"]}, {}, figures)
    assert drawn == [] and not (figures / "fig_ipf_unique.png").exists()
    assert (figures / "fig1a_verify_latency.png").exists()
    assert "overlap_step1" not in {t.name for t in tables} and "overlap_te_paper" in {t.name for t in tables}
    assert {"Overlap Tables 2, 13", "Overlap Tables 14, 15", "Overlap Table 16"} <= set(missing)
    assert collect(frame.iloc[0:0]).sources == []


def test_vllm_routes_are_a_source_of_their_own_beside_our_traces(recs):
    """A vLLM record's committed sequences (vLLM's own routing) pool into a "vLLM records" source; where vLLM routed
    the same sequence as our engine, the two sources' statistics agree."""
    from ecospec.analysis.overlap import pooled

    seq = _random_routes(30, seed=3)
    accepted = [2, 0, 3, 1, 0, 2]
    committed = seq[: sum(a + 1 for a in accepted)]
    hf = copy.deepcopy(_k3(recs)[0])
    hf["trace"] = _steps(seq, accepted)
    vllm = copy.deepcopy(hf)
    vllm.pop("trace")
    vllm["config"]["backend"] = {"name": "vllm", "tp": 1}
    vllm["summary"]["num_experts"] = N
    vllm["routes"] = [{"prompt": "p/0", "turn": 0, "tokens": list(range(len(committed))), "routes": committed.tolist()}]
    data = collect(_frame([hf, vllm]))
    assert [s.data for s in data.sources] == [RECORDS, VLLM_RECORDS]
    ours, theirs = data.sources
    assert theirs.sequences == 1 and theirs.stats.all.tokens == len(committed)
    assert theirs.stats.all.overlap == pytest.approx(ours.stats.all.overlap)
    assert theirs.stats.all.overlap == pytest.approx(pooled([committed], N).all.overlap)
    assert list(data.tokens) == ["/x/0/result.json"]  # acceptance reads our traces only: vLLM records have none
    labels = set(distance_table(data)["Data"])
    assert f"{VLLM_RECORDS}: pooled (1 sequences, 1 datasets)" in labels


def test_tiny_build_traces_are_a_corpus_source(recs, tmp_path, monkeypatch):
    from ecospec.predictor.trace_files import FORMAT
    from ecospec.tiny.stages import ENV_SOURCE, paths

    monkeypatch.setenv(ENV_SOURCE, "cache")  # a cache build's traces (the release ships none, and is never written)
    folder = paths("full")["traces"]  # under the test's ECOSPEC_CACHE
    folder.mkdir(parents=True)
    routes = np.concatenate([_random_routes(30, seed=s) for s in range(3)]).astype(np.uint8)
    np.savez(
        folder / "shard-00000.npz", tokens=np.zeros(90, np.int32), offsets=np.array([0, 30, 60, 90]), routes=routes
    )
    target = {"family": "qwen3_moe", "moe_layers": list(range(LAYERS)), "num_experts": N, "top_k": K}
    manifest = {
        "format": FORMAT,
        "target": target,
        "shard_size": 256,
        "samples": 3,
        "tokens": 90,
        "shards": [{"file": "shard-00000.npz", "first_sample": 0, "samples": 3, "tokens": 90}],
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    frame = _frame([r for r in recs if r["config"]["model"]["name"] == "tiny"][:10])
    data = collect(frame, {"tiny": {"name": "tiny", "source": "tiny", "budget": "full"}, "qwen3": {"source": "hf"}})
    assert [(s.model, s.data) for s in data.sources] == [("tiny", RECORDS), ("tiny", CORPUS)]  # records first
    source = data.sources[1]
    assert source.sequences == 3 and len(source.used) == 0  # no records behind a corpus
    assert source.stats.all.tokens == 90 and source.stats.all.k == K and source.stats.all.n_experts == N
