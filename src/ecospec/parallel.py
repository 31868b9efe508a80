"""How a target is spread over devices, the way the field runs large MoE models.

`parallel` (a model config knob):

* ``device_map``: one process; accelerate places whole layers on successive GPUs (``device_map="auto"``), so a
  forward walks through them one GPU at a time (the regime of the paper's HF prototype). The default.
* ``tp``: tensor parallelism over every rank of a torch.distributed group (one process per GPU, SPMD):
  transformers shards each layer by the config's ``base_model_tp_plan`` (attention heads column/row-wise, experts
  ``moe_tp_experts``) and all-reduces, so a pass reads all GPUs' HBM at once, and the group can span nodes.
* ``ep``: tensor parallelism for the dense part plus expert parallelism (``base_model_ep_plan``): each rank holds
  N / ranks whole experts.

Every rank holds the same routers (replicated in every plan), so routing captured on any rank is the model's.
What each family's plan shards, read from transformers' config classes (no download; `plans`):
Qwen3-MoE and Mixtral shard attention and experts; DeepSeek-V3 the experts and dense MLPs (its MLA attention is
replicated); GPT-OSS's TP plan shards only the input embedding, so under ``tp`` every GPU holds every expert
and layer, and its ``ep`` forward fails in transformers (`BROKEN`): GPT-OSS beyond one GPU runs ``device_map``.
`layout_problem` holds these rules for validation, the sizing command and the loader alike.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import timedelta

from ecospec.families import families

PARALLEL = ("device_map", "tp", "ep")


def mode_of(model: Mapping) -> str:
    """A model config's `parallel` mode; unset is device_map, one process."""
    return model.get("parallel") or PARALLEL[0]


def job_ranks(ranks: int | None, model: Mapping) -> int:
    """The ranks a job asks for: its `ranks`, else its model config's, else 1."""
    return int(ranks or model.get("ranks") or 1)


# family -> HF config class module and name (read without building a model)
_CONFIG_CLASSES = {f.name: f.config_class for f in families()}
# (family, mode) that transformers' plans name but that do not run (each family's record says why; measured with
# transformers 5.24 on CPU/gloo, tests/test_parallel.py)
BROKEN = {(f.name, mode): why for f in families() for mode, why in f.broken.items()}


def plans(family: str) -> dict[str, dict]:
    """{"tp": base_model_tp_plan, "ep": base_model_ep_plan} of a family's HF config class ({} where it has none)."""
    import importlib

    if family not in _CONFIG_CLASSES:
        return {"tp": {}, "ep": {}}
    module, name = _CONFIG_CLASSES[family]
    cls = getattr(importlib.import_module(module), name)
    return {
        "tp": dict(getattr(cls, "base_model_tp_plan", None) or {}),
        "ep": dict(getattr(cls, "base_model_ep_plan", None) or {}),
    }


def plan_problem(family: str, mode: str) -> str | None:
    """Why `family` cannot run under `mode`, or None."""
    if mode not in PARALLEL:
        return f"allowed: {', '.join(PARALLEL)}"
    if mode == "device_map":
        return None
    if not plans(family)[mode]:
        return f"{family} has no {'tensor' if mode == 'tp' else 'expert'}-parallel plan in transformers"
    return BROKEN.get((family, mode))


def kv_head_problem(family: str, config, ranks: int) -> str | None:
    """Why `ranks` cannot tensor-shard this config's attention, or None: transformers' plan splits q/k/v column-
    wise, so the KV heads must divide over the ranks (a tiny Qwen3-MoE with 1 KV head on 2 ranks fails in the
    attention reshape). MLA (DeepSeek) and GPT-OSS keep attention replicated."""
    if not any("self_attn" in key for key in plans(family)["tp"]):
        return None
    kv = getattr(config, "num_key_value_heads", None) or getattr(config, "num_attention_heads", 1)
    heads = getattr(config, "num_attention_heads", kv)
    if kv % ranks or heads % ranks:
        return f"{heads} attention / {kv} KV heads cannot be split over {ranks} ranks; use parallel=device_map"
    return None


def num_experts(config) -> int | None:
    """Routed experts per MoE layer of a config (or a facts namespace), whatever the family calls them."""
    for key in ("num_experts", "num_local_experts", "n_routed_experts"):
        if getattr(config, key, None):
            return int(getattr(config, key))
    return None


def layout_problem(family: str, mode: str, ranks: int, config=None) -> str | None:
    """Why `family` cannot run under `mode` over `ranks` ranks, or None: the one place for what each family's
    plans allow (`plan_problem`), the KV heads a TP-sharded attention splits (`kv_head_problem`) and the experts EP
    divides over the ranks. `config`: the HF config or any object with its attributes (the facts of conf/model);
    without one only the plan is checked. Validation, the sizing command and the loader all ask this."""
    problem = plan_problem(family, mode)
    if problem or mode == "device_map" or config is None:
        return problem
    problem = kv_head_problem(family, config, ranks)
    if problem:
        return problem
    n = num_experts(config)
    if mode == "ep" and n and n % ranks:
        return f"{n} experts cannot be divided over {ranks} ranks; use a rank count that divides them"
    return None


def shards_experts(family: str, mode: str) -> bool:
    """Whether `mode`'s plan spreads the routed experts over the ranks (GPT-OSS's TP plan does not)."""
    return mode != "device_map" and any("experts" in key for key in plans(family)[mode])


def rank_layout_problem(ranks: int, gpus_per_node: int | None) -> str | None:
    """Why `ranks` tasks (one per GPU) cannot be laid out on nodes of `gpus_per_node` GPUs, or None."""
    if gpus_per_node and ranks > 1 and ranks % gpus_per_node:
        return f"ranks={ranks} is not a multiple of the {gpus_per_node} GPUs per node (hydra.launcher.gpus_per_node)"
    return None


def distributed_config(mode: str, world: int):
    """transformers' DistributedConfig for `mode` over `world` ranks."""
    from transformers.distributed import DistributedConfig

    if mode == "tp":
        return DistributedConfig(tp_size=world)
    if mode == "ep":
        return DistributedConfig(tp_size=world, ep_size=world)
    raise ValueError(f"parallel={mode!r} takes no distributed config")


# -- the process group --------------------------------------------------------------------------------------


def rank() -> int:
    """This process's rank (0 without a process group)."""
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def world() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def is_main() -> bool:
    """Only rank 0 writes records, checkpoints, W&B runs and logs."""
    return rank() == 0


def env_world() -> int:
    """Ranks the environment asks for: torchrun's WORLD_SIZE, else Slurm's task count (submitit), else 1."""
    for key in ("WORLD_SIZE", "SLURM_NTASKS"):
        if os.environ.get(key):
            return int(os.environ[key])
    return 1


def env_rank() -> int:
    """This process's rank as its launcher set it (torchrun's RANK, Slurm's SLURM_PROCID), before any group."""
    for key in ("RANK", "SLURM_PROCID"):
        if os.environ.get(key):
            return int(os.environ[key])
    return 0


def init_group(timeout_s: float, device_type: str) -> None:
    """Join the process group the environment describes (torchrun: RANK/WORLD_SIZE/MASTER_ADDR/PORT; Slurm:
    submitit's TorchDistributedEnvironment exports them from SLURM_*), gloo on CPU and nccl on GPUs. Every
    collective times out after `timeout_s`, so a rank that died makes the others fail instead of hang."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    if "RANK" not in os.environ and os.environ.get("SLURM_NTASKS"):
        import submitit

        submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
    backend = "nccl" if device_type == "cuda" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))


def full_tensor(t):
    """A plain tensor of `t`: a DTensor (a sharded or replicated parameter) is gathered, others returned as is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t
