"""The fast tier: `make test-fast` sets ``KVGRAFT_FAST_TIER=1`` and these tests then run with llama.cpp,
torch and sentence-transformers unimportable, so no test here can load a model or the native library
without failing. Under ``make test`` they run beside the real-model tests, unrestricted."""

from __future__ import annotations

import importlib.abc
import os
import sys

BLOCKED = ("llama_cpp", "torch", "sentence_transformers", "transformers")


class _NoNativeImports(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in BLOCKED:
            raise ImportError(f"{fullname} is not importable in the fast tier (tests/unit/conftest.py)")
        return None


if os.environ.get("KVGRAFT_FAST_TIER") == "1":
    loaded = sorted(name for name in sys.modules if name.split(".")[0] in BLOCKED)
    if loaded:
        raise RuntimeError(f"already imported before the fast tier began: {loaded}")
    sys.meta_path.insert(0, _NoNativeImports())
