"""Bitwise comparison that explains itself when it fails, and a free localhost port for test servers."""

from __future__ import annotations

import socket

import numpy as np


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
