"""Where kvgraft keeps what it caches on this machine: one root, computed here only."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_root"]


def cache_root() -> Path:
    """kvgraft's cache folder: ``$XDG_CACHE_HOME/kvgraft``, else ``~/.cache/kvgraft``.

    Under it: ``libraries/`` (mirrors of libraries at a URL), ``invariance/`` (batch-invariance results),
    ``models/`` and the demo libraries. Read at each call, so a test or a tool may point it elsewhere.
    """
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvgraft"
