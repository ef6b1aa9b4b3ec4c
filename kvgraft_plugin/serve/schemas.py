"""OpenAI request bodies as ``kvgraft serve`` accepts them, and its response pieces.

A field OpenAI defines but kvgraft cannot honour is refused with a 400 when it asks for something other
than the default (``n=2``, ``logprobs=true``, tools), never silently dropped. Sampling follows OpenAI's
fields (``temperature``, ``top_p``, the penalties, ``seed``, ``response_format`` with ``json_object`` or
``json_schema``) plus llama.cpp server's ``top_k``, ``min_p`` and ``repeat_penalty``.

Numbers are typed as in OpenAI's API: an integer field takes a JSON integer only (not ``true``, ``"4"`` or
``4.0``), a number field an integer or a float (not a boolean, a string, ``NaN`` or ``Infinity``).
"""

from __future__ import annotations

import reprlib
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from kvgraft_plugin.core.exceptions import ConfigError
from kvgraft_plugin.core.sampling import SamplingParams
from kvgraft_plugin.engine.engine import GraftResult
from kvgraft_plugin.engine.grammar import json_grammar, json_schema_grammar

__all__ = ["ChatRequest", "CompletionRequest", "Message", "error_body", "kvgraft_object", "usage"]

#: Fields accepted at their defaults only: (name, the values that mean "off").
_DEFAULT_ONLY: dict[str, tuple[Any, ...]] = {
    "n": (None, 1),
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "best_of": (None, 1),
    "suffix": (None, ""),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "functions": (None, []),
    "function_call": (None, "none"),
    "logit_bias": (None, {}),
}
#: Fields that change nothing here and are accepted as they come.
_IGNORED = {"user", "metadata", "store", "parallel_tool_calls", "service_tier", "stream_options"}

#: A JSON integer: never a boolean (``true`` is not 1), a string or a fraction.
_Integer = Annotated[int, Field(strict=True)]
#: A JSON number, integer or float: never a boolean, a string, ``NaN`` or ``Infinity``.
_Number = Annotated[float, Field(strict=True, allow_inf_nan=False)]


def _is_default(value: Any, defaults: tuple[Any, ...]) -> bool:
    """``value`` is one of ``defaults``, of the same type too (``True == 1`` but ``n: true`` is no default)."""
    return any(type(value) is type(default) and value == default for default in defaults)


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: _Integer | None = Field(default=None, ge=1, le=32768)
    max_completion_tokens: _Integer | None = Field(default=None, ge=1, le=32768)
    temperature: _Number | None = Field(default=None, ge=0, le=2)
    top_p: _Number | None = Field(default=None, gt=0, le=1)
    top_k: _Integer | None = Field(default=None, ge=0)
    min_p: _Number | None = Field(default=None, ge=0, le=1)
    presence_penalty: _Number | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: _Number | None = Field(default=None, ge=-2, le=2)
    repeat_penalty: _Number | None = Field(default=None, gt=0)
    seed: _Integer | None = None
    response_format: dict[str, Any] | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _refuse_what_cannot_be_honoured(self) -> _Request:
        for name, value in (self.model_extra or {}).items():
            if name in _IGNORED:
                continue
            if name not in _DEFAULT_ONLY:
                raise ValueError(f"unsupported parameter {name!r}")
            if not _is_default(value, _DEFAULT_ONLY[name]):
                shown = reprlib.repr(value)  # bounded: the value may be huge or deeply nested
                raise ValueError(f"unsupported value for {name!r}: {shown} (kvgraft supports only the default)")
        return self

    _sampling: dict[str, Any] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _check_sampling(self) -> _Request:
        names = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repeat_penalty")
        asked = {name: getattr(self, name) for name in (*names, "seed")}
        self._sampling = {k: v for k, v in asked.items() if v is not None} | self._grammar()
        try:
            SamplingParams().replace(**self._sampling)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return self

    @property
    def sampling(self) -> dict[str, Any]:
        """The sampling settings asked for, as `GraftEngine.stream` keywords (unset ones left out)."""
        return self._sampling

    def _grammar(self) -> dict[str, str]:
        """``response_format`` as a grammar: ``json_object`` any JSON object, ``json_schema`` its schema."""
        kind = (self.response_format or {"type": "text"}).get("type")
        if kind == "text":
            return {}
        if kind == "json_object":
            return {"grammar": json_grammar()}
        schema = (self.response_format or {}).get("json_schema", {}).get("schema")
        if kind == "json_schema" and isinstance(schema, dict):
            try:
                return {"grammar": json_schema_grammar(schema)}
            except RecursionError:
                raise ValueError("response_format.json_schema.schema is nested too deeply") from None
        raise ValueError("response_format must be text, json_object, or json_schema with a json_schema.schema object")

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, value: str | list[str] | None) -> list[str] | None:
        if isinstance(value, str):
            return [value]
        if value is not None and len(value) > 4:
            raise ValueError("at most 4 stop sequences")
        return value

    @property
    def budget(self) -> int | None:
        """The decode budget asked for (``max_completion_tokens`` wins, as in OpenAI's API)."""
        return self.max_completion_tokens or self.max_tokens

    @property
    def include_usage(self) -> bool:
        """``stream_options.include_usage``."""
        return bool((self.stream_options or {}).get("include_usage"))


class Message(BaseModel):
    """A chat message: text only (a list of text parts is joined)."""

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[dict[str, Any]]
    name: str | None = None

    @property
    def text(self) -> str:
        """The message's text."""
        if isinstance(self.content, str):
            return self.content
        if any(part.get("type") != "text" for part in self.content):
            raise ValueError("only text content is supported")
        return "".join(str(part.get("text", "")) for part in self.content)


class ChatRequest(_Request):
    """``POST /v1/chat/completions``."""

    messages: list[Message] = Field(min_length=1)


class CompletionRequest(_Request):
    """``POST /v1/completions``: one prompt, a string or a list holding one string."""

    prompt: str | list[str]

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, list) and len(value) != 1:
            raise ValueError("exactly one prompt per request")
        return value

    @property
    def text(self) -> str:
        """The prompt."""
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


def kvgraft_object(result: GraftResult) -> dict[str, Any]:
    """What kvgraft adds to every response: how the answer was produced."""
    return {
        "route": result.route,
        "cue": result.cue,
        "entry_id": result.entry_id,
        "score": result.score,
        "fallback_reason": result.fallback_reason,
        "restored_tokens": result.restored_tokens,
        "ttft_ms": round(result.ttft_ms, 3),
        "decode": result.decode,
        "drafted_tokens": result.drafted_tokens,
        "accepted_tokens": result.accepted_tokens,
    }


def usage(result: GraftResult) -> dict[str, Any]:
    """OpenAI usage; restored tokens count as cached prompt tokens."""
    prompt = result.prefill_tokens + result.restored_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": result.decode_tokens,
        "total_tokens": prompt + result.decode_tokens,
        "prompt_tokens_details": {"cached_tokens": result.restored_tokens},
    }


def error_body(message: str, kind: str, code: str | None = None, *, param: str | None = None) -> dict[str, Any]:
    """An OpenAI-style error body; ``param`` names the request field at fault, where there is one."""
    return {"error": {"message": message, "type": kind, "code": code, "param": param}}
