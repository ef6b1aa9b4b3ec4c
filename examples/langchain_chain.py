"""An LCEL chain over the example library: prompt | ChatKVGraft | StrOutputParser.

Run after `make demo` (which builds the library), or pass another library folder:

    .venv/bin/python examples/langchain_chain.py [LIBRARY]
"""

from __future__ import annotations

import sys
from pathlib import Path

from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate

from kvgraft_plugin.adapters.langchain import ChatKVGraft

library = sys.argv[1] if len(sys.argv) > 1 else str(Path.home() / ".cache" / "kvgraft" / "demo-library")
chat = ChatKVGraft(library=library, max_tokens=32)
prompt = ChatPromptTemplate.from_messages([("human", "{question}")])
chain = prompt | chat | StrOutputParser()

questions = ["What is 17 times 23?", "Find the square root of 1764.", "What is the capital of France?"]
for question in questions:
    message = (prompt | chat).invoke({"question": question})
    meta = message.response_metadata
    print(
        f"{question:<34} -> {message.content!r:<12} route={meta['route']:<8} entry={meta['entry_id']} "
        f"ttft={meta['ttft_ms']:.0f} ms"
    )

print("streamed:", "".join(chain.stream({"question": "What is the sum of all integers from 1 to 100?"})))
print("batch:   ", chain.batch([{"question": q} for q in questions], config={"max_concurrency": 2}))
