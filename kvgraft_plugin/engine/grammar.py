"""Grammars for structured output (a `SamplingParams.grammar`): any JSON object, or a JSON Schema's documents.

llama-cpp-python converts them; it is imported by the llama.cpp adapter only, so this is the engine's way in.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kvgraft_plugin.core.exceptions import ConfigError

__all__ = ["json_grammar", "json_schema_grammar"]


def json_grammar() -> str:
    """GBNF for any JSON object (llama-cpp-python's ``JSON_GBNF``, its ``response_format`` json mode)."""
    from kvgraft_plugin.adapters.llama_cpp import grammar_for_json

    return grammar_for_json()


def json_schema_grammar(schema: Mapping[str, Any] | str) -> str:
    """GBNF that accepts exactly the JSON documents valid under ``schema`` (a dict or its JSON text),
    converted as llama-cpp-python does (``json_schema_to_gbnf``). Properties keep the schema's order."""
    from kvgraft_plugin.adapters.llama_cpp import grammar_for_json

    text = schema if isinstance(schema, str) else json.dumps(schema)
    try:
        return grammar_for_json(text)
    except (ValueError, KeyError, TypeError, NotImplementedError, json.JSONDecodeError) as exc:
        raise ConfigError(f"this JSON Schema cannot be turned into a grammar: {exc}") from exc
