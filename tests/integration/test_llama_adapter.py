"""The llama.cpp adapter's own refusals (it needs the native library, so it is not in the fast tier)."""

from __future__ import annotations

import pytest


def test_capture_refuses_an_unpinned_llama_cpp_python(monkeypatch):
    from kvgraft_plugin import BackendError
    from kvgraft_plugin.adapters import llama_cpp as backend_module

    monkeypatch.setattr(backend_module, "llama_cpp_version", lambda: "9.9.9")
    with pytest.raises(BackendError, match="0.3.36"):
        backend_module.LlamaBackend.capture_state(object())  # type: ignore[arg-type]
