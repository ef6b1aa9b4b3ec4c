"""`kvgraft doctor` on both bundled models, and on a served setting known to be inexact."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kvgraft_plugin.cli import main

ROW_KEYS = {"check", "exact", "served", "max_abs_diff", "note"}


def doctor(*args):
    result = CliRunner().invoke(main, ["doctor", "--json", "--n-threads", "2", *map(str, args)])
    return result.exit_code, json.loads(result.stdout)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "args"),
    # thread counts are swept on both models in test_portability, and through the doctor in test_arch_matrix
    [("gemma_path", ["--threads", "", "--no-larger-ctx"]), ("smol_path", ["--threads", "", "--no-larger-ctx"])],
)
def test_doctor_passes_on_both_bundled_models(request, model, args):
    code, rows = doctor("--model", request.getfixturevalue(model), *args)
    assert code == 0, rows
    assert rows and all(set(r) == ROW_KEYS and r["exact"] and r["max_abs_diff"] == 0.0 for r in rows)
    checks = " ".join(r["check"] for r in rows)
    assert "one-token tail chunk" in checks and "past n_ubatch" in checks
    assert "n_threads=" not in checks and "lookup: batches of up to 16 tokens" in checks
    assert rows[-1]["check"] == "batched: 4 of 4 sequences together equal each alone"


@pytest.mark.slow
def test_doctor_fails_on_a_window_sized_swa_cache_past_the_window(gemma_path):
    code, rows = doctor("--model", gemma_path, "--no-swa-full", "--threads", "", "--no-larger-ctx")
    assert code == 1
    bad = [r for r in rows if not r["exact"]]
    assert [r["check"] for r in bad] == ["restore past the window (1997 tokens)"]
    assert bad[0]["served"] and bad[0]["max_abs_diff"] > 0
