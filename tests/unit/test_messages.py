"""ChatKVGraft's message conversion: what becomes the question, the system text and the history, and what
is refused."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, ChatMessage, FunctionMessage, HumanMessage, SystemMessage, ToolMessage

from kvgraft_plugin import ConfigError
from kvgraft_plugin.adapters.langchain import _split_messages


def test_question_system_and_history():
    question, system, history = _split_messages(
        [
            SystemMessage("Be brief."),
            HumanMessage("What is 2 plus 2?"),
            AIMessage("4"),
            SystemMessage("Numbers only."),
            HumanMessage("Now this one."),
            HumanMessage("What is 17 times 23?"),
        ]
    )
    assert question == "Now this one. What is 17 times 23?"
    assert system == "Be brief.\nNumbers only."
    assert history == [("What is 2 plus 2?", "4")]


def test_chat_message_roles_are_mapped():
    converted = _split_messages([ChatMessage(role="system", content="s"), ChatMessage(role="user", content="q")])
    assert converted == ("q", "s", [])
    text_blocks = HumanMessage([{"type": "text", "text": "What is"}, {"type": "text", "text": " 6 times 7?"}])
    assert _split_messages([text_blocks])[0] == "What is 6 times 7?"


@pytest.mark.parametrize(
    "messages, refused",
    [
        ([], "last message must be a human"),
        ([HumanMessage("q"), AIMessage("a")], "last message must be a human"),
        ([HumanMessage("q"), SystemMessage("s")], "last message must be a human"),
        ([ToolMessage("1", tool_call_id="t"), HumanMessage("q")], "type 'tool'"),
        ([FunctionMessage("1", name="f"), HumanMessage("q")], "type 'function'"),
        ([AIMessage("", tool_calls=[{"name": "f", "args": {}, "id": "t"}]), HumanMessage("q")], "tool calls"),
        ([ChatMessage(role="critic", content="x"), HumanMessage("q")], "role 'critic'"),
        ([HumanMessage([{"type": "image", "url": "https://example.com/a.png"}])], "text only"),
    ],
)
def test_what_cannot_be_rendered_is_refused(messages, refused):
    with pytest.raises(ConfigError, match=refused):
        _split_messages(messages)
