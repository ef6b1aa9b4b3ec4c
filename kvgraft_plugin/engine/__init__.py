"""The engine: the data path from a question to an answer (route, restore or prefill, decode), serial and
batched, on one worker thread. Imports `core`, `library`, `routing` and the llama.cpp adapter."""
