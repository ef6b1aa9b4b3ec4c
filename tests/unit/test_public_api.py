import re
from pathlib import Path

import kvgraft_plugin


def test_all_is_what_the_python_api_page_documents():
    """`__all__` is pinned by the reference: a name added or dropped without its line there fails here."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "python-api.md").read_text()
    table = page[page.index("## Public names") :]
    rows = [line.split("|") for line in table.split("\n|---|---|\n", 1)[1].splitlines() if line.startswith("|")]
    documented = {name for row in rows for name in re.findall(r"`(\w+)`", row[1])}
    documented |= set(re.findall(r"`(\w+Error)`", rows[-1][2]))  # the error tree's row names them in words
    assert set(kvgraft_plugin.__all__) == documented
    for name in kvgraft_plugin.__all__:
        value = getattr(kvgraft_plugin, name)
        if callable(value):
            assert (value.__doc__ or "").strip(), f"{name} has no docstring"


def test_exception_tree():
    from kvgraft_plugin import (
        ConfigError,
        EntryNotFoundError,
        IncompatibleStateError,
        IntegrityError,
        KVGraftError,
        SourceError,
        StateError,
    )

    assert issubclass(ConfigError, ValueError) and issubclass(SourceError, ValueError)
    assert issubclass(EntryNotFoundError, KeyError)
    for exc in (IntegrityError, IncompatibleStateError):
        assert issubclass(exc, StateError) and issubclass(exc, KVGraftError)
    assert IntegrityError.reason == "integrity" and IncompatibleStateError.reason == "incompatible"
    assert str(EntryNotFoundError("no entry 'x'")) == "no entry 'x'"


def test_adapters_live_under_the_package():
    import importlib.util

    assert importlib.util.find_spec("kvgraft_plugin.adapters.llama_cpp") is not None
