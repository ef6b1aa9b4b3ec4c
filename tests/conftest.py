"""Shared fixtures. Models load once per session: loading costs seconds."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
THREADS = 2


@pytest.fixture(scope="session")
def gemma_path():
    from kvgraft_plugin.core.models import bundled_model_path

    return bundled_model_path("gemma3-270m")


@pytest.fixture(scope="session")
def smol_path():
    from kvgraft_plugin.core.models import bundled_model_path

    return bundled_model_path("smollm2-135m")


@pytest.fixture(scope="session")
def gemma(gemma_path):
    from kvgraft_plugin import GraftEngine

    with GraftEngine(None, model_path=str(gemma_path), n_threads=THREADS) as engine:
        yield engine


@pytest.fixture(scope="session")
def smol(smol_path):
    from kvgraft_plugin import GraftEngine

    with GraftEngine(None, model_path=str(smol_path), n_threads=THREADS) as engine:
        yield engine


@pytest.fixture(scope="session")
def example_entries():
    from kvgraft_plugin import read_source

    return read_source(EXAMPLES / "library.jsonl")


@pytest.fixture(scope="session")
def example_queries():
    return [json.loads(line) for line in (EXAMPLES / "queries.jsonl").read_text().splitlines() if line.strip()]


@pytest.fixture(scope="session")
def small_library(tmp_path_factory, gemma, example_entries):
    """A Gemma library of a few example entries, one of them past the 512-token window."""
    from kvgraft_plugin.curation.build import build_library

    wanted = {"mul-17x23", "gcd-84-126", "apples-train", "py-int-div", "collatz-27", "hex-ff", "linear-eq"}
    path = tmp_path_factory.mktemp("lib") / "library"
    build_library(path, [e for e in example_entries if e.id in wanted], engine=gemma)
    return path
