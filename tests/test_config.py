import dataclasses

import pytest

from qdflash.config import (PRESETS, ConfigError, DataConfig, DrafterConfig, DrafterQuantConfig, EvalConfig,
                            FiguresConfig, QADConfig, from_dict, load_config, to_dict)

STAGES = [DataConfig, QADConfig, DrafterConfig, DrafterQuantConfig, EvalConfig, FiguresConfig]


@pytest.mark.parametrize("cls", STAGES)
@pytest.mark.parametrize("preset", PRESETS)
def test_presets_valid_and_roundtrip(cls, preset):
    cfg = load_config(cls, preset)
    assert cfg.preset == preset
    assert from_dict(cls, to_dict(cfg)) == cfg
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.preset = "x"


@pytest.mark.parametrize("cls", STAGES)
def test_unknown_key_rejected(cls):
    with pytest.raises(ConfigError, match="unknown key"):
        load_config(cls, "tiny", definitely_not_a_key=1)


def test_unknown_preset_and_bad_values():
    with pytest.raises(ConfigError, match="unknown preset"):
        load_config(QADConfig, "huge")
    with pytest.raises(ConfigError, match="block_size"):
        load_config(DrafterConfig, "tiny", block_size=1)
    with pytest.raises(ConfigError, match="init_from"):
        load_config(QADConfig, "tiny", init_from="awq")
    for cls in (DrafterConfig, DrafterQuantConfig):
        with pytest.raises(ConfigError, match="decoder must be"):
            load_config(cls, "tiny", decoder="cudagraph")


def test_smol_group_size_divides_hidden():
    # SmolLM2: hidden 576 and FFN 1536 are multiples of 32 but 576 is not of 128
    g = load_config(QADConfig, "smol").group_size
    assert 576 % g == 0 and 1536 % g == 0


def test_parse_overrides_reads_json_values_keeps_strings_and_refuses_a_pair_without_equals():
    """``config.parse_overrides`` (``qdflash run --set`` and the benchmark scripts' ``--set``): JSON where the value
    parses (numbers, lists, booleans), the string itself where it does not, and a one-line error without ``=``."""
    from qdflash.config import parse_overrides
    got = parse_overrides(["lr=6.25e-5", "grid_targets=[\"qad\"]", "direct_ablation=false", "decoder=eager", "a=b=c"])
    assert got == {"lr": 6.25e-5, "grid_targets": ["qad"], "direct_ablation": False, "decoder": "eager", "a": "b=c"}
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_overrides(["lr"])
