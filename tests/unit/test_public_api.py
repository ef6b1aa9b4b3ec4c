import kvgraft_plugin


def test_all_is_pinned():
    assert sorted(kvgraft_plugin.__all__) == sorted(
        [
            "TEMPLATE_VERSION",
            "Alias",
            "BackendError",
            "BaseStateCache",
            "BuildReport",
            "ConfigError",
            "ContextOverflowError",
            "Embedder",
            "EngineClosedError",
            "EngineConfig",
            "Entry",
            "EntryNotFoundError",
            "EntryRecord",
            "GraftChunk",
            "GraftEngine",
            "GraftResult",
            "Hit",
            "IncompatibleStateError",
            "IndexMismatchError",
            "InexactStateError",
            "IntegrityError",
            "KVGraftError",
            "Library",
            "LibraryError",
            "LlamaConfig",
            "ModelError",
            "NoMatchError",
            "QueryError",
            "RamStateCache",
            "RequestCancelledError",
            "SamplingParams",
            "SignatureError",
            "SourceError",
            "StateError",
            "StorageError",
            "VectorIndex",
            "__version__",
            "build_library",
            "json_schema_grammar",
            "read_source",
        ]
    )
    for name in kvgraft_plugin.__all__:
        assert hasattr(kvgraft_plugin, name), name


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
