from __future__ import annotations

import pytest

from gpulab.workflow.config import ConfigError, config_hash, load_config, run_targets, validate_config


def test_default_config_is_valid_and_defaults_filled(repo):
    config = load_config(repo / "config.yaml")
    assert config["target"] == "local"
    assert config["strict"] is False
    assert config["timing"]["min_reps"] >= 3
    assert config["report"]["output"] == "reports/report.html"
    assert run_targets(config) == ["local"]


def test_every_schema_property_is_documented():
    from gpulab.workflow.config import load_schema

    def walk(node, path):
        for key, sub in node.get("properties", {}).items():
            assert "description" in sub, f"{path}{key} lacks a description"
            assert "default" in sub, f"{path}{key} lacks a default"
            walk(sub, f"{path}{key}.")

    walk(load_schema(), "")


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"bogus": 1}, "unknown key 'bogus'"),
        (
            {"bench": {"dtype": ["fp32"]}},
            "unknown key 'bench.dtype'; allowed keys here: dtypes, impls, max_tensor_mib, ops, sizes, tolerances",
        ),
        (
            {"bench": {"dtypes": ["fp64"]}},
            "bench.dtypes[0]: 'fp64' is not allowed; expected one of 'fp32', 'fp16', 'bf16'",
        ),
        ({"bench": {"ops": ["conv"]}}, "bench.ops[0]: 'conv' is not allowed; expected one of 'gelu', 'softmax', 'add'"),
        ({"bench": {"sizes": {"gelu": [-4]}}}, "bench.sizes.gelu[0]: -4 is not allowed; expected integer >= 1"),
        ({"strict": "yes"}, "strict: 'yes' is not allowed; expected boolean"),
        ({"mlp": {"dim": 0}}, "mlp.dim: 0 is not allowed; expected 'auto' or integer >= 1"),
        ({"target": "a b"}, "target: 'a b' is not allowed"),
    ],
)
def test_bad_config_names_key_and_allowed_values(config, expected):
    with pytest.raises(ConfigError) as info:
        validate_config(config)
    assert expected in str(info.value)


def test_all_problems_are_reported_at_once():
    with pytest.raises(ConfigError) as info:
        validate_config({"strict": 1, "bench": {"dtypes": ["fp8"]}})
    assert "2 problem(s)" in str(info.value)


def test_config_hash_is_stable_and_sensitive():
    a = validate_config({})
    b = validate_config({"strict": True})
    assert config_hash(a) == config_hash(validate_config({}))
    assert config_hash(a) != config_hash(b)


def test_targets_map_drives_run_targets():
    config = validate_config({"targets": {"h100": {"partition": "gpu-h100"}, "mi300x": {"partition": "mi"}}})
    assert run_targets(config) == ["h100", "mi300x"]
    assert config["targets"]["h100"]["gpus"] == 1


def test_command_line_strings_become_the_schema_types():
    # What `snakemake --config strict=true mlp='{dim: 1024, num_steps: 3}' ...` hands over: nested strings.
    config = validate_config({
        "strict": "true",
        "mlp": {"dim": "1024", "num_steps": "3", "batch": "auto"},
        "bench": {"sizes": {"gelu": ["1048576"], "softmax": [["4096", "1024"]]}, "max_tensor_mib": "64"},
        "timing": {"min_time_s": "0.5", "flush_cache": "False"},
        "llm": {"compile": "false", "top_p": "1", "models": ["tiny"]},
        "targets": {"h100": {"gpus": "2", "env": {"X": "1"}, "partition": "null"}},
    })
    assert config["strict"] is True
    assert config["mlp"]["dim"] == 1024 and config["mlp"]["num_steps"] == 3 and config["mlp"]["batch"] == "auto"
    assert config["bench"]["sizes"] == {"gelu": [1048576], "softmax": [[4096, 1024]]}
    assert config["bench"]["max_tensor_mib"] == 64
    assert config["timing"]["min_time_s"] == 0.5 and config["timing"]["flush_cache"] is False
    assert config["llm"]["compile"] is False and config["llm"]["top_p"] == 1
    assert config["targets"]["h100"]["gpus"] == 2 and config["targets"]["h100"]["env"] == {"X": "1"}
    assert config["targets"]["h100"]["partition"] is None


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"strict": "yes please"}, "strict: 'yes please' is not allowed; expected boolean"),
        ({"bench": {"sizes": {"gelu": ["1e6"]}}}, "bench.sizes.gelu[0]: '1e6' is not allowed; expected integer >= 1"),
        ({"timing": {"min_time_s": "fast"}}, "timing.min_time_s: 'fast' is not allowed; expected 'auto' or number > 0"),
        ({"mlp": {"dim": "0"}}, "mlp.dim: '0' is not allowed; expected 'auto' or integer >= 1"),
        ({"timing": {"min_time_s": "nan"}}, "timing.min_time_s: 'nan' is not allowed"),
    ],
)
def test_command_line_errors_quote_what_was_typed(config, expected):
    with pytest.raises(ConfigError) as info:
        validate_config(config)
    assert expected in str(info.value)
