import pytest

from kvgraft_plugin import ConfigError, EngineConfig, LlamaConfig


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


@pytest.mark.parametrize(
    "kwargs", [{"threshold": 1.5}, {"top_k": 0}, {"max_tokens": 0}, {"temperature": -1}, {"fallback": "maybe"}]
)
def test_bad_engine_settings_raise(kwargs):
    with pytest.raises(ConfigError):
        EngineConfig(**kwargs)


def test_quantized_v_needs_flash_attention():
    assert LlamaConfig(type_k="q8_0", type_v="q8_0", flash_attn=True).type_v == "q8_0"


def test_replace_validates():
    with pytest.raises(ConfigError):
        EngineConfig().replace(top_k=-3)


def test_with_settings_splits_flat_settings_and_keeps_defaults_for_none():
    config = EngineConfig().with_settings(n_ctx=2048, type_k="q8_0", threshold=0.6, stop="END", top_k=None)
    assert config.llama.n_ctx == 2048 and config.llama.type_k == "q8_0"
    assert config.threshold == 0.6 and config.stop == ("END",) and config.top_k == 4
    with pytest.raises(ConfigError, match="unknown settings"):
        EngineConfig().with_settings(n_ctxx=1)
    with pytest.raises(ConfigError):
        EngineConfig().with_settings(n_batch=0)
