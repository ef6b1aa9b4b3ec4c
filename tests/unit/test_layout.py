"""The package's layout holds: layers import downward only, the source map names every module, no two module
names differ by one letter, and importing the package changes nothing outside it."""

from __future__ import annotations

import ast
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Bottom to top, as docs/README.md lists them. A module may import its own layer and those below it.
LAYERS = (
    "core",
    "library",
    "adapters.llama_state",
    "adapters.llama_cpp",
    "routing",
    "engine",
    "curation",
    "tools",
    "serve",
    "adapters.langchain",
    "cli",
    "__init__",
)


def modules() -> dict[str, Path]:
    """Every module, by its dotted name under ``kvgraft_plugin`` (``engine.engine``, ``adapters.llama_cpp``)."""
    found = {}
    for folder, prefix in ((ROOT / "kvgraft_plugin", ""), (ROOT / "adapters", "adapters.")):
        for path in sorted(folder.rglob("*.py")):
            name = prefix + ".".join(path.relative_to(folder).with_suffix("").parts)
            found[name] = path
    return found


def layer(module: str) -> int:
    """The index in `LAYERS` of the longest layer name that ``module`` starts with."""
    module = module.removesuffix(".__init__") if module != "__init__" else module
    matches = [i for i, name in enumerate(LAYERS) if module == name or module.startswith(name + ".")]
    assert matches, f"{module} is in no layer: add it to LAYERS and docs/README.md"
    return max(matches, key=lambda i: len(LAYERS[i]))


def imports(module: str, path: Path) -> set[str]:
    """The package modules ``path`` imports, at the top or inside a function (a lazy import is an arrow too)."""
    package = module.rsplit(".", 1)[0] if "." in module else ""
    if path.name == "__init__.py":
        package = module.removesuffix(".__init__")
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            elif node.module and node.module.startswith("kvgraft_plugin"):
                target = node.module.removeprefix("kvgraft_plugin").lstrip(".")
            else:
                continue
            out.add(target or "__init__")
        elif isinstance(node, ast.Import):
            out |= {a.name.removeprefix("kvgraft_plugin.") for a in node.names if a.name.startswith("kvgraft_plugin.")}
    return out


def test_every_import_runs_down_the_layers():
    upward = []
    for module, path in modules().items():
        for target in imports(module, path):
            if target == "adapters" or target.startswith("examples"):
                continue
            if layer(target) > layer(module):
                upward.append(f"{module} ({LAYERS[layer(module)]}) imports {target} ({LAYERS[layer(target)]})")
    assert not upward, "\n".join(upward)


def test_the_source_map_names_every_module():
    readme = (ROOT / "docs" / "README.md").read_text()
    source_map = readme[readme.index("## Source layout") :]
    missing = []
    for module, path in modules().items():
        if path.name == "__init__.py" and module != "__init__":
            continue  # a subpackage's face: its folder is the map's heading
        folder = path.parent.relative_to(ROOT).as_posix()
        heading = f"{folder}/" if folder != "kvgraft_plugin" else ""
        if heading and heading not in source_map:
            missing.append(heading)
        elif path.name not in source_map:
            missing.append(f"{folder}/{path.name}")
    assert not missing, f"docs/README.md's source map leaves out {missing}"


def test_no_two_module_names_differ_by_one_letter():
    def distance(a: str, b: str) -> int:
        row = list(range(len(b) + 1))
        for i, x in enumerate(a, 1):
            prev, row[0] = row[0], i
            for j, y in enumerate(b, 1):
                prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
        return row[-1]

    stems = sorted({path.stem for path in modules().values() if path.stem != "__init__"})
    close = [(a, b) for a, b in itertools.combinations(stems, 2) if distance(a, b) <= 1]
    assert not close, close


def test_importing_the_package_changes_no_environment_variable():
    """The exact kernels' setting (``GGML_CPU_TILED_MM``) is applied when a model is opened, never at import. The
    llama.cpp adapter is imported too where llama-cpp-python is installed (the full tier, not the fast one)."""
    names = ["kvgraft_plugin", "kvgraft_plugin.cli", "kvgraft_plugin.engine.engine", "kvgraft_plugin.serve.app"]
    if os.environ.get("KVGRAFT_FAST_TIER") != "1":
        names.append("kvgraft_plugin.adapters.llama_cpp")
    code = (
        "import importlib, json, os, sys; before = dict(os.environ)\n"
        "for name in sys.argv[1:]: importlib.import_module(name)\n"
        "print(json.dumps({k: v for k, v in os.environ.items() if before.get(k) != v}))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("GGML_")}
    changed = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True, env=env, check=True)
    assert json.loads(changed.stdout) == {}


def test_the_engine_class_reads_as_the_data_path_in_at_most_300_lines():
    tree = ast.parse((ROOT / "kvgraft_plugin" / "engine" / "engine.py").read_text())
    (engine,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "GraftEngine"]
    assert engine.end_lineno is not None and engine.end_lineno - engine.lineno + 1 <= 300
