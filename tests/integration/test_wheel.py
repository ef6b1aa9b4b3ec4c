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
SHORT = {"mul-17x23", "sum-1-to-100", "gcd-84-126"}  # what the first two example queries ask, and one more


@pytest.mark.slow
def test_installed_wheel_runs_the_demo_outside_the_checkout(tmp_path):
    def run(*args, **kwargs):
        return subprocess.run([str(a) for a in args], check=True, capture_output=True, text=True, **kwargs)

    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", ROOT, "-w", tmp_path / "dist")
    (wheel,) = (tmp_path / "dist").glob("kvgraft_plugin-*.whl")
    venv.create(tmp_path / "venv", with_pip=True)
    bin_dir = tmp_path / "venv" / "bin"
    # the CPU torch on this disk first (any other pulls GBs of CUDA); llama-cpp-python from the wheel `make setup`
    # built (KVGRAFT_WHEELS), else pip builds it from its sdist again (~9 min on 2 cores)
    built = ["--find-links", os.environ["KVGRAFT_WHEELS"]] if os.environ.get("KVGRAFT_WHEELS") else []
    run(bin_dir / "pip", "install", "-q", *built, "torch==2.13.0", wheel, timeout=900)

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    code = "import kvgraft_plugin.cli as c; print(c.__file__); print(c.examples_dir())"
    module, examples = run(bin_dir / "python", "-c", code, cwd=tmp_path, env=env).stdout.split()
    assert Path(module).is_relative_to(tmp_path / "venv")  # not the checkout's sources
    assert Path(examples).is_relative_to(tmp_path / "venv")  # the example libraries are package data
    for name in ("library.jsonl", "queries.jsonl", "code/library.jsonl", "code/queries.jsonl"):
        assert (Path(examples) / name).read_bytes() == (ROOT / "examples" / name).read_bytes()

    # a short demo: the packaged queries against three of the packaged entries
    source = tmp_path / "source.jsonl"
    lines = (ROOT / "examples" / "library.jsonl").read_text().splitlines()
    source.write_text("".join(line + "\n" for line in lines if json.loads(line)["id"] in SHORT))
    queries = tmp_path / "queries.jsonl"
    rows = [json.loads(line) for line in (Path(examples) / "queries.jsonl").read_text().splitlines()[:2]]
    queries.write_text("".join(json.dumps(r) + "\n" for r in rows))
    demo = run(
        bin_dir / "kvgraft", "demo", "--library", tmp_path / "lib", "--source", source, "--queries", queries,
        "--max-tokens", 8, "--n-threads", 2, cwd=tmp_path, env=env, timeout=900,
    )  # fmt: skip
    assert "grafted 2/2 queries; graft text == text-rag text on 2/2" in demo.stdout, demo.stdout + demo.stderr
