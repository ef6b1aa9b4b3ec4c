"""Routing: a question -> the same problem as an entry, or not, with the reason of each step; the judge
that approves paraphrases off the request's path. Imports `core`, `library` and the llama.cpp adapter."""
