"""The engine's plan and decode loop over a scripted fake backend: stop strings, held-back text, UTF-8,
cancel, budgets and the routes a request can take without a library. The real-model tests cover the same
paths end to end; these pin the logic in milliseconds."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from kvgraft_plugin import (
    ConfigError,
    ContextOverflowError,
    EngineClosedError,
    GraftEngine,
    LibraryError,
    NoMatchError,
    SamplingParams,
)
from kvgraft_plugin.core.exceptions import IntegrityError
from kvgraft_plugin.core.statefile import StateLayout

EOG, BOS = 256, 257


class ScriptedBackend:
    """Bytes are tokens; after a prompt the "model" says ``script`` one byte per step, then an EOG token.

    Its logits depend only on how many tokens followed the prompt, so a batch of them is exactly as many
    one-token steps: lookup decoding is proven here, and gives the step tokens."""

    arch = "fake"
    n_swa = 0
    n_vocab = 258
    n_batch = 512
    layout = StateLayout(kv_sections=1)

    def __init__(self, model_path: Path, script: bytes, n_ctx: int = 4096) -> None:
        self.model_path, self.script, self.n_ctx = model_path, script, n_ctx
        self.n_past, self.cursor = 0, 0
        self.calls: list[tuple[str, int]] = []
        self.threads: set[str] = set()
        self.closed = False
        self.step_seconds = 0.0
        """How long a one-token step takes (a real model: ~16 ms)."""

    def meta(self, key: str) -> str:
        return ""

    def device(self) -> str:
        return "cpu"

    def runtime_facts(self) -> dict:
        return {"llama_cpp_python": "fake", "system_info": "", "tiled_matmul": False, "arch": "fake", "device": "cpu"}

    def check_state(self, payload, n_tokens: int) -> None:
        if int.from_bytes(bytes(payload[:4]), "little") != n_tokens:
            raise IntegrityError(f"state holds another number of positions than {n_tokens}")

    def tokenize(self, text: str, *, add_bos: bool, special: bool = False) -> list[int]:
        return [BOS] * add_bos + list(text.encode())

    def token_bytes(self, token: int) -> bytes:
        return bytes([token]) if token < 256 else b""

    def is_eog(self, token: int) -> bool:
        return token == EOG

    def reset(self) -> None:
        self.n_past = 0

    def prefill(self, tokens: Sequence[int]) -> np.ndarray:
        assert not self.closed, "a closed backend was called"
        self.threads.add(threading.current_thread().name)
        self.calls.append(("prefill", len(tokens)))
        self.n_past += len(tokens)
        self.cursor = 0 if len(tokens) > 1 else self.cursor + 1
        time.sleep(self.step_seconds)
        self.outputs = [self._says(self.cursor)]
        return self.outputs[-1]

    def _says(self, cursor: int) -> np.ndarray:
        logits = np.zeros(self.n_vocab, dtype=np.float32)
        logits[self.script[cursor] if cursor < len(self.script) else EOG] = 1.0
        return logits

    def decode(self, token: int) -> None:
        self.prefill([token])

    def verify(self, tokens: Sequence[int]) -> None:
        self.calls.append(("verify", len(tokens)))
        self.outputs = [self._says(self.cursor + 1 + i) for i in range(len(tokens))]
        self.n_past += len(tokens)
        self.cursor += len(tokens)

    def truncate(self, n_tokens: int) -> None:
        self.cursor -= self.n_past - n_tokens
        self.n_past = n_tokens

    def logits(self, index: int = -1) -> np.ndarray:
        return self.outputs[index].copy()

    def sampler(self, params, history: Sequence[int]) -> Greedy:
        self.history = list(history)
        return Greedy(self)

    def capture_state(self) -> bytearray:
        return bytearray(self.n_past.to_bytes(4, "little"))

    def restore_state(self, payload: bytearray | memoryview, n_tokens: int) -> None:
        self.n_past = n_tokens

    def close(self) -> None:
        self.closed = True


class Greedy:
    """The scripted model's sampler: its most likely token."""

    def __init__(self, backend: ScriptedBackend) -> None:
        self.backend = backend

    def sample(self, index: int = -1) -> int:
        return int(np.argmax(self.backend.outputs[index]))

    def close(self) -> None:
        self.backend.sampler_closed = True


@pytest.fixture
def make(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the batch-invariance result
    model = tmp_path / "fake.gguf"
    model.write_bytes(b"not a model")
    engines: list[GraftEngine] = []

    def build(script: str | bytes, **settings) -> tuple[GraftEngine, ScriptedBackend]:
        n_ctx = settings.pop("n_ctx", 4096)
        backend = ScriptedBackend(model, script.encode() if isinstance(script, str) else script, n_ctx)
        engine = GraftEngine(None, backend=backend, n_threads=1, **settings)
        backend.calls.clear()  # the batch-invariance measurement at start
        engines.append(engine)
        return engine, backend

    yield build
    for engine in engines:
        engine.close()


def test_stops_at_the_stop_string_and_counts_its_tokens(make):
    engine, _ = make("391\nmore text")
    result = engine.ask("q", stop=["\n"])
    assert (result.text, result.finish_reason, result.decode_tokens) == ("391", "stop", 4)


def test_leading_whitespace_is_dropped_and_never_stops(make):
    engine, _ = make("\n  42\nrest")
    assert engine.ask("q", stop=["\n"]).text == "42"


def test_text_that_may_start_a_stop_string_is_held_back(make):
    engine, _ = make("abcENxENDxyz")
    chunks = [c.text for c in engine.stream("q", stop=["END"])]
    assert "".join(chunks) == "abcENx"
    assert all(not c.endswith(("E", "EN")) for c in chunks if c)  # "EN" came out only once "x" decided it


def test_held_back_text_is_released_when_the_budget_ends(make):
    engine, _ = make("abcEN")
    result = engine.ask("q", stop=["END"], max_tokens=5)
    assert (result.text, result.finish_reason) == ("abcEN", "length")


def test_end_of_generation_token(make):
    engine, _ = make("hi")
    result = engine.ask("q", stop=[])
    assert (result.text, result.finish_reason, result.decode_tokens) == ("hi", "eog", 3)


def test_a_character_split_across_tokens_is_decoded_whole(make):
    engine, _ = make("é→!")
    chunks = [c.text for c in engine.stream("q", stop=[])]
    assert "".join(chunks) == "é→!" and "\ufffd" not in "".join(chunks)


def test_an_abandoned_stream_stops_decoding(make):
    engine, backend = make("x" * 500)
    backend.step_seconds = 0.005  # the consumer drops the stream well within a few steps
    stream = engine.stream("q", stop=[], max_tokens=500)
    next(stream)
    stream.close()
    engine.ask("q", stop=[], max_tokens=1)  # queued behind the abandoned one
    steps = [n for kind, n in backend.calls if kind == "prefill"]
    assert len(steps) < 50, f"{len(steps)} prefill calls: the abandoned request was not cancelled"


def test_decoding_stops_at_the_end_of_the_context(make):
    engine, backend = make("y" * 300, n_ctx=200)
    result = engine.ask("q", stop=[], max_tokens=150)
    # one token per free position: the last one sampled from the last position's logits, and not fed
    assert result.finish_reason == "length" and result.prefill_tokens + result.decode_tokens == backend.n_ctx
    assert backend.n_past == backend.n_ctx - 1


def test_a_query_longer_than_the_context_is_refused(make):
    engine, _ = make("a", n_ctx=64)
    with pytest.raises(ContextOverflowError):
        engine.ask("x" * 100)


def test_routes_without_a_library(make):
    engine, _ = make("ok")
    assert engine.ask("q", mode="plain").fallback_reason is None
    auto = engine.ask("q")
    assert auto.route == "plain" and auto.fallback_reason == "no-match: no library is loaded"
    with pytest.raises(LibraryError, match="no library"):
        engine.ask("q", mode="graft")
    with pytest.raises(NoMatchError):
        engine.ask("q", routing={"fallback": "raise"})
    with pytest.raises(ConfigError, match="per-request"):
        engine.ask("q", routing={"n_ctx": 8})
    with pytest.raises(ConfigError, match="threshold"):
        engine.ask("q", routing={"threshold": 2.0})


def test_the_backend_is_only_called_on_the_worker_thread(make):
    engine, backend = make("ok")
    engine.ask("q")
    assert engine.tokenize("ab") == [97, 98]
    assert engine.capture([1, 2, 3], probe=[4, 5]).max_diff == 0.0
    assert engine.run_exclusive(lambda b: threading.current_thread().name).startswith("kvgraft")
    assert backend.n_past == 0  # tool calls leave an empty cache behind
    assert {name.split("_")[0] for name in backend.threads} == {"kvgraft"}


def test_a_closed_engine_refuses_every_call(make):
    engine, backend = make("ok")
    engine.close()
    engine.close()  # closing twice is harmless
    assert backend.closed
    for call in (lambda: engine.ask("q"), lambda: engine.search("q"), lambda: engine.tokenize("q")):
        with pytest.raises(EngineClosedError):
            call()


def test_solution_format_keeps_indentation_and_stops_at_the_marker(make):
    engine, _ = make("\n    return 2 * x\n[end of solution]\n\nProblem: more", answer_format="solution")
    result = engine.ask("def double(x):")
    assert (result.text, result.finish_reason) == ("    return 2 * x", "stop")


def test_curate_keeps_code_that_passes_its_tests(make, tmp_path):
    from kvgraft_plugin.curation.answer_checks import load_checker
    from kvgraft_plugin.curation.curate import curate
    from kvgraft_plugin.library.library import read_source

    engine, _ = make("\n    return 2 * x\n[end of solution]\n", answer_format="solution")
    problems = [
        {"id": "double", "problem": "def double(x):\n    '''Twice x.'''", "tests": "assert double(3) == 6"},
        {"id": "triple", "problem": "def triple(x):\n    '''Three times x.'''", "tests": "assert triple(3) == 9"},
    ]
    out = tmp_path / "curated.jsonl"
    reports = curate(engine, problems, out, attempts=2, sampling=SamplingParams(), checker=load_checker("tests"))
    assert [(r.id, r.kept, r.attempts) for r in reports] == [("double", True, 1), ("triple", False, 2)]
    (entry,) = read_source(out)
    assert entry.solution == "    return 2 * x" and entry.tests == "assert double(3) == 6" and entry.answer is None


# -- lookup decoding ---------------------------------------------------------------------------------------


def test_lookup_drafts_from_the_context_and_gives_the_step_text(make):
    question = "repeat after me: the cat sat on the mat, the cat sat on the mat"
    engine, backend = make("the cat sat on the mat, the cat sat on the mat\n")
    step = engine.ask(question, decode="step", stop=["\n"])
    backend.calls.clear()
    lookup = engine.ask(question, decode="lookup", stop=["\n"])
    assert (lookup.text, lookup.decode_tokens, lookup.finish_reason) == (step.text, step.decode_tokens, "stop")
    assert (step.decode, lookup.decode) == ("step", "lookup")
    assert step.drafted_tokens == step.accepted_tokens == 0
    assert lookup.accepted_tokens > 30 and lookup.drafted_tokens >= lookup.accepted_tokens
    verified = [n for kind, n in backend.calls if kind == "verify"]
    assert verified and max(verified) > 1
    assert len(verified) + sum(n == 1 for kind, n in backend.calls if kind == "prefill") < step.decode_tokens / 2


def test_a_rejected_draft_is_dropped_and_the_step_text_comes_out(make):
    question = "abcdefgh abcdefgh"
    engine, backend = make("abcdXYZW abcdefgh\n")  # "abcd" drafts "efgh", the model says "XYZW"
    step = engine.ask(question, decode="step", stop=["\n"])
    lookup = engine.ask(question, decode="lookup", stop=["\n"])
    assert lookup.text == step.text == "abcdXYZW abcdefgh"
    assert lookup.drafted_tokens > lookup.accepted_tokens > 0


def test_lookup_keeps_the_budget_and_the_context_limit(make):
    question = "xyxyxyxyxyxyxyxyxyxyxy"
    engine, _ = make("xy" * 100, n_ctx=128)
    for budget in (1, 2, 5, 17):
        step = engine.ask(question, decode="step", max_tokens=budget)
        lookup = engine.ask(question, decode="lookup", max_tokens=budget)
        assert (lookup.text, lookup.decode_tokens) == (step.text, step.decode_tokens) == (step.text, budget)
        assert lookup.decode == "lookup"
    step = engine.ask(question, decode="step", max_tokens=500)  # the context ends first
    lookup = engine.ask(question, decode="lookup", max_tokens=500)
    assert (lookup.text, lookup.decode_tokens, lookup.finish_reason) == (step.text, step.decode_tokens, "length")


def test_lookup_is_step_decoding_where_batches_are_not_proven(make, monkeypatch):
    engine, _ = make("abab\n", decode="lookup")
    engine.lookup._max_batch = 1  # what a build whose batches differ from steps measures
    result = engine.ask("abababab", stop=["\n"])
    assert (result.text, result.decode) == ("abab", "step")
    assert any("lookup decoding not used" in note for note in result.notes)
    assert engine.ask("abababab", stop=["\n"], decode="auto").notes == []  # auto falls back silently


def test_decode_mode_is_checked(make):
    engine, _ = make("a")
    with pytest.raises(ConfigError, match="decode"):
        engine.ask("q", decode="fast")
    with pytest.raises(ConfigError, match="decode"):
        make("a", decode="fast")


def test_a_request_made_on_the_worker_thread_runs_there_instead_of_deadlocking(make):
    """A tool or a match_check hook runs on the worker; a request it makes used to queue behind itself."""
    engine, _ = make("Paris.")
    done: list[str] = []

    def nested(backend) -> None:
        done.append(engine.ask("Capital of France?", mode="plain", max_tokens=8, stop=[]).text)

    worker = threading.Thread(target=engine.run_exclusive, args=(nested,), daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert not worker.is_alive(), "stream() from the worker thread deadlocked"
    assert done == ["Paris."]
