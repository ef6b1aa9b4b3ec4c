"""Snapshot `kvgraft ask --json` on the example queries, timing fields removed, to compare two versions.

    python docs/ask_snapshot.py LIBRARY OUT.jsonl     # run it before and after a change, then `diff` the files

The library is built once (by the version under test's `kvgraft build`) into LIBRARY if it is missing.
Every answer's route, entry, score, reasons, text, token counts, finish reason, match trail and notes are
kept; wall-clock figures (``ttft_ms``, ``total_ms``, ``decode_ms``, ``phases_ms``) are dropped.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TIMINGS = ("ttft_ms", "total_ms", "decode_ms", "phases_ms")
RUNS = (("auto", "step"), ("auto", "lookup"), ("text-rag", "step"), ("graft", "step"), ("plain", "step"))


def main(library: str, out: str) -> None:
    """Write every run's answers to ``out``, building ``library`` first if it is missing."""
    kvgraft = str(Path(sys.executable).with_name("kvgraft"))
    if not (Path(library) / "manifest.json").is_file():
        subprocess.run([kvgraft, "build", str(EXAMPLES / "library.jsonl"), "--library", library], check=True)
    queries = EXAMPLES / "queries.jsonl"
    with open(out, "w") as f:
        for mode, decode in RUNS:
            args = ["ask", "--library", library, "--queries", str(queries), "--json", "--mode", mode]
            done = subprocess.run([kvgraft, *args, "--decode", decode], check=False, capture_output=True, text=True)
            for line in done.stdout.splitlines():
                answer = {k: v for k, v in json.loads(line).items() if k not in TIMINGS}
                f.write(json.dumps({"mode": mode, "decode": decode, **answer}, sort_keys=True) + "\n")
            if done.returncode:
                f.write(json.dumps({"mode": mode, "decode": decode, "exit": done.returncode}) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:3])
