"""Every existing cell keeps its identity: a user's experiments/ resumes after any refactor. The ids below were
computed at 2320a8f (before the registries, the memory check and the costed modeled speedups); a change that
renames a cell, a job or an AR baseline fails here. A new knob enters an identity only when it differs from its
default (as `engine` does), so none of these may move."""

import pytest
from hydra import compose, initialize_config_dir

from ecospec import conf_dir
from ecospec.cache import digest
from ecospec.experiment.cell import ar_key
from ecospec.experiment.config import as_dict, job_id
from ecospec.experiment.kinds import job_kind

# (overrides, job id, AR baseline key digest on a fixed hardware string or None for jobs without one)
PINNED = [
    (("method=ar",), "f8e28ba4dde1", "fcf3a72b4217"),
    (("method=eagle3",), "e0207ed95716", "fcf3a72b4217"),
    (("method=ecospec",), "50a42016777f", "fcf3a72b4217"),
    (("method=global_cost",), "05ea5dc7fd4a", "fcf3a72b4217"),
    (("method=oracle",), "1bc56a6490bf", "fcf3a72b4217"),
    (("method=moespec",), "15d8896b673a", "fcf3a72b4217"),
    (("method=gto",), "f90054a794cd", "fcf3a72b4217"),
    (("method=ecospec", "temperature=1.0"), "4ce9e2873f70", "87e162bce593"),
    (("method=eagle3", "gamma=4"), "50f9d948086a", "fcf3a72b4217"),
    (("method=eagle3", "gamma=8", "depth=5", "topk=3"), "184278c377ca", "fcf3a72b4217"),
    (("method=ecospec", "batch_size=4"), "d98415248309", "a9f97367145c"),
    (("method=ecospec", "batch_size=4", "batch_buffer=batch"), "20ae243ada63", "a9f97367145c"),
    (("method=ecospec", "engine=compiled"), "6bfa06aad647", "17975e38218c"),
    (("method=eagle3", "engine=compiled", "temperature=1.0"), "e3b9defa9341", "71d9bf6f97c9"),
    (("method=ecospec", "dataset=humaneval", "num_prompts=8"), "7319f21738b6", "234944b75cdd"),
    (("method=ecospec", "model.predictor.checkpoint=acc50"), "94aafff7d346", "fcf3a72b4217"),
    (("model=tiny_random", "method=ecospec"), "9caa232903d1", "208eeb1a692b"),
    (("model=tiny_random", "method=ecospec", "model.parallel=tp", "ranks=2"), "7c7f8678c416", "927b260fd336"),
    (("model=tiny_random_deepseek", "method=mtp"), "538697502cdc", "cba068afdd01"),
    (("model=qwen3", "method=eagle3"), "dde6e122c823", "af43dff54e11"),
    (("model=qwen3", "method=ecospec", "dataset=humaneval"), "1fc5c758f7c6", "af43dff54e11"),
    (("model=gptoss", "method=eagle3", "temperature=1.0"), "148027a6b934", "ed9a0088223e"),
    (("model=deepseek", "method=mtp"), "6e123ef42bf5", "ac9f6ab08b6b"),
    (("model=mixtral", "method=draft"), "44be94c49a25", "7cde074de9c1"),
    (("model=qwen3", "backend=vllm", "method=eagle3"), "f333aaa5bccc", None),
    (("experiment=traces", "model=tiny_random"), "ee929e6c72e1", None),
    (("experiment=predictor", "model=tiny_random"), "a5b1c774582f", None),
    (("experiment=demo",), "8e79e2d65dd6", "31575bcc6a27"),  # a cell since issue 45 (was the demo job 910a4f1763ee)
    (("experiment=gto", "model=tiny"), "e23587def183", None),
]


@pytest.mark.parametrize(("overrides", "jid", "ar"), PINNED, ids=[" ".join(p[0]) for p in PINNED])
def test_cell_and_job_ids_are_pinned(overrides, jid, ar):
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    assert job_id(cfg) == jid
    if ar is not None:
        assert job_kind(cfg) == "cell"
        assert digest(ar_key(as_dict(cfg), "pinned-hardware")) == ar
