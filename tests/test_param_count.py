"""The parameter count from a config's fields (`models.param_count`) against the model built on the meta device."""

from __future__ import annotations

import pytest
from transformers import AutoConfig

from ecospec import conf_dir
from ecospec.analysis.model_config import facts_of, hf_config, load_model_config
from ecospec.models import PRESETS, config_moe_info, tiny_config
from ecospec.models.param_count import count_params

MODELS = sorted(p.stem for p in (conf_dir() / "model").glob("*.yaml"))


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_family_preset_counts_as_its_meta_model(preset):
    config = tiny_config(preset)
    assert count_params(config.to_dict()) == config_moe_info(config)


@pytest.mark.parametrize("name", MODELS)
def test_every_conf_model_counts_as_its_meta_model(name):
    model = load_model_config(name)
    config = hf_config(model, facts_of(model))
    assert count_params(config.to_dict()) == config_moe_info(config)


@pytest.mark.parametrize("name", [m for m in MODELS if (facts_of(load_model_config(m)).get("hf_config"))])
def test_the_facts_alone_count_as_the_full_config(name):
    """conf/model facts name every field a count depends on: the raw mapping counts as the HF config built from it
    (class defaults filled in), so a reader without transformers counts the same."""
    facts = dict(facts_of(load_model_config(name))["hf_config"])
    config = AutoConfig.for_model(facts.pop("model_type"), **facts)
    assert count_params(facts_of(load_model_config(name))["hf_config"]) == config_moe_info(config)


def test_an_unsupported_family_is_named():
    with pytest.raises(ValueError, match="llama"):
        count_params({"model_type": "llama", "hidden_size": 8})
