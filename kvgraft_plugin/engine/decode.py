"""Where decoded tokens come from: one llama.cpp call per token, or drafted from the context and verified
in batches.

Both decoders yield the sampler's tokens one by one; the engine's loop turns them into text, stop strings
and chunks, and closes the generator when it is done. `step_tokens` feeds each token alone.
`lookup_tokens` guesses the next tokens by n-gram match (`Drafter`: the grafted entry's tokens first, then
the query and the text so far), feeds the last token and the guesses as one batch with logits at every
position, and asks the sampler for a token at each position in turn, stopping at the first that differs
from the guess. The sampler sees exactly the logits, history and random draws it sees in step decoding,
so the tokens are step decoding's, greedy or sampled, as long as a batch's logits are bitwise those of
one-token steps: batches are capped at the size `batch_invariance` proved. Rejected guesses are dropped from
the cache before the next batch.
"""

from __future__ import annotations

import codecs
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field

from kvgraft_plugin.core.backend import Backend, TokenSampler

__all__ = [
    "DecodeStats",
    "Drafter",
    "TextAssembler",
    "Transcript",
    "decode_tokens",
    "lookup_tokens",
    "step_tokens",
    "stream_text",
]

#: n-gram lengths tried for a draft, longest first. One token alone matches too often to pay for itself.
NGRAMS = (4, 3, 2)
#: After a draft whose first token is rejected, drafting pauses this many tokens, doubling up to the cap,
#: so that an answer that copies nothing pays almost nothing.
_PAUSE, _MAX_PAUSE = 1, 16
#: A first draft's length without an entry, doubled after each full match up to the longest (the proven
#: batch caps it too). Short first: on Gemma 3 a verified position costs ~0.6 of a step, so a long draft
#: that misses early costs more than it saves.
_FIRST_LENGTH, _MAX_LENGTH = 4, 64


@dataclass
class DecodeStats:
    """What a decoder did for one answer."""

    drafted: int = 0
    """Draft tokens fed for verification."""
    accepted: int = 0
    """Draft tokens the sampler chose too (each saved one llama.cpp call)."""


def decode_tokens(
    backend: Backend,
    sampler: TokenSampler,
    limit: int,
    *,
    batch: int,
    entry: Sequence[int],
    rest: Sequence[int],
    stop: tuple[str, ...],
    stats: DecodeStats,
) -> Generator[int, None, None]:
    """The request's decoder: lookup decoding verifying up to ``batch`` tokens at once (drafts from the
    ``entry`` tokens first, then from ``rest``), or step decoding when ``batch`` is 1."""
    if batch < 2:
        return step_tokens(backend, sampler, limit)
    return lookup_tokens(backend, sampler, limit, Drafter(entry, rest, ends_decoding(backend, stop)), batch, stats)


def ends_decoding(backend: Backend, stop: tuple[str, ...]) -> Callable[[int], bool]:
    """Whether a token ends decoding by itself: an end-of-generation token, or one holding a stop string."""

    def ends(token: int) -> bool:
        piece = backend.token_bytes(token).decode("utf-8", errors="ignore")
        return backend.is_eog(token) or any(s in piece for s in stop)

    return ends


def step_tokens(backend: Backend, sampler: TokenSampler, limit: int) -> Generator[int, None, None]:
    """Up to ``limit`` tokens, one llama.cpp call each (the last token is not fed)."""
    for n in range(limit):
        token = sampler.sample()
        yield token
        if n + 1 < limit:
            backend.decode(token)


class Drafter:
    """Guesses the next tokens from where the latest n-gram occurred before: in ``entry`` (the grafted or
    text-RAG entry's tokens) first, then in ``rest`` (the query suffix and every token since). A draft ends
    at a token for which ``ends`` is true (one that holds a stop string, or ends generation): decoding
    would stop there, so guessing past it only costs.

    Within the entry it follows its last accepted guess on (a cursor), so a copied solution is drafted in
    order even where its n-grams repeat.
    """

    def __init__(
        self, entry: Sequence[int], rest: Sequence[int], ends: Callable[[int], bool] = lambda token: False
    ) -> None:
        self.entry = list(entry)
        self._ends = ends
        self.rest: list[int] = []
        self._entry_index = _index(self.entry)
        self._rest_index: dict[tuple[int, ...], int] = {}
        self._cursor: int | None = None
        """Where in ``entry`` the next token is expected, while a draft from it is being followed."""
        # copying from an entry is the common case: start long; guesses from the query alone start short
        self._length = _MAX_LENGTH if self.entry else _FIRST_LENGTH
        self._pause, self._wait = _PAUSE, 0
        for token in rest:
            self.push(token)

    def push(self, token: int) -> None:
        """Add a decoded token to the context."""
        self.rest.append(token)
        end = len(self.rest) - 1  # the n-grams ending just before ``token`` now have a continuation
        for n in NGRAMS:
            if end >= n:
                self._rest_index[tuple(self.rest[end - n : end])] = end

    def draft(self, limit: int) -> list[int]:
        """Up to ``limit`` guessed next tokens (none while paused, or when no n-gram matches)."""
        limit = min(limit, self._length)
        if self._wait or limit < 1:
            self._wait = max(self._wait - 1, 0)
            return []
        tail = (self.entry[-NGRAMS[0] :] + self.rest[-NGRAMS[0] :])[-NGRAMS[0] :]
        at = self._cursor
        if at is None or not len(tail) <= at < len(self.entry) or self.entry[at - len(tail) : at] != tail:
            at = next((i for n in NGRAMS if (i := self._entry_index.get(tuple(tail[-n:]))) is not None), None)
        self._cursor = at
        if at is not None:
            return self._cut(self.entry[at : at + limit])
        at = next((i for n in NGRAMS if (i := self._rest_index.get(tuple(tail[-n:]))) is not None), None)
        return self._cut(self.rest[at : at + limit]) if at is not None else []

    def _cut(self, draft: list[int]) -> list[int]:
        end = next((i for i, token in enumerate(draft) if self._ends(token)), None)
        return draft if end is None else draft[: end + 1]

    def feedback(self, drafted: int, accepted: int) -> None:
        """Learn from a verified draft: follow the entry on and draft longer after a full match; draft
        shorter after a partial one; pause after a miss, longer each time in a row."""
        if accepted == drafted:
            self._cursor = self._cursor + accepted + 1 if self._cursor is not None else None
            self._length = min(2 * self._length, _MAX_LENGTH)
        else:
            self._cursor = None
            self._length = max(accepted + 1, 1)
        if accepted:
            self._pause = _PAUSE
        else:
            self._wait = self._pause
            self._pause = min(2 * self._pause, _MAX_PAUSE)


def lookup_tokens(
    backend: Backend, sampler: TokenSampler, limit: int, drafter: Drafter, max_batch: int, stats: DecodeStats
) -> Generator[int, None, None]:
    """Up to ``limit`` tokens, exactly `step_tokens`'s, verifying drafts in batches of at most ``max_batch``."""
    token = sampler.sample()
    produced = 1
    yield token
    while produced < limit:
        drafter.push(token)
        draft = drafter.draft(min(max_batch - 1, limit - produced - 1))
        if not draft:
            backend.decode(token)
            token = sampler.sample()
            produced += 1
            yield token
            continue
        base = backend.n_past
        backend.verify([token, *draft])
        stats.drafted += len(draft)
        for i in range(len(draft) + 1):
            token = sampler.sample(i)
            produced += 1
            if i < len(draft) and token == draft[i]:
                stats.accepted += 1
                drafter.push(token)
                yield token
                continue
            yield token
            break
        # the batch's KV is kept up to the last accepted guess; the token just sampled is fed next
        backend.truncate(base + i + 1)
        drafter.feedback(len(draft), i)


def _index(tokens: list[int]) -> dict[tuple[int, ...], int]:
    """Each n-gram's last occurrence with a token after it, by the position of that token."""
    index: dict[tuple[int, ...], int] = {}
    for n in NGRAMS:
        for end in range(n, len(tokens)):
            index[tuple(tokens[end - n : end])] = end
    return index


# -- from tokens to text -----------------------------------------------------------------------------------


@dataclass
class Transcript:
    """What `stream_text` made of the tokens."""

    text: str = ""
    """The answer: trimmed, cut before a stop string."""
    finish: str = "length"
    """``"stop"``, ``"eog"``, ``"length"`` or ``"cancelled"``."""
    n_decoded: int = 0
    """Tokens taken from the decoder, an end-of-generation token included."""
    started: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    """`time.perf_counter` when the first token came."""
    ended: float = 0.0


class TextAssembler:
    """Tokens in, text out, one token at a time: the text safe to show so far, until a stop string or an
    end-of-generation token ends it (`done`).

    A tail that could still grow into a stop string is held back. ``trim`` is the template's (an answer's
    leading whitespace); a stop string only counts in the trimmed text. ``out`` holds the whole text and
    how it ended once `finish` is called. `stream_text` drives it over a decoder's tokens; the batched
    scheduler pushes each sequence's tokens as a step makes them.
    """

    def __init__(self, backend: Backend, *, trim: Callable[[str], str], stop: tuple[str, ...], out: Transcript) -> None:
        self._backend, self._trim, self._stop, self.out = backend, trim, stop, out
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._raw, self._final, self._emitted = "", "", 0
        self.done = False
        """An end-of-generation token or a stop string ended the text: push nothing more."""

    def push(self, token: int) -> str:
        """Take one decoded token; the text that became safe to show ("" when none)."""
        out = self.out
        out.n_decoded += 1
        if out.first_token is None:
            out.first_token = time.perf_counter()
        if self._backend.is_eog(token):
            out.finish, self.done = "eog", True
            return ""
        self._raw += self._decoder.decode(self._backend.token_bytes(token))
        final = self._trim(self._raw)
        cut = min((i for s in self._stop if (i := final.find(s)) >= 0), default=-1)
        if cut >= 0:
            final, out.finish, self.done = final[:cut], "stop", True
        self._final = final
        safe = len(final) if cut >= 0 else len(final) - held_back(final, self._stop)
        if safe <= self._emitted:
            return ""
        piece, self._emitted = final[self._emitted : safe], safe
        return piece

    def finish(self, *, cancelled: bool = False) -> str:
        """End the text (``cancelled``: the caller stopped it); the rest held back, if any."""
        out = self.out
        if out.finish == "length" and cancelled:
            out.finish = "cancelled"
        rest = ""
        if out.finish != "stop":
            self._final = self._trim(self._raw + self._decoder.decode(b"", final=True))
            rest = self._final[self._emitted :]
        out.text, out.ended = self._final, time.perf_counter()
        return rest


def stream_text(
    tokens: Iterator[int],
    backend: Backend,
    *,
    trim: Callable[[str], str],
    stop: tuple[str, ...],
    cancel: threading.Event,
    out: Transcript,
) -> Iterator[str]:
    """Turn tokens into text (`TextAssembler`) until a stop string, an end-of-generation token, the budget or
    ``cancel``, yielding it as it becomes safe to show. ``out`` holds the whole text and how it ended."""
    text = TextAssembler(backend, trim=trim, stop=stop, out=out)
    for token in tokens:
        if piece := text.push(token):
            yield piece
        if text.done or cancel.is_set():
            break
    if rest := text.finish(cancelled=cancel.is_set()):
        yield rest


def held_back(text: str, stop: tuple[str, ...]) -> int:
    """Length of the longest tail of ``text`` that could still grow into a stop string."""
    held = 0
    for s in stop:
        for n in range(min(len(s) - 1, len(text)), held, -1):
            if text.endswith(s[:n]):
                held = n
                break
    return held
