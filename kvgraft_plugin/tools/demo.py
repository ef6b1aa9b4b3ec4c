"""``kvgraft demo``: build an example library once, then answer its queries three ways, side by side."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvgraft_plugin.core.config import EngineConfig
from kvgraft_plugin.curation.answer_checks import default_check, load_checker
from kvgraft_plugin.curation.build import build_library
from kvgraft_plugin.engine.engine import GraftEngine, GraftResult
from kvgraft_plugin.library.library import Library, read_queries, read_source
from kvgraft_plugin.library.template import auto_format

__all__ = ["run_demo"]

MODES = ("auto", "text-rag", "plain")


def run_demo(
    library: str | Path,
    source: str | Path,
    queries: str | Path,
    *,
    config: EngineConfig,
    echo: Callable[[str], Any],
    checker: str | None = None,
    run_tests: bool = True,
) -> dict[str, list[GraftResult]]:
    """Build ``library`` from ``source`` if needed (format ``auto``), answer ``queries`` in every mode, print
    tables. ``checker`` as for ``kvgraft bench`` (``"tests"`` runs code against its tests). ``run_tests``
    verifies the entries by their tests at build (contained; on by default: the demo's sources are the
    bundled examples or one the user names)."""
    from tqdm import tqdm

    entries = read_source(source)
    rows = read_queries(queries)
    config = config.replace(answer_format=auto_format(entries))
    with GraftEngine(None, config=config) as builder, tqdm(total=len(entries), desc="library", unit="entry") as bar:
        report = build_library(library, entries, engine=builder, progress=bar.update, run_tests=run_tests)
    tests = f"tests run for {len(report.tested)}" if run_tests else f"tests not run for {len(report.untested)}"
    echo(
        f"library {library}: {len(report.built)} built, {len(report.skipped)} reused, {len(report.inexact)} inexact, "
        f"{tests} entries\n"
    )

    results: dict[str, list[GraftResult]] = {}
    lib = Library.open(library)
    check = load_checker(checker, lib) if checker else None

    def correct(row: dict[str, Any], text: str) -> bool:
        if check is not None:
            return check(row, text)
        return bool(row.get("answer")) and default_check(row, text)

    with GraftEngine(lib, config=config) as engine:
        for mode in MODES:
            results[mode] = [engine.ask(row["question"], mode=mode) for row in tqdm(rows, desc=mode, unit="query")]

    echo(f"{'query':<44} {'route':<8} {'entry':<22} {'score':>5}  {'answer':<14} {'dec':>3} {'ttft ms':>7}")
    for row, r in zip(rows, results["auto"]):
        score = f"{r.score:.2f}" if r.score is not None else "-"
        mark = "✓" if correct(row, r.text) else " "
        question, text = " ".join(row["question"].split()), " ".join(r.text.split())  # code on one table line
        echo(
            f"{question[:44]:<44} {r.route:<8} {(r.entry_id or '-')[:22]:<22} {score:>5}  "
            f"{mark}{text[:13]:<13} {r.decode_tokens:>3} {r.ttft_ms:>7.0f}"
        )

    echo(
        f"\n{'mode':<9} {'correct':>8} {'prefill tok':>11} {'restored tok':>12} {'decode tok':>10} {'median ttft ms':>14}"
    )
    for mode in MODES:
        rs = results[mode]
        right = sum(1 for row, r in zip(rows, rs) if correct(row, r.text))
        echo(
            f"{mode:<9} {right:>4}/{len(rs):<3} {sum(r.prefill_tokens for r in rs):>11} "
            f"{sum(r.restored_tokens for r in rs):>12} {sum(r.decode_tokens for r in rs):>10} "
            f"{statistics.median(r.ttft_ms for r in rs):>14.0f}"
        )
    same = sum(1 for a, t in zip(results["auto"], results["text-rag"]) if a.route == "graft" and a.text == t.text)
    grafted = sum(1 for a in results["auto"] if a.route == "graft")
    echo(f"\ngrafted {grafted}/{len(rows)} queries; graft text == text-rag text on {same}/{grafted}")
    return results
