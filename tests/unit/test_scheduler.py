"""Continuous batching over a fake backend of several sequences: concurrent requests get the answers they get
one at a time, a failing or cancelled request leaves the others alone, and the batch is capped where sequences
decoded together stop matching each alone. The real-model tests check the same bitwise on llama.cpp."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from kvgraft_plugin import ConfigError, ContextOverflowError, GraftEngine, RequestCancelledError
from tests.unit.test_engine_fake import EOG, ScriptedBackend

QUESTIONS = [f"question number {i}: say {'abcdefgh'[: 2 + i % 6]}" for i in range(10)]


class SequencedBackend(ScriptedBackend):
    """``n_seq`` sequences; after a prompt, a sequence says the word after its prompt's last "say " backwards,
    then EOG.

    Its logits depend only on the sequence's own tokens, so sequences decoded together are exactly each
    alone, unless ``skew_from``: batches of that many sequences or more move every logit by 1e-3."""

    def __init__(self, model_path, n_seq: int, *, skew_from: int | None = None, n_ctx: int = 4096) -> None:
        super().__init__(model_path, b"", n_ctx)
        self.n_seq, self.skew_from = n_seq, skew_from
        self.seq = 0
        self.prompts: dict[int, list[int]] = {}
        self.cursors: dict[int, int] = {}
        self.pasts: dict[int, int] = {}
        self.batches: list[int] = []

    @property
    def n_past(self) -> int:  # type: ignore[override]
        return self.pasts.get(getattr(self, "seq", 0), 0)

    @n_past.setter
    def n_past(self, value: int) -> None:
        self.pasts = getattr(self, "pasts", {})
        self.pasts[getattr(self, "seq", 0)] = value

    def use_sequence(self, seq: int) -> None:
        assert 0 <= seq < self.n_seq
        self.seq = seq

    def reset(self) -> None:
        self.n_past = 0
        self.prompts[self.seq] = []

    def prefill(self, tokens: Sequence[int]) -> np.ndarray:
        self.threads.add(threading.current_thread().name)
        self.calls.append(("prefill", len(tokens)))
        if len(tokens) > 1:
            self.prompts[self.seq] = self.prompts.get(self.seq, []) + list(tokens)
            self.cursors[self.seq] = 0
        else:
            self.cursors[self.seq] += 1
        self.n_past += len(tokens)
        self.outputs = [self._says(self.seq)]
        return self.outputs[-1]

    def _says(self, seq: int, skew: float = 0.0) -> np.ndarray:
        text = bytes(t for t in self.prompts[seq] if t < 256)
        word = text[text.rindex(b"say ") + 4 :].split()[0][::-1] if b"say " in text else b"?"
        cursor = self.cursors[seq]
        logits = np.zeros(self.n_vocab, dtype=np.float32) + skew
        logits[word[cursor] if cursor < len(word) else EOG] = 1.0
        return logits

    def decode_batch(self, items: Sequence[tuple[int, int]]) -> None:
        self.threads.add(threading.current_thread().name)
        assert 0 < len(items) <= self.n_seq and len({seq for seq, _ in items}) == len(items)
        self.batches.append(len(items))
        skew = 1e-3 if self.skew_from is not None and len(items) >= self.skew_from else 0.0
        self.outputs = []
        for seq, _ in items:
            self.cursors[seq] += 1
            self.pasts[seq] += 1
            self.outputs.append(self._says(seq, skew))

    def restore_state(self, payload, n_tokens: int) -> None:
        raise AssertionError("no library here")


@pytest.fixture
def batched(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # where the batch measurements are kept
    model = tmp_path / "fake.gguf"
    model.write_bytes(b"not a model")
    engines: list[GraftEngine] = []

    def build(n_seq: int, **backend_settings) -> tuple[GraftEngine, SequencedBackend]:
        backend = SequencedBackend(model, n_seq, **backend_settings)
        engine = GraftEngine(None, backend=backend, n_threads=1, decode="step")
        engines.append(engine)
        backend.batches.clear()  # the measurement at start
        return engine, backend

    yield build
    for engine in engines:
        engine.close()


def test_concurrent_requests_get_their_serial_answers_in_batches(batched):
    serial, _ = batched(1)
    assert serial.max_batch == 1 and serial.batch_stats is None
    expected = [serial.ask(q, max_tokens=5) for q in QUESTIONS]
    engine, backend = batched(4)
    assert engine.max_batch == 4
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda q: engine.ask(q, max_tokens=5), QUESTIONS))
    assert [r.text for r in results] == [e.text for e in expected]
    assert [r.finish_reason for r in results] == [e.finish_reason for e in expected]
    assert [r.decode_tokens for r in results] == [e.decode_tokens for e in expected]
    assert {r.text for r in results} >= {"ba", "gfedc", "dcba"} and all(r.decode == "step" for r in results)
    assert max(backend.batches) == 4 and sum(engine.batch_stats.steps.values()) == len(backend.batches)
    assert engine.batch_stats.tokens == sum(backend.batches)
    assert backend.threads == {next(iter(backend.threads))}  # the worker's, only


def test_a_failing_request_fails_alone_and_a_cancelled_one_frees_its_sequence(batched):
    engine, backend = batched(2, n_ctx=160)
    with ThreadPoolExecutor(3) as pool:
        good = pool.submit(engine.ask, QUESTIONS[5], max_tokens=5)
        bad = pool.submit(engine.ask, "x" * 200)  # longer than the context
        with pytest.raises(ContextOverflowError):
            bad.result()
        assert good.result().text == "gfedc"
    stream = engine.stream("a long one: say abcdefghabcdefgh", max_tokens=60)
    first = next(stream)
    assert first.text and first.result is None
    stream.close()  # cancels it at its next step
    # both sequences are free again: two more requests run side by side
    with ThreadPoolExecutor(2) as pool:
        assert [r.text for r in pool.map(engine.ask, QUESTIONS[:2])] == ["ba", "cba"]


def test_the_batch_is_capped_where_sequences_together_stop_matching_each_alone(batched, caplog):
    engine, _ = batched(4, skew_from=3)
    assert engine.max_batch == 2
    assert "batching 2" in caplog.text
    report = engine.sequences.measure()
    assert report.max_batch == 2 and [row.bitwise for row in report.rows] == [True, False]
    assert report.rows[1].max_diff == pytest.approx(1e-3)


def test_lookup_asked_for_says_why_a_batched_request_steps(batched):
    engine, _ = batched(2)
    result = engine.ask(QUESTIONS[3], decode="lookup", max_tokens=4)
    assert result.decode == "step" and any("decoded in a batch" in note for note in result.notes)


def test_a_request_from_inside_a_batched_request_is_refused(batched):
    engine, _ = batched(2)
    with pytest.raises(ConfigError, match="max_batch=1"):
        engine.run_exclusive(lambda backend: engine.ask("nested"))


def test_a_request_cancelled_before_it_starts_is_never_routed_as_serially(batched):
    # its client left while it waited (issue 49, 9): no routing, prefill or decode, in a batch as alone
    for engine in (batched(1)[0], batched(2)[0]):
        cancel = threading.Event()
        cancel.set()
        with pytest.raises(RequestCancelledError, match="cancelled before it started"):
            engine.ask(QUESTIONS[4], cancel=cancel)
        assert engine.ask(QUESTIONS[4]).text  # the next request is served
