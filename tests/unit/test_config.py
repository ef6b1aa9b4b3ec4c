import pytest

from kvgraft_plugin import ConfigError, EngineConfig, LlamaConfig, SamplingParams


def test_defaults_are_valid():
    config = EngineConfig()
    assert config.llama.flash_attn is False and config.llama.type_k == "f16"
    assert config.threshold is None and config.stop is None


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n_ctx": 0},
        {"n_batch": -1},
        {"n_ubatch": 1024, "n_batch": 512},
        {"type_k": "q3_x"},
        {"type_v": "q8_0"},
        {"n_threads": True},
        {"n_gpu_layers": -2},
    ],
)
def test_bad_llama_settings_raise(kwargs):
    with pytest.raises(ConfigError):
        LlamaConfig(**kwargs)


@pytest.mark.parametrize("kwargs", [{"threshold": 1.5}, {"neighbors": 0}, {"max_tokens": 0}, {"fallback": "maybe"}])
def test_bad_engine_settings_raise(kwargs):
    with pytest.raises(ConfigError):
        EngineConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": -1},
        {"temperature": float("nan")},
        {"top_k": -1},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"min_p": 2.0},
        {"repeat_penalty": 0.0},
        {"penalty_last_n": -2},
        {"seed": -1},
        {"seed": 2**32 - 1},
        {"seed": 1.5},
        {"grammar": "  "},
        {"top_k": True},
    ],
)
def test_bad_sampling_settings_raise(kwargs):
    with pytest.raises(ConfigError):
        SamplingParams(**kwargs)


def test_sampling_settings_are_flat_settings_too():
    config = EngineConfig().with_settings(temperature=0.8, top_k=40, seed=3, neighbors=2)
    assert config.sampling == SamplingParams(temperature=0.8, top_k=40, seed=3) and config.neighbors == 2
    assert config.with_settings(top_p=0.9).sampling == SamplingParams(temperature=0.8, top_k=40, top_p=0.9, seed=3)
    assert EngineConfig().with_settings(sampling=SamplingParams(seed=7), top_p=0.5).sampling.top_p == 0.5
    assert SamplingParams().greedy and not SamplingParams().penalized
    assert (
        SamplingParams(repeat_penalty=1.1).penalized
        and not SamplingParams(repeat_penalty=1.1, penalty_last_n=0).penalized
    )
    with pytest.raises(ConfigError, match="not a sampling setting"):
        SamplingParams().replace(top_kk=1)


def test_quantized_v_needs_flash_attention():
    assert LlamaConfig(type_k="q8_0", type_v="q8_0", flash_attn=True).type_v == "q8_0"


def test_replace_validates():
    with pytest.raises(ConfigError):
        EngineConfig().replace(neighbors=-3)


def test_with_settings_splits_flat_settings_and_keeps_defaults_for_none():
    config = EngineConfig().with_settings(n_ctx=2048, type_k="q8_0", threshold=0.6, stop="END", neighbors=None)
    assert config.llama.n_ctx == 2048 and config.llama.type_k == "q8_0"
    assert config.threshold == 0.6 and config.stop == ("END",) and config.neighbors == 4
    with pytest.raises(ConfigError, match="unknown settings"):
        EngineConfig().with_settings(n_ctxx=1)
    with pytest.raises(ConfigError):
        EngineConfig().with_settings(n_batch=0)


def test_no_command_line_option_is_declared_twice():
    # click lets the later of two equal flags win silently: `calibrate --related` once ran the threshold
    # calibration because the routing options declared a `--related` switch too
    from kvgraft_plugin.cli import main

    def commands(group):
        for command in group.commands.values():
            yield from commands(command) if hasattr(command, "commands") else (command,)

    for command in commands(main):
        flags = [flag for param in command.params for flag in (*param.opts, *param.secondary_opts)]
        assert len(flags) == len(set(flags)), (command.name, sorted({f for f in flags if flags.count(f) > 1}))
