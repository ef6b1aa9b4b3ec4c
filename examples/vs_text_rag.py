"""The standard LangChain text-RAG chain side by side with the graft chain, on the same queries.

Text RAG: langchain_community FAISS over HuggingFaceEmbeddings (the same all-MiniLM-L6-v2) retrieves the
entry, pastes it into the prompt, and `LlamaCpp` (the same GGUF) prefills all of it. Graft: `ChatKVGraft`
routes with the same embedder and restores the entry's KV state. Both run for real; TTFT is measured
from the call to the first streamed token. `LlamaCpp` tokenizes the prompt as one string and reuses a
matching cached prompt prefix of its own, so its text can differ from kvgraft's text-rag route, which
feeds exactly the grafted token ids (that is the route the bitwise-identity claim is about).

    .venv/bin/python examples/vs_text_rag.py [LIBRARY]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from langchain_community.llms import LlamaCpp
from langchain_community.vectorstores import FAISS
from langchain_core.prompts import PromptTemplate
from langchain_huggingface import HuggingFaceEmbeddings

from kvgraft_plugin import Library
from kvgraft_plugin.adapters.langchain import ChatKVGraft
from kvgraft_plugin.core.models import bundled_embedder_path
from kvgraft_plugin.library.template import render_entry, render_preamble, render_query

library_dir = sys.argv[1] if len(sys.argv) > 1 else str(Path.home() / ".cache" / "kvgraft" / "demo-library")
library = Library.open(library_dir)
entries = [r.entry for r in library.entries.values()]
model_path = library.model["path"]

# -- the standard text-RAG chain --------------------------------------------------------------------------
embeddings = HuggingFaceEmbeddings(
    model_name=str(bundled_embedder_path()), encode_kwargs={"normalize_embeddings": True}
)
store = FAISS.from_texts([e.problem for e in entries], embeddings, metadatas=[{"id": e.id} for e in entries])
by_id = {e.id: e for e in entries}
llm = LlamaCpp(
    model_path=model_path,
    n_ctx=4096,
    n_batch=512,
    n_threads=2,
    temperature=0.0,
    repeat_penalty=1.0,
    max_tokens=32,
    stop=["\n"],
    verbose=False,
)
prompt = PromptTemplate.from_template("{context}{query}")


def text_rag(question: str) -> tuple[str, float, int]:
    t0 = time.perf_counter()
    doc = store.similarity_search(question, k=1)[0]
    context = render_preamble() + render_entry(by_id[doc.metadata["id"]])
    text, ttft = "", None
    for piece in (prompt | llm).stream({"context": context, "query": render_query(question)}):
        ttft = ttft or (time.perf_counter() - t0) * 1000
        text += piece
    n_prompt = len(llm.client.tokenize((context + render_query(question)).encode()))
    return text.strip(), ttft or 0.0, n_prompt


# -- the graft chain -----------------------------------------------------------------------------------------
chat = ChatKVGraft(library=library_dir, model_path=model_path, n_threads=2, max_tokens=32)


def graft(question: str) -> tuple[str, float, int, str]:
    t0 = time.perf_counter()
    text, ttft, meta = "", None, {}
    for chunk in chat.stream(question):
        if chunk.content:
            ttft = ttft or (time.perf_counter() - t0) * 1000
        text += chunk.content
        meta = chunk.response_metadata or meta
    return text, ttft or 0.0, meta.get("prefill_tokens", 0), meta.get("route", "?")


questions = [
    "What is 17 times 23?",
    "Starting from 27, how many steps does the Collatz process take to reach 1?",
    "Find the square root of 1764.",
    "What is the sum of the squares of the integers from 1 to 40?",
]
graft("What is 2 plus 2?"), text_rag("What is 2 plus 2?")  # warm both up (not on a measured prompt)
print(f"{'question':<44} {'text-RAG':<10} {'ttft':>7} {'prefill':>7} | {'graft':<10} {'ttft':>7} {'prefill':>7} route")
for q in questions:
    rag_text, rag_ttft, rag_prefill = text_rag(q)
    g_text, g_ttft, g_prefill, route = graft(q)
    print(
        f"{q[:44]:<44} {rag_text[:10]:<10} {rag_ttft:>6.0f}ms {rag_prefill:>7} | {g_text[:10]:<10} {g_ttft:>6.0f}ms "
        f"{g_prefill:>7} {route}"
    )
