"""A chat as the engine takes it: the last user turn is the question, system texts join, earlier
(user, assistant) pairs are the history. Shared by `ChatKVGraft` and ``kvgraft serve``."""

from __future__ import annotations

from collections.abc import Sequence

from kvgraft_plugin.core.exceptions import ConfigError

__all__ = ["ROLES", "split_chat"]

ROLES = ("system", "user", "assistant")


def split_chat(turns: Sequence[tuple[str, str]]) -> tuple[str, str | None, list[tuple[str, str]]]:
    """(question, system text, earlier (user, assistant) turns) from ``(role, text)`` turns that end with a
    user turn. Consecutive user turns join with a space; system turns anywhere join with a newline."""
    for role, _ in turns:
        if role not in ROLES:
            raise ConfigError(f"unsupported message role {role!r}: only {', '.join(ROLES)}")
    if not turns or turns[-1][0] != "user":
        last = turns[-1][0] if turns else "nothing"
        raise ConfigError(f"the last message must be a user message (the question); got {last}")
    system = "\n".join(text for role, text in turns if role == "system") or None
    history: list[tuple[str, str]] = []
    pending: list[str] = []
    for role, text in turns[:-1]:
        if role == "user":
            pending.append(text)
        elif role == "assistant":
            history.append((" ".join(pending), text))
            pending = []
    return " ".join([*pending, turns[-1][1]]), system, history
