"""Edges of kvgraft: the llama.cpp backend (`llama_cpp`) and the LangChain classes (`langchain`).

Installed as ``kvgraft_plugin.adapters``. The LangChain module is imported on demand, so the core
never needs LangChain.
"""
