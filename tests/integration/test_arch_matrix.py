"""The architecture matrix: tiny random-weight GGUF models of dense, sliding-window, mixture-of-experts,
recurrent, hybrid and M-RoPE architectures, each checked by the doctor, and a library built and grafted on
some of them."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kvgraft_plugin import ConfigError, Entry, GraftEngine, build_library
from kvgraft_plugin.adapters.llama_cpp import inspect_seq_state
from kvgraft_plugin.cli import main
from kvgraft_plugin.core.statefile import StateLayout
from kvgraft_plugin.tools.doctor import MATRIX_SETTINGS
from kvgraft_plugin.tools.tiny_models import TINY_ARCHS, write_tiny_model

ROW_KEYS = {"arch", "layers", "swa", "recurrent", "hybrid", "mrope", "moe", "exact", "max_abs_diff",
            "state_bytes_per_token", "note"}  # fmt: skip


def test_every_architecture_in_the_matrix_grafts_exactly():
    result = CliRunner().invoke(main, ["doctor", "--arch-matrix", "--json"], catch_exceptions=False)
    rows = json.loads(result.stdout)
    assert result.exit_code == 0, result.output
    assert [r["arch"] for r in rows] == list(TINY_ARCHS) and all(set(r) == ROW_KEYS for r in rows)
    assert all(r["exact"] and r["max_abs_diff"] == 0.0 and not r["note"] for r in rows), rows
    assert len(rows) >= 18 and any(r["swa"] for r in rows) and any(r["moe"] for r in rows)
    assert sum(r["recurrent"] for r in rows) >= 2 and sum(r["hybrid"] for r in rows) >= 4
    assert sum(r["mrope"] for r in rows) >= 2
    # a recurrent state does not grow with the prefix: it is far smaller per token than a KV cache
    per_token = {r["arch"]: r["state_bytes_per_token"] for r in rows}
    assert per_token["mamba"] < per_token["llama"]


@pytest.mark.parametrize("arch", ["mamba", "gemma2", "qwen2vl", "nemotron_h"])
def test_a_library_on_a_tiny_model_grafts_as_text_rag(arch, tmp_path):
    """No request falls back for a layout the build accepted: build, then answer by graft and by text RAG."""
    model = write_tiny_model(tmp_path / f"{arch}.gguf", arch)
    entries = [
        Entry("e1", "What is 17 times 23?", "17 times 23 is 391.", "391"),
        Entry("e2", "Name the largest planet.", "Jupiter is the largest planet.", "Jupiter"),
    ]
    settings = {**MATRIX_SETTINGS, "model_path": str(model)}
    with GraftEngine(None, **settings) as builder:
        build_library(tmp_path / "lib", entries, engine=builder)
        layout = builder.backend.layout
    spec = TINY_ARCHS[arch]
    assert layout.recurrent == (spec.recurrent or spec.hybrid) and layout.cell_ext == spec.mrope
    assert layout.kv_sections == (0 if spec.recurrent else 2 if spec.swa else 1)
    with GraftEngine(tmp_path / "lib", **settings) as engine:
        for entry in entries:
            graft = engine.ask(entry.problem, mode="graft", max_tokens=12, stop=[])
            text_rag = engine.ask(entry.problem, mode="text-rag", max_tokens=12, stop=[])
            auto = engine.ask(entry.problem, max_tokens=12, stop=[])
            assert (graft.route, graft.fallback_reason, auto.route) == ("graft", None, "graft")
            assert graft.text == text_rag.text == auto.text and graft.restored_tokens > 0
            state = engine.load_state(engine.library.get(entry.id))
            info = inspect_seq_state(state.payload, layout)
            assert info.n_tokens == len(state.tokens) and bool(info.recurrent_types) == layout.recurrent


def test_a_state_that_does_not_walk_as_its_layout_is_refused_at_build_by_name(tmp_path):
    """A model whose state is not laid out as kvgraft reads it (here: told its cells carry M-RoPE positions
    they do not have) is refused before its first entry, naming the layout; plain decoding still works."""
    model = write_tiny_model(tmp_path / "llama.gguf", "llama")
    with GraftEngine(None, model_path=str(model), **MATRIX_SETTINGS) as engine:
        engine.backend.layout = StateLayout(1, cell_ext=True)
        with pytest.raises(ConfigError, match="llama: its state is not laid out as attention KV with M-RoPE"):
            build_library(tmp_path / "lib", [Entry("e1", "What is 2 plus 2?", "It is 4.", "4")], engine=engine)
        assert engine.ask("What is 2 plus 2?", max_tokens=4).route == "plain"
    assert not list((tmp_path / "lib").glob("states/*"))
