"""The built wheel, installed into a fresh virtual environment, runs ``kvgraft demo`` from outside the
checkout: the example libraries ship as package data and the declared dependencies suffice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_installed_wheel_runs_the_demo_outside_the_checkout(tmp_path):
    def run(*args, **kwargs):
        return subprocess.run([str(a) for a in args], check=True, capture_output=True, text=True, **kwargs)

    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", ROOT, "-w", tmp_path / "dist")
    (wheel,) = (tmp_path / "dist").glob("kvgraft_plugin-*.whl")
    venv.create(tmp_path / "venv", with_pip=True)
    bin_dir = tmp_path / "venv" / "bin"
    # the CPU torch on this disk first (any other pulls GBs of CUDA); llama-cpp-python comes from pip's wheel cache
    run(bin_dir / "pip", "install", "-q", "torch==2.13.0", wheel, timeout=900)

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    code = "import kvgraft_plugin; print(kvgraft_plugin.__file__)"
    where = run(bin_dir / "python", "-c", code, cwd=tmp_path, env=env)
    assert Path(where.stdout.strip()).is_relative_to(tmp_path / "venv")  # not the checkout's sources

    queries = tmp_path / "queries.jsonl"
    rows = [json.loads(line) for line in (ROOT / "examples" / "queries.jsonl").read_text().splitlines()[:2]]
    queries.write_text("".join(json.dumps(r) + "\n" for r in rows))
    demo = run(
        bin_dir / "kvgraft", "demo", "--library", tmp_path / "lib", "--queries", queries, "--max-tokens", 8,
        "--n-threads", 2, cwd=tmp_path, env=env, timeout=900,
    )  # fmt: skip
    assert "grafted 2/2 queries; graft text == text-rag text on 2/2" in demo.stdout, demo.stdout + demo.stderr
    assert len(json.loads((tmp_path / "lib" / "manifest.json").read_text())["entries"]) > 30  # the packaged source
