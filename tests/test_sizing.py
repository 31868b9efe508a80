"""The sizing command recommends only what validation accepts: every conf/model with sizing facts, on every GPU
type, with and without the quantized kernels, prints a command that composes and validates (with its Slurm
launcher's GPUs per node), and validation refuses what a node would refuse later."""

import pytest
from hydra import compose, initialize_config_dir

from ecospec import conf_dir
from ecospec.analysis.model_config import load_model_config
from ecospec.analysis.sizing import GPU_MEMORY, QUANTIZED, size
from ecospec.analysis.weight_bytes import model_cost
from ecospec.experiment.config import ConfigError, validate_job

SIZED = sorted(
    p.stem
    for p in (conf_dir() / "model").glob("*.yaml")
    if (load_model_config(p.stem).get("facts") or {}).get("hf_config")
)


def _compose(*overrides: str):
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=True)


def test_the_sized_models_are_the_papers():
    assert {"qwen3", "gptoss", "deepseek", "mixtral", "qwen3_30b"} <= set(SIZED)


@pytest.mark.parametrize("model", SIZED)
def test_every_printed_command_validates(model):
    stored = model_cost(load_model_config(model)).storage.values()
    for gpu in GPU_MEMORY:
        for kernels in (True, False) if any(v in QUANTIZED for v in stored) else (True,):
            s = size(model, gpu, kernels=kernels)
            overrides = s.launch().split()
            # the method a user starts with (no predictor needed); predictor-method checks are not sizing's
            cfg = _compose(*overrides, "method=ar")
            validate_job(cfg)
            if s.parallel == "device_map":
                assert s.gpus <= 8 or any("one node only" in n for n in s.notes), (model, gpu, kernels, s)


def test_validation_refuses_what_a_node_would():
    with pytest.raises(ConfigError, match="4 KV heads cannot be split over 8 ranks"):
        validate_job(_compose("model=qwen3", "model.parallel=tp", "model.device_map=null", "ranks=8", "method=ar"))
    with pytest.raises(ConfigError, match="expert-parallel GPT-OSS forward fails"):
        validate_job(_compose("model=gptoss", "model.parallel=ep", "model.device_map=null", "ranks=4", "method=ar"))
    with pytest.raises(ConfigError, match="256 experts cannot be divided over 3 ranks"):
        validate_job(_compose("model=deepseek", "model.parallel=ep", "ranks=3", "method=ar"))
    with pytest.raises(ConfigError, match="ranks=12 is not a multiple of the 8 GPUs per node"):
        validate_job(
            _compose("model=deepseek", "ranks=12", "cluster=slurm_gpu", "hydra.launcher.gpus_per_node=8", "method=ar")
        )
    validate_job(_compose("model=qwen3", "model.parallel=tp", "model.device_map=null", "ranks=4", "method=ar"))
