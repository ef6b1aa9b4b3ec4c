"""`atomic_write` (issue 29): library files follow the umask, which is never changed to read it (the umask is
process-wide: flipping it, even briefly, gives files that other threads create meanwhile the wrong mode)."""

from __future__ import annotations

import os
import stat

import pytest

from kvgraft_plugin.core.statefile import atomic_write


@pytest.mark.skipif(os.name != "posix", reason="modes are POSIX")
@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_atomic_write_follows_the_umask_without_changing_it(tmp_path, monkeypatch, mask):
    old = os.umask(mask)
    try:
        with monkeypatch.context() as patched:

            def changed(new: int) -> int:
                raise AssertionError(f"os.umask({new:#o}) was called: it changes every thread's new files")

            patched.setattr(os, "umask", changed)
            atomic_write(tmp_path / "f.json", "{}")
            atomic_write(tmp_path / "f.json", "{} ")  # over an existing file too
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "f.json").stat().st_mode) == 0o666 & ~mask
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]  # no temp file left
