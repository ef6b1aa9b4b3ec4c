"""The kvgraft exception tree.

KVGraftError
├── ConfigError (ValueError)          bad settings or bad user input
│   ├── QueryError                    empty, non-UTF-8 or over-long query
│   └── ModelError                    an unknown or absent model, or a pull that failed its checks
├── SourceError (ValueError)          malformed library source (JSONL)
├── LibraryError                      a library folder that cannot be used
│   ├── EntryNotFoundError (KeyError) no entry with that id
│   ├── IndexMismatchError            the faiss index does not fit the embedder or manifest
│   ├── SignatureError                the library is unsigned or badly signed
│   └── StorageError (OSError)        a library URL's storage failed (network, endpoint, credentials)
├── StateError                        a saved KV state that must not be restored
│   ├── IntegrityError                bytes or structure do not match what was written
│   ├── IncompatibleStateError        built under another fingerprint
│   └── InexactStateError             the state failed its bitwise fidelity check
├── NoMatchError                      no library entry matched (``fallback="raise"``)
├── ContextOverflowError              prompt does not fit ``n_ctx``
├── EngineClosedError                 a call on a closed engine
├── RequestCancelledError             a request cancelled before it started (never routed or prefilled)
└── BackendError                      llama.cpp refused a call
"""

from __future__ import annotations

__all__ = [
    "BackendError",
    "ConfigError",
    "ContextOverflowError",
    "EngineClosedError",
    "EntryNotFoundError",
    "IncompatibleStateError",
    "IndexMismatchError",
    "InexactStateError",
    "IntegrityError",
    "KVGraftError",
    "LibraryError",
    "ModelError",
    "NoMatchError",
    "QueryError",
    "RequestCancelledError",
    "SignatureError",
    "SourceError",
    "StateError",
    "StorageError",
]


class KVGraftError(Exception):
    """Root of every error raised by kvgraft."""


class ConfigError(KVGraftError, ValueError):
    """Invalid settings or user input."""


class QueryError(ConfigError):
    """A query that cannot be answered: empty, not UTF-8, or too long for the context."""


class ModelError(ConfigError):
    """A model name that is unknown or not pulled yet, or a pull that failed (pip, size or sha256)."""


class SourceError(KVGraftError, ValueError):
    """A malformed library source file. The message names the line."""


class LibraryError(KVGraftError):
    """A library folder that cannot be used as it is."""


class EntryNotFoundError(LibraryError, KeyError):
    """No entry with the requested id."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable.
        return str(self.args[0]) if self.args else ""


class IndexMismatchError(LibraryError):
    """The persisted index was built by another embedder or for other entries."""


class SignatureError(LibraryError):
    """A key is configured and the library's signature is missing or wrong."""


class StateError(KVGraftError):
    """A saved KV state that must not be handed to llama.cpp.

    ``reason`` is the short fallback code reported in results.
    """

    reason = "integrity"


class IntegrityError(StateError):
    """The state's bytes, header or structure do not match what was written."""

    reason = "integrity"


class IncompatibleStateError(StateError):
    """The state was built under another compatibility fingerprint."""

    reason = "incompatible"


class InexactStateError(StateError):
    """The state failed its bitwise fidelity check when it was built."""

    reason = "inexact"


class NoMatchError(KVGraftError, LookupError):
    """No library entry matched the query well enough."""


class ContextOverflowError(QueryError):
    """The prompt does not fit in ``n_ctx``."""


class BackendError(KVGraftError, RuntimeError):
    """llama.cpp returned an error."""


class EngineClosedError(KVGraftError):
    """A call on a `GraftEngine` after `close`."""


class RequestCancelledError(KVGraftError):
    """A request whose ``cancel`` was set before the engine started it (its client left while it waited): it
    was never routed or prefilled, serially or in a batch."""


class StorageError(LibraryError, OSError):
    """Reading or writing a library URL failed: the endpoint is unreachable, the credentials are refused, or
    the storage backend raised. The message is one line naming the object; the backend's error is its cause.

    An `OSError` too, so that a state that cannot be fetched falls back like one that cannot be read."""
