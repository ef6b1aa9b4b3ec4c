"""kvgraft: exact KV-cache grafting of verified solved problems into llama.cpp.

A library entry is stored as the KV cache of its prompt + solution. For a new query the engine finds
the closest entry, restores its cache bit for bit, prefills only the query and decodes. The output is
identical to text RAG with the same entry, at a fraction of the time to first token.
"""

from kvgraft_plugin.core.config import EngineConfig, LlamaConfig
from kvgraft_plugin.core.exceptions import (
    BackendError,
    ConfigError,
    ContextOverflowError,
    EngineClosedError,
    EntryNotFoundError,
    IncompatibleStateError,
    IndexMismatchError,
    InexactStateError,
    IntegrityError,
    KVGraftError,
    LibraryError,
    ModelError,
    NoMatchError,
    QueryError,
    RequestCancelledError,
    SignatureError,
    SourceError,
    StateError,
    StorageError,
)
from kvgraft_plugin.core.sampling import SamplingParams
from kvgraft_plugin.curation.build import BuildReport, build_library
from kvgraft_plugin.engine.engine import GraftChunk, GraftEngine, GraftResult
from kvgraft_plugin.engine.grammar import json_schema_grammar
from kvgraft_plugin.library.aliases import Alias
from kvgraft_plugin.library.index import Embedder, Hit, VectorIndex
from kvgraft_plugin.library.library import BaseStateCache, EntryRecord, Library, RamStateCache, read_source
from kvgraft_plugin.library.template import TEMPLATE_VERSION, Entry

__version__ = "0.1.0"

__all__ = [
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
    "ModelError",
    "LlamaConfig",
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
