"""The verify-cost profile (issue 44's first piece): measured on this machine with forced routing, fitted as a
line in a block's tokens and unique experts, written under $ECOSPEC_CACHE/profiles with its hash, and a method
that needs one and finds none is told the command that makes it."""

import json

import pytest

from ecospec.analysis.profiles import ProfileMissing, load_profile
from ecospec.analysis.verify_profile import fit_verify
from ecospec.bench.profile import measure


def test_the_fit_recovers_a_known_line():
    recs = [
        {"gamma": g, "E": e, "t_pass_s": 0.002 + 0.0003 * g + 0.00001 * e * 4}
        for g, e in [(1, 2), (2, 3), (2, 4), (4, 5), (4, 8), (6, 7), (6, 12)]
    ]
    a, b, c, r2, n = fit_verify(recs, layers=4)
    assert (a, b, c) == pytest.approx((0.002, 0.0003, 0.00001)) and r2 == pytest.approx(1.0) and n == 7
    with pytest.raises(ValueError, match="three distinct"):
        fit_verify(recs[:2], layers=4)


def test_profile_is_measured_written_and_found(tmp_path, monkeypatch):
    monkeypatch.setenv("ECOSPEC_CACHE", str(tmp_path))
    with pytest.raises(
        ProfileMissing, match="make it with: python -m ecospec.bench.profile --model tiny --engine eager"
    ):
        load_profile("tiny", "eager", "float32", "some CPU")
    path = measure("tiny_random", "eager", points=2, layers=2, gammas=(2, 4))
    data = json.loads(path.read_text())
    p = data["profile"]
    assert path.parent == tmp_path / "profiles" and p["engine"] == "eager" and p["points"] >= 5
    assert p["per_expert_layer_s"] > 0 and p["ar_step_s"] > 0 and p["draft_pass_s"] == {}
    bw = data["bandwidth"]
    assert bw["buffer_bytes"] == 512 << 20 and bw["read_bytes_per_s"] > 0 and bw["model_read_bytes_per_s"] > 0
    rows = {r["pass"]: r for r in bw["passes"]}
    assert set(rows) == {"AR step", "verify, 2 tokens", "verify, 3 tokens", "verify, 4 tokens"}  # no head, no predictor
    ar = rows["AR step"]
    assert ar["seconds"] == p["ar_step_s"] and ar["ratio"] == pytest.approx(
        ar["seconds"] * bw["read_bytes_per_s"] / ar["bytes"]
    )
    assert rows["verify, 4 tokens"]["bytes"] > rows["verify, 2 tokens"]["bytes"] > ar["bytes"]
    profile, digest = load_profile("tiny_random", "eager", p["dtype"], p["processor"])
    assert digest == data["hash"] and profile.t_verify(4, 6) > profile.t_verify(1, 2)


def test_batched_passes_are_measured_as_cells_run_them():
    """The profile's batch table: real `generate_batch` decodes of the embedded default, each batch size's verify
    phase by tokens a sequence (AR: 1, the chain of γ: γ) with the unique experts over the batch, and its tree
    head pass; `t_batch` prices a batched pass from it, and from the line where nothing was measured."""
    from dataclasses import replace

    from ecospec.analysis.verify_profile import VerifyProfile
    from ecospec.bench.profile import _batched
    from ecospec.components import load_build
    from ecospec.tiny.build import paths

    target, tokenizer, drafter, _ = load_build(paths("full"))
    by_batch, heads = _batched(target, tokenizer, drafter, tokens=6, gammas=(3,), engine="eager", batches=(2,))
    assert set(by_batch) == {"2"} and set(by_batch["2"]) == {"1", "3"} and heads["2"] > 0
    top_k, experts = target.config.num_experts_per_tok, target.config.num_experts
    for q, (seconds, e) in by_batch["2"].items():
        assert seconds > 0 and top_k <= e <= min(experts, 2 * int(q) * top_k)
    assert by_batch["2"]["1"][1] < by_batch["2"]["3"][1]  # more tokens, more unique experts
    line = VerifyProfile(
        model="t", engine="eager", dtype="float32", processor="x", layers=2, intercept_s=0.001, per_token_s=0.0001,
        per_expert_layer_s=0.00001, r2=1.0, points=3, ar_step_s=0.002, overhead_s=0.0005, draft_pass_s={"tree": 0.0003},
        predictor_pass_s=None, experts_by_tokens={"1": 2.0, "2": 3.0, "3": 4.0, "4": 5.0}, source="test",
    )  # fmt: skip
    measured = replace(line, verify_by_batch=by_batch, draft_by_batch=heads)
    assert measured.t_batch(2, 3) == by_batch["2"]["3"][0] and measured.t_draft(2, 3) == 3 * heads["2"]
    assert line.t_batch(2, 2) == pytest.approx(0.001 + 0.0001 * 4 + 0.00001 * 5.0 * 2)  # 4 tokens: E 5 on 2 layers
    assert line.t_batch(1, 2) == line.t_verify(2, 3.0) and line.t_draft(4, 2) == 0.0006
