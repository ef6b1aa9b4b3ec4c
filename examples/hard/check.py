"""Verify the reference solutions in library.jsonl and uncovered.jsonl.

For every JSON line in both files (next to this script), the program
``problem + "\\n" + solution + "\\n" + tests`` is run in a fresh
``python3 -I`` subprocess with a 10 second timeout. One PASS/FAIL line is
printed per task; the exit status is 1 if any task fails, else 0.

Usage: python3 examples/hard/check.py
"""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
FILES = ("library.jsonl", "uncovered.jsonl")
TIMEOUT_S = 10


def run_task(task):
    """Return (ok, detail) for one task dict."""
    src = task["problem"] + "\n" + task["solution"] + "\n" + task["tests"] + "\n"
    try:
        proc = subprocess.run(
            [sys.executable or "python3", "-I", "-c", src],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return False, f"timeout after {TIMEOUT_S}s"
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        return False, lines[-1] if lines else f"exit {proc.returncode}"
    return True, ""


def main():
    failed = total = 0
    for name in FILES:
        with open(os.path.join(HERE, name), encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                total += 1
                try:
                    task = json.loads(line)
                    ok, detail = run_task(task)
                    tid = task["id"]
                except (ValueError, KeyError) as exc:
                    ok, detail, tid = False, f"bad line: {exc}", f"{name}:{lineno}"
                failed += not ok
                print(f"{'PASS' if ok else 'FAIL'} {tid}" + (f"  ({detail})" if detail else ""))
    print(f"{total - failed}/{total} passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
