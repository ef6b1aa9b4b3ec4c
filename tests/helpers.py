"""Bitwise comparison that explains itself when it fails, a free localhost port, and `kvgraft serve` in a
subprocess for the server tests."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

#: The API key the test servers are started with.
KEY = "test-key-123"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(library: Path, model: Path, tmp_path: Path, *extra: str) -> tuple[subprocess.Popen[str], str]:
    """``kvgraft serve`` on a free port with `KEY`, once its ``/health`` answers: the process and its URL."""
    key_file = tmp_path / "api-key"
    key_file.write_text(KEY + "\n")
    port = free_port()
    args = [sys.executable, "-m", "kvgraft_plugin.cli", "serve", "--library", str(library), "--model", str(model),
            "--n-threads", "2", "--port", str(port), "--api-key-file", str(key_file), *extra]  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited: {proc.stdout.read() if proc.stdout else ''}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.3)
    proc.kill()
    raise AssertionError("server did not come up")


def logit_report(expected: np.ndarray, got: np.ndarray) -> str:
    """Max |diff| and KL(expected || got) of the softmax distributions."""
    diff = float(np.max(np.abs(expected.astype(np.float64) - got.astype(np.float64))))
    p = np.exp(expected - expected.max()).astype(np.float64)
    q = np.exp(got - got.max()).astype(np.float64)
    p, q = p / p.sum(), q / q.sum()
    kl = float(np.sum(p * (np.log(p + 1e-300) - np.log(q + 1e-300))))
    return f"max |diff| = {diff:.6g}, KL = {kl:.6g}, argmax {int(expected.argmax())} vs {int(got.argmax())}"


def assert_bitwise(expected: np.ndarray, got: np.ndarray, what: str) -> None:
    assert expected.shape == got.shape, f"{what}: shapes {expected.shape} vs {got.shape}"
    assert np.array_equal(expected, got), f"{what}: logits differ: {logit_report(expected, got)}"
