import pytest

from kvgraft_plugin import ConfigError, EngineConfig, LlamaConfig


def test_defaults_are_valid():
    config = EngineConfig()
    assert config.llama.flash_attn is False and config.llama.type_k == "f16"
    assert config.threshold is None and config.stop == ("\n",)


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
