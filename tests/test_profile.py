"""The verify-cost profile (issue 44's first piece): measured on this machine with forced routing, fitted as a
line in a block's tokens and unique experts, written under $ECOSPEC_CACHE/profiles with its hash, and a method
that needs one and finds none is told the command that makes it."""

import json

import pytest

from ecospec.analysis.cost import fit_verify
from ecospec.analysis.profiles import ProfileMissing, load_profile
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
