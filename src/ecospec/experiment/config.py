"""Validation before any model loads: a cell's every knob (`validate`, then the typed cell, `validate_cell`), the
checks every job kind shares (the model and its source, datasets, ranks, positive integers: each kind's own checks
sit in its record, `experiment.kinds`), and a cell's directory name. Each bad value is one `ConfigError` naming the
key, the value and what is allowed. What identifies a job: `ecospec.identity`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

from omegaconf import DictConfig, OmegaConf

from ecospec import conf_dir, sources
from ecospec.data import DATASETS
from ecospec.data.split import SPLITS
from ecospec.drafters.registry import SYNTHETIC_PATHS
from ecospec.drafters.registry import kind as drafter_kind_record
from ecospec.drafters.registry import names as drafter_names
from ecospec.engine.scope import BATCH_BUFFERS, ENGINES, compiled_problem
from ecospec.experiment import kinds
from ecospec.experiment.clock import CLOCKS
from ecospec.experiment.kinds import Job
from ecospec.experiment.kinds import job_id as job_id  # re-exported: tests/test_identity.py imports it from here
from ecospec.experiment.kinds import job_name as job_name  # re-exported: the jobs, the sweeper and tests import it here
from ecospec.experiment.kinds import plain as as_dict  # re-exported: tests read a composed config with it
from ecospec.experiment.spec import Cell, cell_of, drafter_of
from ecospec.identity import cell_config, config_id
from ecospec.identity import cell_id as cell_id  # re-exported: report.synthetic and tests import it from here
from ecospec.methods import AR
from ecospec.methods import method as method_spec
from ecospec.methods import names as method_names
from ecospec.parallel import PARALLEL, job_ranks, layout_problem, mode_of, rank_layout_problem
from ecospec.store import predictor_root, stored_predictor
from ecospec.vllm_backend.args import METHODS as VLLM_METHODS
from ecospec.vllm_backend.args import MODEL_FREE

PREDICTORS = ("learned", "oracle")
MIX = "mix"  # the pseudo-dataset of Table 8: instances drawn from several benchmarks (ecospec.data.load_mix)
TINY_CHECKPOINTS = ("final", "acc50", "acc60")
BACKENDS = ("hf", "vllm")
ROUTED_ON_CPU = (
    "vLLM returns routed experts only from its Model Runner V2, which needs Triton and a GPU; its CPU "
    "build runs the V1 runner (docs/vllm.md): run it on a GPU, or backend=hf with trace_steps > 0"
)


class ConfigError(ValueError):
    """A config value that cannot run; the message names the key, the value and what is allowed."""


def _num(x: float) -> str:
    return f"{x:g}"


def cell_name(cfg: DictConfig | Mapping | None, identity: dict | None = None) -> str:
    """Readable and unique directory name of a cell: model-method-dataset-T..-g..-d..-k..-b..-s.. plus the
    first 6 hex digits of cell_id (which also covers every other identity key, e.g. a predictor checkpoint)."""
    c = cell_config(cfg) if identity is None else identity
    return cell_directory(c, config_id(c))


def cell_directory(c: dict, cid: str) -> str:
    """`cell_name` of identity `c` whose id is `cid` (the cell kind's `JobKind.directory`)."""
    head = "-".join([c["model"]["name"], c["method"]["name"], c["dataset"]["name"]])
    if "backend" in c:
        head += f"-{c['backend']['name']}"
    if "engine" in c:
        head += f"-{c['engine']}"
    knobs = f"T{_num(c['temperature'])}-g{c['gamma']}-d{c['depth']}-k{c['topk']}-b{c['batch_size']}-s{c['seed']}"
    if c.get("expert_budget") is not None:
        knobs += f"-eb{c['expert_budget']}{'s' if c.get('budget_policy') == 'substitute' else ''}"
    return f"{head}-{knobs}-{cid[:6]}"


def bad(key: str, value: Any, allowed: str) -> ConfigError:
    return ConfigError(f"{key}={value!r}: {allowed}")


def predictor_path(model: Mapping) -> str | None:
    """The predictor checkpoint of a model config: a name from `predictor.checkpoints` (its directory when set,
    else the one the predictor job published in the store, else None), otherwise a path or a special name."""
    pred = model.get("predictor") or {}
    name = pred.get("checkpoint")
    named = pred.get("checkpoints") or {}
    if name not in named:
        return name
    if named[name]:
        return named[name]
    found = stored_predictor(model, name)
    return str(found) if found is not None else None


def missing_predictor(cfg: DictConfig | Mapping) -> bool:
    """Whether a cell needs a learned predictor that is not there yet (the tiny build ships its own): what a
    cluster's sweep makes first (`experiment.plan`), and what validation refuses elsewhere."""
    d = as_dict(cfg)
    method, model = d["method"], d["model"]
    return method.get("predictor") == "learned" and not sources.builtin(model) and not predictor_path(model)


def make_predictor_command(model_name: str) -> str:
    return (
        f"python run.py -m experiment=traces model={model_name} && python run.py -m experiment=predictor "
        f"model={model_name}"
    )


def _missing_predictor(model: Mapping, method: str) -> ConfigError:
    """One line: the command that makes the predictor first, then where it was looked for and the alternative."""
    name = (model.get("predictor") or {}).get("checkpoint")
    root = predictor_root(model)
    reason = ""
    summary = root / "summary.json"
    if summary.is_file():  # trained, but this checkpoint was never reached (an accuracy level) or not published
        try:
            s = json.loads(summary.read_text())
            reason = (
                f" (the trained predictor has no {name!r}: final held-out accuracy {s.get('final_accuracy', 0):.3f}, "
                f"levels reached: {', '.join(s.get('published', [])) or 'none'})"
            )
        except (OSError, ValueError):
            pass
    return ConfigError(
        f"model.predictor.checkpoint={name!r}: method={method} needs a trained expert predictor for "
        f"model={model['name']}; make it with: {make_predictor_command(model['name'])} (or: make paper "
        f"MODEL={model['name']}){reason}; looked in {root / str(name)}; or set "
        f"model.predictor.checkpoints.{name or 'final'}=<directory>"
    )


def positive_ints(d: Mapping, keys: tuple[tuple[str, int], ...], prefix: str = "") -> None:
    for key, low in keys:
        v = d.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise bad(prefix + key, v, f"must be an integer >= {low}")


def _source(model: Mapping) -> sources.Source:
    """The record of the model's source (`ecospec.sources`); ConfigError for an unknown one."""
    if model.get("source") not in sources.names():
        raise bad("model.source", model.get("source"), f"allowed: {', '.join(sources.names())}")
    return sources.of(model)


def validate_model(model: Mapping) -> None:
    problem = _source(model).problem(model)
    if problem:
        raise ConfigError(problem)


def validate_dataset(dataset: Mapping, key: str = "dataset.name") -> None:
    if dataset.get("name") == MIX:
        members = dataset.get("members")
        if not members or isinstance(members, str):
            raise bad("dataset.members", members, "a non-empty list of the benchmarks to draw instances from")
        for name in members:
            if name not in DATASETS:
                raise bad("dataset.members", name, f"allowed: {', '.join(DATASETS)}")
        positive_ints(dataset, (("instances", 1),), "dataset.")
        if isinstance(dataset.get("seed"), bool) or not isinstance(dataset.get("seed"), int):
            raise bad("dataset.seed", dataset.get("seed"), "must be an integer")
        return
    if dataset.get("name") not in DATASETS:
        raise bad(key, dataset.get("name"), f"allowed: {', '.join(DATASETS)}, {MIX}")


def validate_num_prompts(d: Mapping) -> None:
    n = d.get("num_prompts")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise bad("num_prompts", n, "must be an integer >= 1, or null for the whole dataset")


def _launcher_gpus(cfg) -> int | None:
    """The Slurm launcher's GPUs per node where the config carries Hydra's node (a sweep), else None."""
    if not isinstance(cfg, DictConfig) or "hydra" not in cfg:
        return None
    try:
        return OmegaConf.select(cfg, "hydra.launcher.gpus_per_node", default=None)
    except Exception:  # noqa: BLE001 - a node that only resolves inside a run: nothing to check here
        return None


def validate_job(cfg: Job | DictConfig | Mapping, awaiting: bool = False) -> Any:
    """`Job.validate` for the config's job: what its body reads (a cell's `Cell`). `awaiting`: the job runs after
    others (a Slurm dependency), so what they make (the predictor) need not exist yet; each job checks again when it
    starts. A sweep's config also brings the Slurm launcher's GPUs per node, which `ranks` must fit."""
    try:
        job = kinds.job(cfg)
    except ValueError:
        raise bad("job", cfg.get("job"), f"allowed: {', '.join(kinds.names())}") from None
    gpus = _launcher_gpus(cfg)
    if gpus is not None:
        job = replace(job, config={**job.config, "_gpus_per_node": gpus})
    return job.validate(awaiting)


def validate_cell(job: Job, awaiting: bool = False) -> Cell:
    """The cell kind's validation: `validate`, then the typed cell, with the methods `interleave=` lists beside it
    as cells of their own (validated with it)."""
    validate(job.config, check_predictor=not awaiting)
    beside = tuple(cell_of(kinds.job(companion(job.config, name))) for name in interleave_methods(job.config))
    return cell_of(job, beside)


def validate_datasets(datasets, key: str, allowed: str) -> None:
    """A non-empty list of known benchmark names (GTO's and the predictor's training sets)."""
    if not datasets or isinstance(datasets, str):
        raise bad(key, datasets, allowed)
    for name in datasets:
        validate_dataset({"name": name}, key)


def model_family(model: Mapping) -> str | None:
    """The target's HF model_type from the config alone (no download: `sources.facts`); None when only loading the
    checkpoint would tell."""
    return (sources.facts(model) or {}).get("model_type")


def validate_parallel(d: Mapping) -> None:
    """model.parallel, ranks and dist_timeout_s: checked before any process starts or any group forms, with every
    rule the node would apply that the config already decides (`parallel.layout_problem`: the family's plans, KV
    heads over TP ranks, experts over EP ranks; the ranks over the Slurm launcher's GPUs per node)."""
    model = d["model"]
    mode = mode_of(model)
    if mode not in PARALLEL:
        raise bad("model.parallel", mode, f"allowed: {', '.join(PARALLEL)}")
    for where, value in (("ranks", d.get("ranks")), ("model.ranks", model.get("ranks"))):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise bad(where, value, "must be an integer >= 1 (or null)")
    t = d.get("dist_timeout_s", 600)
    if isinstance(t, bool) or not isinstance(t, int | float) or t <= 0:
        raise bad("dist_timeout_s", t, "must be a number of seconds > 0")
    ranks = job_ranks(d.get("ranks"), model)
    if mode == PARALLEL[0]:
        if ranks > 1:
            raise bad("ranks", ranks, "model.parallel=device_map runs one process; use model.parallel=tp or ep")
        return
    if ranks < 2:
        raise bad("ranks", ranks, f"model.parallel={mode} shards the target over ranks: set ranks >= 2")
    if model.get("device_map"):
        raise bad(
            "model.device_map",
            model.get("device_map"),
            f"model.parallel={mode} places the shards itself: set model.device_map=null",
        )
    family = model_family(model)
    facts = sources.facts(model)
    problem = layout_problem(family, mode, ranks, SimpleNamespace(**facts) if facts else None) if family else None
    if problem:
        raise bad("model.parallel", mode, f"model={model.get('name')} ({family}): {problem}")
    problem = rank_layout_problem(ranks, d.get("_gpus_per_node"))
    if problem:
        raise bad("ranks", ranks, problem)


def _validate_budget(d: Mapping) -> None:
    """MoE-Spec's knobs: a budgeted method needs expert_budget (no default), others must not set it."""
    budget, method = d.get("expert_budget"), d["method"]
    if method.get("budgeted"):
        if budget is None:
            raise bad(
                "expert_budget",
                None,
                f"method={method['name']} caps the experts of every verify pass: set "
                "expert_budget=<experts per MoE layer> (e.g. 8)",
            )
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise bad("expert_budget", budget, "must be an integer >= the model's top-k")
        top_k = (sources.facts(d["model"]) or {}).get("num_experts_per_tok")
        if top_k and budget < top_k:
            raise bad("expert_budget", budget, f"must be >= the model's top-k ({top_k}): a token needs k experts")
    elif budget is not None:
        raise bad("expert_budget", budget, "only method=moespec|ecospec_moespec take a budget (lossy methods)")
    if d.get("budget_policy", "truncate") not in ("truncate", "substitute"):
        raise bad("budget_policy", d.get("budget_policy"), "allowed: truncate, substitute")


AR_PEERS = ("hf_generate", "none")  # ar_peer: the other AR a batch-1 cell times beside ours (experiment.hf_peer)


def _validate_engine(d: Mapping) -> None:
    """engine=compiled's scope (docs/engine.md, The compiled engine; `engine.scope.compiled_problem`, what the
    engine itself asks): one line for what it does not run yet."""
    engine = d.get("engine") or "eager"
    if engine not in ENGINES:
        raise bad("engine", engine, f"allowed: {', '.join(ENGINES)}")
    if engine == "eager":
        return
    model = d.get("model") or {}
    problem = compiled_problem(
        model_family(model),
        drafter=drafter_of(d["method"], model),
        expert_budget=d.get("expert_budget"),
        batch_size=d.get("batch_size", 1),
        parallel=model.get("parallel"),
        backend=(d.get("backend") or {}).get("name", "hf"),
    )
    if problem:
        raise bad("engine", engine, problem)


def _validate_backend(d: dict, kind: str | None) -> bool:
    """The backend's own checks; True for a vLLM cell (fully checked here). What vLLM cannot run gets one line."""
    b = d.get("backend") or {"name": "hf"}
    name = b.get("name", "hf")
    if name not in BACKENDS:
        raise bad("backend", name, f"allowed: {', '.join(BACKENDS)}")
    method = d["method"]
    if name == "hf":
        if kind in MODEL_FREE:
            raise bad("method", method["name"], f"{kind} drafting runs on backend=vllm only (the HF engine has none)")
        return False
    if method["name"] not in VLLM_METHODS:
        raise bad(
            "method",
            method["name"],
            f"vLLM cannot run it (cost-aware tree selection, the oracle, GTO and "
            f"budgets are the HF engine's: backend=hf); on backend=vllm: {', '.join(VLLM_METHODS)}",
        )
    if d.get("expert_budget") is not None:
        raise bad("expert_budget", d["expert_budget"], "vLLM has no expert budget (MoE-Spec runs on backend=hf)")
    if d.get("trace_steps"):
        raise bad("trace_steps", d["trace_steps"], "vLLM records no verify-pass traces (backend=hf)")
    drafters = d["model"].get("drafters") or {}
    if kind not in (None, *MODEL_FREE) and kind not in drafters:
        raise ConfigError(
            f"method={method['name']} needs a {kind} drafter, but model={d['model']['name']} has none "
            f"(model.drafters has: {', '.join(drafters) or 'nothing'})"
        )
    spec = drafters.get(kind) or {}
    if spec.get("path") in SYNTHETIC_PATHS:
        raise bad(f"model.drafters.{kind}.path", spec["path"], "vLLM loads a drafter checkpoint (a path or HF id)")
    if _source(d["model"]).checkpoint is None:
        raise bad(
            "model",
            d["model"]["name"],
            f"a {d['model']['source']} model has no checkpoint for vLLM to load: use model=tiny or a real model",
        )
    if b.get("routed_experts") and d.get("device") == "cpu":
        raise bad("backend.routed_experts", True, ROUTED_ON_CPU)
    for key in ("max_model_len", "rounds", "warmups"):
        v = b.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < (0 if key == "warmups" else 1):
            raise bad(f"backend.{key}", v, "must be a positive integer")
    for key in ("tp", "requests", "requests_per_seq", "cpu_kv_cache_mib"):
        v = b.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise bad(f"backend.{key}", v, "must be null or a positive integer")
    return True


def interleave_methods(d: Mapping) -> list[str]:
    """The methods `interleave=` lists beside the cell's own (conf/method/<name>.yaml), [] without the knob."""
    names = d.get("interleave") or []
    if isinstance(names, str):
        names = [n for n in names.split(",") if n]
    return list(names)


def method_config(name: str) -> dict:
    path = conf_dir() / "method" / f"{name}.yaml"
    if not path.exists():
        have = ", ".join(sorted(p.stem for p in (conf_dir() / "method").glob("*.yaml")))
        raise ConfigError(f"interleave: unknown method {name!r} (conf/method has: {have})")
    return OmegaConf.to_container(OmegaConf.load(path), resolve=True)


def companion(d: Mapping, name: str) -> dict:
    """The config of listed method `name`'s own cell: the cell's, with its method (and no interleave)."""
    return {**d, "method": method_config(name), "interleave": None}


def validate_interleave(d: Mapping) -> None:
    """One line for what `interleave=` cannot do; each listed method is validated as its own cell."""
    names = interleave_methods(d)
    if not names:
        return
    main = d["method"]["name"]
    if d.get("batch_size", 1) != 1:
        raise ConfigError(f"interleave={','.join(names)}: batch_size 1 only (batch_size={d['batch_size']})")
    if d.get("expert_budget") is not None:
        raise ConfigError("interleave: not with expert_budget (the budget is a method's own setting)")
    if (d.get("backend") or {}).get("name", "hf") != "hf":
        raise ConfigError("interleave: our engine only (backend=hf)")
    if AR in names or main == AR:
        raise ConfigError("interleave: AR is decoded beside every method already; list SD methods only")
    if main in names or len(set(names)) < len(names):
        raise ConfigError(f"interleave={','.join(names)}: each method once, not the cell's own ({main})")
    for name in names:
        validate(companion(d, name))


def validate(cfg: DictConfig | Mapping, check_predictor: bool = True) -> None:
    """Raise ConfigError for the first value of a cell that cannot run, before anything heavy happens.
    `check_predictor`: a learned predictor must exist now (False when a job submitted before it makes it)."""
    d = as_dict(cfg) if isinstance(cfg, DictConfig) else cfg  # a Job's config is plain already
    validate_parallel(d)
    positive_ints(d, (("gamma", 2), ("depth", 1), ("topk", 1), ("batch_size", 1), ("max_new_tokens", 1)))
    if d.get("batch_buffer", "sequence") not in BATCH_BUFFERS:
        raise bad("batch_buffer", d.get("batch_buffer"), f"allowed: {', '.join(BATCH_BUFFERS)}")
    t = d.get("temperature")
    if isinstance(t, bool) or not isinstance(t, int | float) or t < 0:
        raise bad("temperature", t, "must be a number >= 0 (0 = greedy)")
    p = d.get("top_p")
    if isinstance(p, bool) or not isinstance(p, int | float) or not 0 < p <= 1:
        raise bad("top_p", p, "must be in (0, 1]")
    validate_num_prompts(d)
    if d.get("ar_baseline", "auto") not in ("auto", "interleaved", "cached"):
        raise bad("ar_baseline", d.get("ar_baseline"), "allowed: auto, interleaved, cached")
    if d.get("ar_peer", "hf_generate") not in AR_PEERS:
        raise bad("ar_peer", d.get("ar_peer"), f"allowed: {', '.join(AR_PEERS)}")
    if d.get("clock", "auto") not in CLOCKS:
        raise bad("clock", d.get("clock"), f"allowed: {', '.join(CLOCKS)}")
    if d.get("split", "heldout") not in SPLITS:
        raise bad("split", d.get("split"), f"allowed: {', '.join(SPLITS)}")
    ts = d.get("trace_steps")
    if isinstance(ts, bool) or not isinstance(ts, int) or ts < 0:
        raise bad("trace_steps", ts, "must be an integer >= 0 (verify passes whose routes the record keeps)")
    if not isinstance(d.get("seed"), int):
        raise bad("seed", d.get("seed"), "must be an integer")
    _validate_budget(d)
    _validate_engine(d)

    model, method, dataset = d["model"], d["method"], d["dataset"]
    validate_model(model)
    validate_dataset(dataset)
    if method.get("selector") not in method_names():
        raise bad("method.selector", method.get("selector"), f"allowed: {', '.join(method_names())}")

    kind = drafter_of(method, model)
    drafters = model.get("drafters") or {}
    if d.get("interleave"):
        validate_interleave(d)
    if _validate_backend(d, kind):
        return  # a vLLM cell: the rest is the HF engine's
    if kind is None:
        if method["name"] != AR:
            raise bad("method.drafter", None, "only method=ar decodes without a drafter")
    elif kind not in drafter_names():
        raise bad("method.drafter", method.get("drafter"), f"allowed: default, {', '.join(drafter_names())}")
    elif kind not in drafters:
        have = ", ".join(drafters) or "nothing"
        raise ConfigError(
            f"method={method['name']} needs a {kind} drafter, but model={model['name']} has none "
            f"(model.drafters has: {have}); pick another method or set model.drafters.{kind}"
        )
    temp = ((drafters.get(kind) or {}) if kind else {}).get("temperature")
    if temp is not None and not (temp == "calibrated" and sources.builtin(model)):
        temps = temp if isinstance(temp, list | tuple) and temp else [temp]  # one per draft depth, or one for all
        if any(isinstance(x, bool) or not isinstance(x, int | float) or x <= 0 for x in temps):
            raise bad(
                f"model.drafters.{kind}.temperature",
                temp,
                "null (1.0), a number > 0, or calibrated (the tiny build's fitted draft temperature; model=tiny only)",
            )
    missing = drafter_kind_record(kind).missing if kind and check_predictor else None
    problem = missing(model) if missing else None
    if problem:
        raise ConfigError(f"model.drafters.{kind}.path=None: method={method['name']} needs {problem}")
    pred = method.get("predictor")
    if pred not in (None, *PREDICTORS):
        raise bad("method.predictor", pred, f"allowed: null, {', '.join(PREDICTORS)}")
    needs = method_spec(method["selector"]).predictor
    if needs is not None and pred != needs:
        raise bad("method.predictor", pred, f"selector {method['selector']} needs predictor={needs}")
    if pred == "learned":
        path = predictor_path(model)
        if sources.builtin(model):
            if path not in TINY_CHECKPOINTS:
                raise bad("model.predictor.checkpoint", path, f"the tiny build has {', '.join(TINY_CHECKPOINTS)}")
        elif not path and check_predictor:
            raise _missing_predictor(model, method["name"])
