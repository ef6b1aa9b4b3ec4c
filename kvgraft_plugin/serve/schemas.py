"""OpenAI request bodies as ``kvgraft serve`` accepts them, and its response pieces.

A field OpenAI defines but kvgraft cannot honour is refused with a 400 when it asks for something other
than the default (``n=2``, ``logprobs=true``, tools), never silently dropped.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .._engine import GraftResult

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
    "top_p": (None, 1, 1.0),
    "frequency_penalty": (None, 0, 0.0),
    "presence_penalty": (None, 0, 0.0),
    "logit_bias": (None, {}),
    "response_format": (None, {"type": "text"}),
}
#: Fields that change nothing here and are accepted as they come.
_IGNORED = {"user", "metadata", "store", "parallel_tool_calls", "service_tier", "stream_options"}


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: int | None = Field(default=None, ge=1, le=32768)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=32768)
    temperature: float | None = Field(default=None, ge=0, le=2)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _refuse_what_cannot_be_honoured(self) -> _Request:
        for name, value in (self.model_extra or {}).items():
            if name in _IGNORED:
                continue
            if name not in _DEFAULT_ONLY:
                raise ValueError(f"unsupported parameter {name!r}")
            if value not in _DEFAULT_ONLY[name]:
                raise ValueError(f"unsupported value for {name!r}: {value!r} (kvgraft supports only the default)")
        return self

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
        "entry_id": result.entry_id,
        "score": result.score,
        "fallback_reason": result.fallback_reason,
        "restored_tokens": result.restored_tokens,
        "ttft_ms": round(result.ttft_ms, 3),
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


def error_body(message: str, kind: str, code: str | None = None) -> dict[str, Any]:
    """An OpenAI-style error body."""
    return {"error": {"message": message, "type": kind, "code": code, "param": None}}
