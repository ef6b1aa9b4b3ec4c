"""Only the adapters import llama.cpp: the core, its tools and the server reach it through the backend."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "kvgraft_plugin"


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at its top or inside a function."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_no_module_outside_the_adapters_imports_llama_cpp():
    importers = [
        str(path.relative_to(PACKAGE))
        for path in sorted(PACKAGE.rglob("*.py"))
        if any(name.split(".")[0] == "llama_cpp" for name in imported_modules(path))
    ]
    assert importers == []


def test_the_package_imports_without_the_native_library():
    import subprocess
    import sys

    code = (
        "import sys, kvgraft_plugin, kvgraft_plugin.cli\n"
        "print(sorted(m for m in ('llama_cpp', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_test_file_has_a_basename_of_its_own():
    # tests/unit and tests/integration are no packages: two files of one name are one module to pytest, and
    # `make test` stops at collection (as it did when both held a test_reliability.py)
    root = Path(__file__).resolve().parents[1]
    names = [p.name for p in root.rglob("test_*.py")]
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})
