"""Each back-compatibility rule of `ecospec.identity`: what it keeps stable (a knob at the value that ran before it
existed leaves the id as it was), that the rule is what keeps it so (without it the id would move), and that the id
still moves when the knob changes what runs."""

import copy
from dataclasses import dataclass

import pytest
from hydra import compose, initialize_config_dir

from ecospec import conf_dir, identity
from ecospec.experiment.config import as_dict
from ecospec.experiment.kinds import job_id
from ecospec.identity import (
    AR_RULES,
    CELL_RULES,
    ar_key,
    aside_name,
    cell_id,
    random_checkpoint_key,
    record_stands,
    release_identity,
    stage_keys,
    tiny_version,
)
from ecospec.store import model_key

CONF = conf_dir()


def _compose(*overrides: str) -> dict:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return as_dict(compose("config", overrides=["model=tiny_random", *overrides]))


@pytest.fixture(scope="module")
def base() -> dict:
    return _compose("method=eagle3")


def changed(d: dict, path: str, value) -> dict:
    """A copy of `d` with the dotted key `path` set to `value` (or removed when value is ...)."""
    out = copy.deepcopy(d)
    *head, last = path.split(".")
    node = out
    for k in head:
        node = node[k]
    if value is ...:
        node.pop(last, None)
    else:
        node[last] = value
    return out


def without_rule(monkeypatch, name: str) -> None:
    rules = {"cell": CELL_RULES, "ar": AR_RULES}
    kind = "cell" if name in {r.name for r in CELL_RULES} else "ar"
    assert name in {r.name for r in rules[kind]}, name
    attr = "CELL_RULES" if kind == "cell" else "AR_RULES"
    monkeypatch.setattr(identity, attr, tuple(r for r in rules[kind] if r.name != name))


# (rule, the knob, values that keep the id of the config without the knob, a value that moves it, extra overrides)
CELL_CASES = [
    ("model_descriptive", "model.facts", [{"hf_config": {"model_type": "x"}}], None, ()),
    ("model_descriptive", "model.cpu_threads", [3, 7], None, ()),
    ("model_descriptive", "model.gamma", [6], None, ()),
    ("unused_drafters", "model.drafters.draft_model", [{"path": "some/lm"}], None, ()),
    ("one_process", "model.parallel", ["device_map", None], "tp", ()),
    ("sequence_buffer", "batch_buffer", ["sequence"], None, ("batch_size=4",)),
    ("sequence_buffer", "batch_buffer", ["sequence", "batch"], None, ("batch_size=1",)),
    ("no_budget", "budget_policy", ["truncate", "substitute"], None, ()),
    ("eager_engine", "engine", ["eager", None], "compiled", ()),
    ("hf_backend", "backend", [{"name": "hf"}, {"name": "hf", "rounds": 9}, None], {"name": "vllm"}, ()),
]


@pytest.mark.parametrize(
    ("rule", "knob", "same", "moves", "extra"), CELL_CASES, ids=[f"{c[0]}:{c[1]}" for c in CELL_CASES]
)
def test_cell_rule_keeps_old_ids(monkeypatch, rule, knob, same, moves, extra):
    d = _compose("method=eagle3", *extra)
    plain = changed(d, knob, ...)  # as a cell made before the knob existed
    for value in same:
        assert cell_id(changed(d, knob, value)) == cell_id(plain), (knob, value)
    if moves is not None:
        assert cell_id(changed(d, knob, moves)) != cell_id(plain)
    without_rule(monkeypatch, rule)  # the rule is what keeps them equal
    assert any(cell_id(changed(d, knob, value)) != cell_id(plain) for value in same)


def test_budget_policy_moves_the_id_once_a_budget_is_set():
    d = _compose("method=moespec", "expert_budget=8")
    assert cell_id(changed(d, "budget_policy", "substitute")) != cell_id(changed(d, "budget_policy", "truncate"))


def test_batch_buffer_moves_the_id_at_batch_size_above_one():
    d = _compose("method=ecospec", "batch_size=4")
    assert cell_id(changed(d, "batch_buffer", "batch")) != cell_id(changed(d, "batch_buffer", "sequence"))


def test_only_the_used_drafter_names_a_cell(base):
    head = base["model"]["drafters"]["eagle3"]
    assert cell_id(changed(base, "model.drafters.eagle3", {**(head or {}), "path": "other"})) != cell_id(base)


def test_a_vllm_cell_is_named_by_its_server_settings_and_routes(base):
    vllm = changed(base, "backend", {"name": "vllm", "dtype": "bfloat16", "rounds": 3, "routed_experts": False})
    assert cell_id(changed(vllm, "backend.rounds", 5)) == cell_id(vllm)  # a run setting
    assert cell_id(changed(vllm, "backend.routed_experts", ...)) == cell_id(vllm)
    assert cell_id(changed(vllm, "backend.routed_experts", True)) != cell_id(vllm)
    assert cell_id(changed(vllm, "backend.dtype", "float16")) != cell_id(vllm)


AR_CASES = [
    ("wall_clock", "clock", "wall", "thread_cpu"),
    ("eager_ar", "engine", "eager", "compiled"),
]


@pytest.mark.parametrize(("rule", "knob", "old", "moves"), AR_CASES, ids=[c[0] for c in AR_CASES])
def test_ar_rule_keeps_old_keys(monkeypatch, base, rule, knob, old, moves):
    def key(value):
        if knob == "clock":
            return ar_key(base, "hw") if value is ... else ar_key(base, "hw", value)
        return ar_key(changed(base, knob, value), "hw")

    assert key(old) == key(...) and knob not in key(old)  # the key an AR cached before the knob has
    assert key(moves) != key(...)
    without_rule(monkeypatch, rule)  # the rule is what keeps the old keys
    assert key(old)[knob] == old


def test_every_rule_has_a_case():
    assert {r.name for r in CELL_RULES} == {c[0] for c in CELL_CASES}
    assert {r.name for r in AR_RULES} == {c[0] for c in AR_CASES}
    assert all(r.reason for r in (*CELL_RULES, *AR_RULES))


def test_ar_key_is_the_target_alone(base):
    assert ar_key(changed(base, "method", {"name": "other"}), "hw") == ar_key(base, "hw")
    assert ar_key(changed(base, "model.drafters", {}), "hw") == ar_key(base, "hw")
    assert ar_key(changed(base, "split", ...), "hw") == ar_key(changed(base, "split", "heldout"), "hw")
    assert ar_key(changed(base, "split", "all"), "hw") != ar_key(base, "hw")
    assert ar_key(base, "other-hw") != ar_key(base, "hw")


def test_store_and_job_identity_is_the_target_not_its_placement(base):
    model = base["model"]
    assert model_key(changed(model, "dtype", "bfloat16")) == model_key(model)
    assert model_key(changed(model, "drafters", {})) == model_key(model)
    assert model_key(changed(model, "seed", 5)) != model_key(model)
    traces = _compose("experiment=traces")
    assert job_id(changed(traces, "model.dtype", "bfloat16")) == job_id(traces)
    assert job_id(changed(traces, "traces.response_tokens", 7)) != job_id(traces)
    assert job_id(changed(traces, "force", True)) == job_id(traces)


def test_a_record_stands_only_with_the_weights_it_decoded_with():
    weights = {"source": "release", "identity": "abc"}
    record = {"env": {"tiny": weights}}
    assert record_stands(record, weights) and record_stands({"env": {}}, None)
    other = {"source": "cache", "version": "v1", "root": "/x"}
    assert not record_stands(record, other) and not record_stands({"env": {}}, weights)
    assert aside_name(record) == "result.release-abc.json"
    assert aside_name({"env": {"tiny": other}}) == "result.cache-v1.json"
    assert aside_name({}) == "result.old-unknown.json"


@dataclass(frozen=True)
class FakeStage:
    name: str
    revision: str = "1"

    def recipe_of(self, budget):
        return budget.get(self.name)


STAGES = [FakeStage("a"), FakeStage("b"), FakeStage("c")]


def test_a_stage_key_moves_with_its_recipe_and_every_stage_before_it(monkeypatch):
    budget = {"a": 1, "b": 2, "c": 3}
    keys = stage_keys(STAGES, budget)
    moved = stage_keys(STAGES, {**budget, "b": 5})
    assert moved["a"] == keys["a"] and moved["b"] != keys["b"] and moved["c"] != keys["c"]
    assert stage_keys([STAGES[0], FakeStage("b", "2"), STAGES[2]], budget)["b"] != keys["b"]
    # a cache build is per Python (the corpus is its stdlib); the release is accepted on any
    rid, version = release_identity(STAGES, budget), tiny_version(release_identity(STAGES, budget))
    monkeypatch.setattr(identity, "python_minor", lambda: [2, 7])
    assert release_identity(STAGES, budget) == rid
    assert tiny_version(rid) != version and stage_keys(STAGES, budget)["a"] != keys["a"]
    assert release_identity(STAGES, {**budget, "c": 4}) != rid


def test_random_checkpoint_key_is_what_the_checkpoint_is_made_from(base):
    model = {"name": "r", "preset": "qwen3_moe-a", "seed": 0, "dtype": "float32"}
    key = random_checkpoint_key(model, 259)
    assert random_checkpoint_key({**model, "name": "other", "device_map": "auto"}, 259) == key
    assert random_checkpoint_key({k: v for k, v in model.items() if k != "seed"}, 259) == key  # seed 0 by default
    assert random_checkpoint_key({**model, "dtype": "bfloat16"}, 259) != key
    assert random_checkpoint_key(model, 300) != key
