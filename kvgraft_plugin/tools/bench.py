"""``kvgraft bench``: every query in every mode, with accuracy, identity, retrieval and token counts.

Modes: ``plain`` never uses the library; ``text-rag`` routes and pastes the matched entry's text;
``graft`` is the full ``auto`` chain (route, graft, fall back to text RAG or plain with a reason).
With several decoders (``step``, ``lookup``) every mode runs under each, one after the other on each
query, and the runs are labelled ``mode/decoder``; the summary then compares their texts and speeds.
"""

from __future__ import annotations

import json
import platform
import statistics
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from kvgraft_plugin.curation.answer_checks import (
    Checker,
    answers_match,
    default_check,
    extract_answer,
    final_number,
    same_value,
)
from kvgraft_plugin.engine.engine import GraftEngine, GraftResult

__all__ = ["ALL_MODES", "MODES", "run_bench"]

#: What ``kvgraft bench`` runs by default.
MODES = ("plain", "text-rag", "graft")
#: Each bench mode as the engine's (mode, cue): ``related`` restores the nearest entry and asks the question as
#: a new problem after it; ``related-text-rag`` is its text RAG twin, the same prompt prefilled.
_ENGINE_MODE = {
    "plain": ("plain", None), "text-rag": ("text-rag", None), "graft": ("auto", None),
    "related": ("related", None), "related-text-rag": ("text-rag", "related"),
}  # fmt: skip
ALL_MODES = tuple(_ENGINE_MODE)


def run_bench(
    engine: GraftEngine,
    queries: list[dict[str, Any]],
    out: Path,
    *,
    modes: Iterable[str] = MODES,
    max_tokens: int | None = None,
    checker: Checker | None = None,
    progress: Callable[[int], Any] | None = None,
    decoders: Iterable[str] = ("step",),
) -> dict[str, Any]:
    """Run the bench, write ``results.jsonl``, ``summary.json``, ``summary.md`` and plots to ``out``.

    ``checker`` replaces the default answer check; without one, rows with no ``answer`` get
    ``correct: null``. Each row carries its ``mode``, the ``decode`` used and its ``run`` label.
    """
    modes, decoders = list(modes), list(decoders)
    runs = {(m, d): m if len(decoders) == 1 else f"{m}/{d}" for m in modes for d in decoders}
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    by_run: dict[str, dict[str, GraftResult]] = {label: {} for label in runs.values()}
    for mode in modes:
        for query in queries:
            for decode in decoders:  # alternating on each query: the decoders' timings see the same machine
                engine_mode, cue = _ENGINE_MODE[mode]
                result = engine.ask(
                    query["question"],
                    mode=engine_mode,
                    cue=cue,
                    max_tokens=max_tokens,
                    decode=decode,  # type: ignore[arg-type]
                )
                label = runs[mode, decode]
                by_run[label][query["id"]] = result
                rows.append({**_row(query, mode, result, checker), "run": label})
                if progress is not None:
                    progress(1)
    with (out / "results.jsonl").open("w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")

    summary = _summary(engine, queries, rows, by_run, runs, max_tokens)
    summary["plots"] = _plots(rows, list(runs.values()), out)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / "summary.md").write_text(render_markdown(summary))
    return summary


def _row(query: Mapping[str, Any], mode: str, result: GraftResult, checker: Checker | None) -> dict[str, Any]:
    correct: bool | None = None
    if checker is not None:
        correct = bool(checker(query, result.text))
    elif result.cue == "related" and query.get("value") is not None:  # a worked solution: its final number
        correct = same_value(final_number(result.text), float(query["value"]))
    elif query.get("answer") is not None:
        correct = default_check(query, result.text)
    data = result.to_json()
    return {
        "id": query["id"],
        "mode": mode,
        "route": result.route,
        "entry_id": result.entry_id,
        "score": result.score,
        "fallback_reason": result.fallback_reason,
        "text": result.text,
        "answer_extracted": extract_answer(result.text),
        "correct": correct,
        **{
            k: data[k]
            for k in (
                "prefill_tokens",
                "restored_tokens",
                "decode_tokens",
                "ttft_ms",
                "total_ms",
                "decode",
                "decode_ms",
                "drafted_tokens",
                "accepted_tokens",
            )
        },
        "prefix_tokens": result.prefill_tokens + result.restored_tokens,
    }


def _summary(
    engine: GraftEngine,
    queries: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    by_run: dict[str, dict[str, GraftResult]],
    runs: Mapping[tuple[str, str], str],
    max_tokens: int | None,
) -> dict[str, Any]:
    per_mode: dict[str, Any] = {}
    for label in runs.values():
        mode_rows = [r for r in rows if r["run"] == label]
        checked = [r for r in mode_rows if r["correct"] is not None]
        decode_s = sum(r["decode_ms"] for r in mode_rows) / 1000
        drafted = sum(r["drafted_tokens"] for r in mode_rows)
        per_mode[label] = {
            "n": len(mode_rows),
            "checked": len(checked),
            "correct": sum(1 for r in checked if r["correct"]),
            "accuracy": (sum(1 for r in checked if r["correct"]) / len(checked)) if checked else None,
            "ttft_ms_median": statistics.median(r["ttft_ms"] for r in mode_rows),
            "ttft_ms_mean": statistics.fmean(r["ttft_ms"] for r in mode_rows),
            "total_ms_median": statistics.median(r["total_ms"] for r in mode_rows),
            "prefill_tokens": sum(r["prefill_tokens"] for r in mode_rows),
            "restored_tokens": sum(r["restored_tokens"] for r in mode_rows),
            "decode_tokens": sum(r["decode_tokens"] for r in mode_rows),
            "decode_tokens_per_s": sum(r["decode_tokens"] for r in mode_rows) / decode_s if decode_s else None,
            "drafted_tokens": drafted,
            "acceptance": sum(r["accepted_tokens"] for r in mode_rows) / drafted if drafted else None,
            "routes": {
                k: sum(1 for r in mode_rows if r["route"] == k) for k in ("graft", "related", "text-rag", "plain")
            },
        }

    identical = n_grafted = 0
    for (mode, decode), label in runs.items():
        if mode != "graft":
            continue
        rag = by_run.get(runs.get(("text-rag", decode), ""))
        for qid, result in by_run[label].items():
            if result.route == "graft":
                n_grafted += 1
                identical += rag is not None and result.text == rag[qid].text

    first = {mode: runs[mode, decode] for mode, decode in reversed(list(runs))}  # each mode's first decoder
    labelled = [q for q in queries if "expect_entry" in q]
    graft_results = by_run.get(first.get("graft", ""), {})
    hits = sum(1 for q in labelled if q["id"] in graft_results and graft_results[q["id"]].entry_id == q["expect_entry"])
    for label in runs.values():
        per_mode[label].update(routing_errors(engine, queries, by_run[label]))
    if "graft" in first:
        per_mode[first["graft"]]["by_kind"] = by_kind(
            engine, queries, graft_results, {r["id"]: r for r in rows if r["run"] == first["graft"]}
        )

    covered = [q["id"] for q in queries if q.get("expect_entry")]
    tokens: dict[str, Any] = {"plain_max_tokens": max_tokens or engine.config.max_tokens, "covered": len(covered)}
    if covered and "plain" in first and "graft" in first:
        plain_dec = sum(by_run[first["plain"]][i].decode_tokens for i in covered)
        graft_dec = sum(by_run[first["graft"]][i].decode_tokens for i in covered)
        tokens.update(plain_decode=plain_dec, graft_decode=graft_dec, reduction=plain_dec / max(graft_dec, 1))

    return {
        "modes": per_mode,
        "identical_rate": identical / n_grafted if n_grafted else None,
        "identical": identical,
        "n_grafted": n_grafted,
        "retrieval": {
            "labelled": len(labelled),
            "hits": hits,
            "wrong_grafts": per_mode.get("graft", {}).get("wrong_grafts", 0),
            "false_copies": per_mode.get("graft", {}).get("false_copies", 0),
        },
        "decode_tokens_on_covered": tokens,
        "decoders": _decoder_comparison(by_run, runs, covered),
        "machine": " ".join(x for x in (platform.machine(), _cpu_name()) if x)
        + f", {engine.config.llama.n_threads} threads",
        "config": {
            "model": engine.model_path.name,
            "library": engine.library.location if engine.library else None,
            "threshold": engine.routing.threshold(engine.config),
            "margin": engine.routing.margin(engine.config),
            "neighbors": engine.config.neighbors,
            "max_tokens": max_tokens or engine.config.max_tokens,
            **{k: v for k, v in engine.fingerprint.items() if k not in ("system_info", "gguf_sha256")},
        },
    }


def _decoder_comparison(
    by_run: Mapping[str, Mapping[str, GraftResult]], runs: Mapping[tuple[str, str], str], covered: list[str]
) -> dict[str, Any]:
    """Per mode run under both ``step`` and ``lookup``: how often lookup's text is step's, and the ratios of
    decode speed and end-to-end time (medians), over all queries and over the covered ones."""
    out: dict[str, Any] = {}
    for mode in dict.fromkeys(m for m, _ in runs):
        if (mode, "step") not in runs or (mode, "lookup") not in runs:
            continue
        step, lookup = by_run[runs[mode, "step"]], by_run[runs[mode, "lookup"]]
        row: dict[str, Any] = {
            "same_text": sum(step[q].text == lookup[q].text for q in step),
            "n": len(step),
        }
        for name, ids in (("all", list(step)), ("covered", [q for q in covered if q in step])):
            if ids:
                row[name] = {
                    "decode_speedup": statistics.median(_rate(lookup[q]) / _rate(step[q]) for q in ids),
                    "total_ms_step": statistics.median(step[q].total_ms for q in ids),
                    "total_ms_lookup": statistics.median(lookup[q].total_ms for q in ids),
                    "total_ratio": statistics.median(lookup[q].total_ms / step[q].total_ms for q in ids),
                }
        out[mode] = row
    return out


def _rate(result: GraftResult) -> float:
    """Decode tokens per second of one answer."""
    return result.decode_tokens / max(result.decode_ms, 1e-3) * 1000


def _expected(query: Mapping[str, Any]) -> str | None:
    """The entry a query should use: ``expect_entry``; a near-miss or uncovered query expects none."""
    return query.get("expect_entry")


def _used_entry(result: GraftResult) -> str | None:
    return result.entry_id if result.route in ("graft", "text-rag") else None


def is_wrong_graft(query: Mapping[str, Any], result: GraftResult) -> bool:
    """The answer was built on an entry the query does not ask about (any route that used one)."""
    used = _used_entry(result)
    return used is not None and "expect_entry" in query and used != _expected(query)


def is_false_copy(engine: GraftEngine, query: Mapping[str, Any], result: GraftResult) -> bool:
    """The answer is the used entry's verified answer, while the right answer differs: a confident copy."""
    used = _used_entry(result)
    if used is None or engine.library is None or query.get("answer") is None:
        return False
    entry_answer = engine.library.get(used).entry.answer
    if entry_answer is None or answers_match(str(query["answer"]), entry_answer):
        return False
    return answers_match(extract_answer(result.text), entry_answer)


def routing_errors(
    engine: GraftEngine, queries: list[dict[str, Any]], results: Mapping[str, GraftResult]
) -> dict[str, int]:
    """``wrong_grafts`` and ``false_copies`` of one mode (see `is_wrong_graft`, `is_false_copy`)."""
    return {
        "wrong_grafts": sum(is_wrong_graft(q, results[q["id"]]) for q in queries),
        "false_copies": sum(is_false_copy(engine, q, results[q["id"]]) for q in queries),
    }


def by_kind(
    engine: GraftEngine,
    queries: list[dict[str, Any]],
    results: Mapping[str, GraftResult],
    rows: Mapping[str, Mapping[str, Any]],
) -> dict[str, dict[str, int]]:
    """Per query ``kind`` (``paraphrase/verbs``, ``near-miss/asked``...): routed right, grafted, wrong, correct."""
    table: dict[str, dict[str, int]] = {}
    for q in queries:
        result = results[q["id"]]
        kind = str(
            q.get("kind")
            or ("near-miss" if q.get("near_miss_of") else "covered" if q.get("expect_entry") else "uncovered")
        )
        t = table.setdefault(
            kind, {"n": 0, "routed_right": 0, "grafted": 0, "wrong_grafts": 0, "false_copies": 0, "correct": 0}
        )
        t["n"] += 1
        t["routed_right"] += _used_entry(result) == _expected(q) or (result.route == "plain" and _expected(q) is None)
        t["grafted"] += result.route == "graft"
        t["wrong_grafts"] += is_wrong_graft(q, result)
        t["false_copies"] += is_false_copy(engine, q, result)
        t["correct"] += bool(rows[q["id"]]["correct"])
    return dict(sorted(table.items()))


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def render_markdown(summary: Mapping[str, Any]) -> str:
    """``summary.md``: the per-mode table with ratios against plain and text RAG."""
    modes = summary["modes"]
    lines = [
        "| run | correct | accuracy | median TTFT ms | TTFT vs plain | TTFT vs text-rag | median total ms "
        "| prefill tok | restored tok | decode tok | decode tok/s | acceptance | routes (graft/text-rag/plain) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    base = next((m["ttft_ms_median"] for label, m in modes.items() if label.split("/")[0] == "plain"), None)
    rag = next((m["ttft_ms_median"] for label, m in modes.items() if label.split("/")[0] == "text-rag"), None)
    for mode, m in modes.items():
        acc = f"{m['accuracy']:.1%}" if m["accuracy"] is not None else "-"
        vs_plain = f"{m['ttft_ms_median'] / base:.2f}x" if base else "-"
        vs_rag = f"{m['ttft_ms_median'] / rag:.2f}x" if rag else "-"
        routes = "/".join(str(m["routes"][k]) for k in ("graft", "text-rag", "plain"))
        rate = f"{m['decode_tokens_per_s']:.1f}" if m["decode_tokens_per_s"] else "-"
        accepted = f"{m['acceptance']:.0%}" if m["acceptance"] is not None else "-"
        lines.append(
            f"| {mode} | {m['correct']}/{m['checked']} | {acc} | {m['ttft_ms_median']:.0f} | {vs_plain} | {vs_rag} "
            f"| {m['total_ms_median']:.0f} | {m['prefill_tokens']} | {m['restored_tokens']} | {m['decode_tokens']} "
            f"| {rate} | {accepted} | {routes} |"
        )
    for mode, d in summary.get("decoders", {}).items():
        lines.append(f"\n- {mode}: lookup text equals step text on {d['same_text']}/{d['n']} queries")
        for name in ("all", "covered"):
            if name in d:
                c = d[name]
                lines[-1] += (
                    f"; {name}: decode {c['decode_speedup']:.2f}x step's tokens/s, end to end "
                    f"{c['total_ms_lookup']:.0f} vs {c['total_ms_step']:.0f} ms ({c['total_ratio']:.2f}x, medians)"
                )
    ret = summary["retrieval"]
    tok = summary["decode_tokens_on_covered"]
    rate = summary["identical_rate"]
    lines += [
        "",
        f"- Graft text identical to text-RAG text: {summary['identical']}/{summary['n_grafted']}"
        + (f" ({rate:.0%})" if rate is not None else ""),
        f"- Retrieval: {ret['hits']}/{ret['labelled']} labelled queries routed as expected; "
        f"wrong grafts: {ret['wrong_grafts']}; false copies: {ret['false_copies']}",
    ]
    kinds = next((m["by_kind"] for m in modes.values() if "by_kind" in m), None)
    if kinds:
        lines += [
            "",
            "| kind (graft mode) | n | routed right | grafted | wrong grafts | false copies | correct |",
            "|---|---|---|---|---|---|---|",
        ]
        for kind, t in kinds.items():
            lines.append(
                f"| {kind} | {t['n']} | {t['routed_right']} | {t['grafted']} | {t['wrong_grafts']} "
                f"| {t['false_copies']} | {t['correct']} |"
            )
        lines.append("")
    if "reduction" in tok:
        lines.append(
            f"- Decode tokens on the {tok['covered']} covered queries: plain {tok['plain_decode']}, graft "
            f"{tok['graft_decode']} ({tok['reduction']:.1f}x fewer; plain capped at {tok['plain_max_tokens']} tokens)"
        )
    lines += [f"- Machine: {summary['machine']}. Figures vary with the machine.", ""]
    return "\n".join(lines)


def _plots(rows: list[dict[str, Any]], runs: list[str], out: Path) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - matplotlib is in the bench extra
        return []
    palette = {"plain": "#999999", "text-rag": "#d9822b", "graft": "#2b7bd9"}
    colours = [palette.get(run.split("/")[0], "#555555") for run in runs]
    files = []

    def bars(name: str, values: list[float], ylabel: str, title: str) -> None:
        fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(runs)), 3.2))
        ax.bar(runs, values, color=colours)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.tick_params(axis="x", labelsize=8)
        fig.tight_layout()
        fig.savefig(out / name, dpi=120)
        files.append(name)
        plt.close(fig)

    bars(
        "ttft_per_mode.png", [statistics.median(r["ttft_ms"] for r in rows if r["run"] == m) for m in runs],
        "median TTFT (ms)", "Time to first token per mode",
    )  # fmt: skip
    bars(
        "latency_per_mode.png", [statistics.median(r["total_ms"] for r in rows if r["run"] == m) for m in runs],
        "median end-to-end latency (ms)", "End-to-end latency per mode",
    )  # fmt: skip

    fig, ax = plt.subplots(figsize=(5, 3.2))
    for mode, colour in (("text-rag", "#d9822b"), ("graft", "#2b7bd9")):
        pts = [(r["prefix_tokens"], r["ttft_ms"]) for r in rows if r["mode"] == mode and r["entry_id"]]
        if pts:
            xs, ys = zip(*pts)
            ax.scatter(xs, ys, label=mode, color=colour, s=14)
    ax.set_xlabel("prompt tokens (restored + prefilled)")
    ax.set_ylabel("TTFT (ms)")
    ax.set_title("TTFT against prefix length")
    if ax.get_legend_handles_labels()[0]:  # no entry was used in a run of plain only
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "ttft_vs_prefix.png", dpi=120)
    files.append("ttft_vs_prefix.png")
    plt.close(fig)

    bars(
        "decode_tokens_per_mode.png", [sum(r["decode_tokens"] for r in rows if r["run"] == m) for m in runs],
        "decode tokens (all queries)", "Decode tokens per mode",
    )  # fmt: skip
    return files
