"""Adding a method, a drafter or a model family is new files only (docs/extending.md): a temporary copy of the package
and its configs gains a toy method module, a toy drafter module and their conf/method YAMLs, or a family module and
its conf/model YAML, nothing else is edited, and cells run with them end to end. A drafter's kind record decides
whether engine=compiled drafts with it: it runs compiled through the record's `prepare`, or validation refuses it."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TOY_METHOD = '''"""toy: the deepest-first walk (a new method as a new module, nothing else edited)."""

from ecospec.methods import Candidates, MethodSpec, register
from ecospec.methods._greedy import greedy_static


def rule(c: Candidates, budget: int) -> list[int]:
    return greedy_static(c, [float(d) for d in c.depth], budget)


SPEC = register(MethodSpec(name="toy", label="Toy", colour="tab:brown", role="toy", predictor=None,
                           buffered=False, rule=rule, order=90))
'''

TOY_YAML = "name: toy\ndrafter: default\nselector: toy\npredictor: null\n"

TOY_DRAFTER = '''"""bigram: proposes the tokens that followed a node's token earlier in the sequence, most recent
first (a new drafter as a new module: its implementation and its kind, nothing else edited)."""

import math

import torch

from ecospec.drafters.registry import DrafterKind, register


class BigramDrafter:
    kind = "bigram"
    hidden_layers = ()

    def __init__(self, vocab_size):
        self.vocab_size, self.seqs = vocab_size, [[]]

    def reset(self, rows=1):
        self.seqs = [[] for _ in range(rows)]

    def keep_rows(self, keep):
        self.seqs = [self.seqs[b] for b in keep]

    def _next(self, seq, token, k):
        seen = [seq[i + 1] for i in range(len(seq) - 2, -1, -1) if seq[i] == token]
        out = list(dict.fromkeys(seen))[:k]
        out += [t for t in range(3, 3 + k) if t not in out][: k - len(out)]
        return torch.full((k,), -math.log(k)), torch.tensor(out)

    def begin_rows(self, new_tokens, new_hidden, topk, depth=None):
        rows = []
        for seq, new in zip(self.seqs, new_tokens):
            seq += new.tolist()
            rows.append(self._next(seq, seq[-1], topk))
        return torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])

    def expand_rows(self, trees, beams, topk):
        rows = [
            [self._next(seq, tree.tokens[i], topk) for i in beam] for seq, tree, beam in zip(self.seqs, trees, beams)
        ]
        return (
            torch.stack([torch.stack([p[0] for p in row]) for row in rows]),
            torch.stack([torch.stack([p[1] for p in row]) for row in rows]),
        )


def load(ctx):
    return BigramDrafter(ctx.target.config.vocab_size)


KIND = register(DrafterKind(name="bigram", label="Bigram", load=load))
'''

TOY_DRAFTER_YAML = "name: bigram\ndrafter: bigram\nselector: confidence\npredictor: null\n"


TOY_FAMILY = '''"""olmoe: OLMoE (allenai/OLMoE-1B-7B), transformers' OlmoeForCausalLM: a softmax router over all
experts, top-k renormalised where the config's norm_topk_prob says; q and k normed over their whole width (a new
family as a new module, nothing else edited)."""

from ecospec.families import IDS, Family, register
from ecospec.families import _softmax as rule
from ecospec.families._counts import Counts, attention, head_dim

FAMILY = register(
    Family(
        name="olmoe",
        causal_lm="OlmoeForCausalLM",
        config_class=("transformers.models.olmoe.configuration_olmoe", "OlmoeConfig"),
        router="gate",
        presets={
            "olmoe-a": {
                "model_type": "olmoe",
                **IDS,
                "hidden_size": 48,
                "intermediate_size": 32,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "num_experts": 8,
                "num_experts_per_tok": 2,
                "max_position_embeddings": 1024,
            }
        },
        check_preset="olmoe-a",
        scores=rule.scores,
        normalises=lambda router: bool(router.norm_topk_prob),
        truncate=rule.truncate,
        substitute=rule.substitute,
        counts=Counts(
            experts_keys=("num_experts",),
            expert=lambda c: 3 * c["hidden_size"] * c["intermediate_size"],
            # q_norm over the hidden size, k_norm over the key heads' width
            attention=lambda c: attention(c) + c["hidden_size"] + c["num_key_value_heads"] * head_dim(c),
        ),
        order=60,
    )
)
'''

TOY_FAMILY_YAML = """name: olmoe_tiny
source: random
preset: olmoe-a
seed: 0
target: null
dtype: float32
device_map: null
parallel: device_map
cpu_threads: 1
chat_template: false
gamma: 4
default_drafter: draft_model
drafters:
  draft_model: {path: perturbed}
predictor:
  checkpoint: random
facts: {hf_config: null, storage: null}
"""

# in the copy: the family's count equals the model's own, and the cost model reads it
COUNT_CHECK = """
from ecospec.analysis.weight_bytes import model_cost
from ecospec.models import tiny_config
from ecospec.models.adapters import config_moe_info
from ecospec.models.param_count import count_params

config = tiny_config("olmoe-a")
counted, built = count_params(config.to_dict()), config_moe_info(config)
assert counted == built, (counted, built)
print(model_cost("olmoe_tiny").expert_params)
"""


def _copy(tmp_path) -> Path:
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "src", copy / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "release"))
    shutil.copytree(ROOT / "src" / "ecospec" / "tiny" / "release", copy / "src" / "ecospec" / "tiny" / "release")
    shutil.copy(ROOT / "run.py", copy / "run.py")
    return copy


def _run(copy: Path, out: Path, *overrides: str, ok: bool = True) -> dict | str:
    """The cell's record; with `ok=False`, the command's output where it fails."""
    env = {**os.environ, "PYTHONPATH": str(copy / "src")}
    proc = subprocess.run(
        [
            sys.executable,
            "run.py",
            *overrides,
            *(() if any(o.startswith("model=") for o in overrides) else ("model=tiny_random",)),
            "num_prompts=1",
            "max_new_tokens=6",
            "threads=1",
            "progress=false",
            f"out_dir={out}",
        ],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if not ok:
        assert proc.returncode != 0, proc.stdout[-2000:]
        return proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(next(out.rglob("result.json")).read_text())


def _with_files(tmp_path, files: dict[str, str]) -> Path:
    """A copy of the project with `files` (path -> text) added, checked to be the only files added."""
    copy = _copy(tmp_path)
    before = {p.relative_to(copy) for p in copy.rglob("*") if p.is_file()}
    for path, text in files.items():
        (copy / path).write_text(text)
    added = {p.relative_to(copy) for p in copy.rglob("*") if p.is_file()} - before
    assert added == {Path(p) for p in files}
    return copy


def test_a_new_drafter_is_a_new_module_and_its_yaml(tmp_path):
    copy = _with_files(
        tmp_path,
        {"src/ecospec/drafters/kind_bigram.py": TOY_DRAFTER, "src/ecospec/conf/method/bigram.yaml": TOY_DRAFTER_YAML},
    )
    rec = _run(copy, tmp_path / "exp", "method=bigram", "+model.drafters.bigram={path:null}")
    assert rec["status"] == "ok" and rec["config"]["method"]["drafter"] == "bigram"
    assert rec["summary"]["matches_ar"] == 1.0 and rec["summary"]["alpha"] >= 1.0
    # its record has no `prepare`: engine=compiled refuses it at validation, in one line, before anything loads
    said = _run(
        copy, tmp_path / "c", "method=bigram", "+model.drafters.bigram={path:null}", "engine=compiled", ok=False
    )
    assert "engine=compiled drafts with eagle3, draft_model, gto, not bigram" in said, said[-2000:]
    assert all(json.loads(p.read_text())["status"] != "ok" for p in (tmp_path / "c").rglob("result.json"))


def test_engine_compiled_prepares_a_drafter_through_its_kind_record(monkeypatch):
    """What the refusal reads (`DrafterKind.compiled`) is what the run does: the compiled target prepares a drafter
    with its kind's `prepare` and nothing else, whatever the kind is called."""
    from types import SimpleNamespace

    from ecospec.drafters import registry
    from ecospec.engine.compiled import CompiledTarget
    from ecospec.engine.scope import compiled_problem

    for k in registry.kinds():
        assert (compiled_problem(None, drafter=k.name) is None) == (k.prepare is not None) == k.compiled
    calls = []

    def prepare(drafter, **shape):
        calls.append(shape)
        return ("prepared", drafter)

    record = registry.DrafterKind(name="bigram", label="Bigram", load=None, prepare=prepare)
    monkeypatch.setattr(registry, "kind", lambda name: record)
    drafter = SimpleNamespace(kind="bigram")
    target = SimpleNamespace(max_len=64, rows=2)
    got, _ = CompiledTarget.prepare_parts(target, drafter, None, gamma=4, depth=3, topk=1, predicted=False)
    assert got == ("prepared", drafter)
    assert calls == [{"gamma": 4, "depth": 3, "topk": 1, "max_len": 64, "rows": 2, "depths": ()}]


def test_a_new_method_is_a_new_module_and_its_yaml(tmp_path):
    copy = _with_files(
        tmp_path, {"src/ecospec/methods/toy.py": TOY_METHOD, "src/ecospec/conf/method/toy.yaml": TOY_YAML}
    )
    rec = _run(copy, tmp_path / "exp", "method=toy")
    assert rec["status"] == "ok" and rec["config"]["method"]["selector"] == "toy"
    assert rec["summary"]["matches_ar"] == 1.0  # greedy and lossless whatever the rule picks


def test_a_new_family_is_a_new_module_and_its_model_yaml(tmp_path):
    """A family transformers has and we did not: its record (HF classes, router, routing rule, parameter counts)
    in one module and a conf/model YAML; its count equals the model built on the meta device, and a cell runs on
    it, lossless."""
    copy = _with_files(
        tmp_path,
        {"src/ecospec/families/olmoe.py": TOY_FAMILY, "src/ecospec/conf/model/olmoe_tiny.yaml": TOY_FAMILY_YAML},
    )
    env = {**os.environ, "PYTHONPATH": str(copy / "src")}
    proc = subprocess.run([sys.executable, "-c", COUNT_CHECK], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert int(proc.stdout.split()[-1]) == 3 * 48 * 32  # one routed expert, as the family counts it
    rec = _run(copy, tmp_path / "exp", "model=olmoe_tiny", "method=oracle")  # EcoSpec on the target's own routers
    assert rec["status"] == "ok" and rec["summary"]["matches_ar"] == 1.0
    assert rec["summary"]["num_experts"] == 8 and rec["summary"]["top_k"] == 2
