"""The machine's caches are never trusted as found (issue 49): the judge's start states, the batch-invariance
results and the sha256 memo. A damaged, forged or hostile file is refused with a warning and recomputed; none
crashes the caller."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat

import pytest

from kvgraft_plugin.core import models
from kvgraft_plugin.core.statefile import encode_state
from kvgraft_plugin.engine.batch_invariance import (
    MAX_BATCH,
    InvarianceReport,
    InvarianceRow,
    LookupBatch,
    cache_path,
    recall,
    remember,
)
from kvgraft_plugin.routing.judge_cache import JudgeStarts

FINGERPRINT = {"gguf_sha256": "a"}
TOKENS = [1, 2, 3]
#: JSON nested past Python's recursion limit.
NESTED = "[" * 100_000 + "]" * 100_000


# -- the judge's start states ---------------------------------------------------------------------------------


@pytest.fixture
def saved(tmp_path):
    """A start saved in ``tmp_path``, and its store."""
    starts = JudgeStarts(tmp_path, FINGERPRINT)
    starts.save(TOKENS, bytearray(b"cells" * 1000))
    assert starts.load(TOKENS) == bytearray(b"cells" * 1000)
    return starts


def test_a_start_edited_with_its_digest_recomputed_is_refused(saved, caplog):
    path = saved.path(TOKENS)
    raw = path.read_bytes()
    state = encode_state("judge-start", TOKENS, FINGERPRINT, b"cells" * 1000)
    assert raw.startswith(state)  # the state format, then (sealed) what follows it
    # an edit of the cells with the state's own digest recomputed, whatever followed the state kept
    path.write_bytes(encode_state("judge-start", TOKENS, FINGERPRINT, b"edit!" * 1000) + raw[len(state) :])
    with caplog.at_level(logging.WARNING):
        assert saved.load(TOKENS) is None
    assert "prefilling it again" in caplog.text
    path.write_bytes(state)  # the state alone, unsealed
    assert saved.load(TOKENS) is None
    path.write_bytes(raw)
    assert saved.load(TOKENS) == bytearray(b"cells" * 1000)


def test_a_start_is_sealed_with_a_private_key_made_once(saved, tmp_path):
    keys = [p for p in tmp_path.iterdir() if not p.name.endswith(".kvstate")]
    assert len(keys) == 1, keys
    info = keys[0].stat()
    assert stat.S_ISREG(info.st_mode) and info.st_mode & 0o777 == 0o600 and info.st_size == 32
    key = keys[0].read_bytes()
    JudgeStarts(tmp_path, FINGERPRINT).save([4, 5], bytearray(b"more"))  # another store: the same key
    assert keys[0].read_bytes() == key and JudgeStarts(tmp_path, FINGERPRINT).load([4, 5]) == bytearray(b"more")
    # another key (another cache's): nothing sealed under the first one is accepted
    keys[0].unlink()
    keys[0].write_bytes(os.urandom(32))
    keys[0].chmod(0o600)
    assert saved.load(TOKENS) is None


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX owners and modes")
def test_a_key_file_readable_by_others_or_not_the_users_own_is_refused(saved, tmp_path, monkeypatch, caplog):
    (key,) = (p for p in tmp_path.iterdir() if not p.name.endswith(".kvstate"))
    for mode in (0o640, 0o604):
        key.chmod(mode)
        with caplog.at_level(logging.WARNING):
            assert saved.load(TOKENS) is None
        assert "key" in caplog.text
        caplog.clear()
    key.chmod(0o600)
    assert saved.load(TOKENS) is not None
    uid = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: uid + 1)  # the key file is now another user's
    assert saved.load(TOKENS) is None
    saved.save([7], bytearray(b"x"))  # nor is anything sealed with it
    monkeypatch.undo()
    assert saved.load([7]) is None


@pytest.mark.parametrize(
    "damage",
    [
        lambda path, key: path.write_bytes(b""),
        lambda path, key: path.write_bytes(b"KVGRAFT\0" + os.urandom(64)),
        lambda path, key: path.write_bytes(path.read_bytes()[:-40]),
        lambda path, key: path.write_bytes(path.read_bytes()[:-1] + b"\0"),
        lambda path, key: key.write_bytes(b"short"),
        lambda path, key: (key.unlink(), key.mkdir()),
        lambda path, key: (key.unlink(), key.symlink_to(path)),
        lambda path, key: key.unlink(),
        lambda path, key: (path.unlink(), path.mkdir()),
    ],
)
def test_a_malformed_start_or_key_is_recomputed_and_never_raises(saved, tmp_path, damage):
    (key,) = (p for p in tmp_path.iterdir() if not p.name.endswith(".kvstate"))
    damage(saved.path(TOKENS), key)
    assert saved.load(TOKENS) is None


# -- batch-invariance results ---------------------------------------------------------------------------------


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path


def _report(max_batch: int) -> InvarianceReport:
    rows = [InvarianceRow(k, s, k <= max_batch, 0.0, 0.0, True) for k in range(2, max_batch + 2) for s in (48, 250)]
    return InvarianceReport(tuple(rows), max_batch)


KEY = {"gguf_sha256": "a", "n_threads": 2}


def test_a_remembered_result_is_recalled(cache):
    assert recall(KEY) is None
    remember(KEY, _report(4))
    assert recall(KEY) == 4
    remember({**KEY, "sequences": 3}, InvarianceReport((InvarianceRow(2, 30, True, 0.0, 0.0, True),), 2))
    assert recall({**KEY, "sequences": 3}) == 2


@pytest.mark.parametrize(
    "content",
    [
        NESTED,
        '{"key": ' + NESTED + ', "max_batch": 4, "rows": []}',
        "[4]",
        '{"max_batch": 1000000000}',  # a forged value past what is ever measured
        '{"max_batch": 0}',
        '{"max_batch": true}',
        '{"max_batch": "16"}',
        '{"max_batch": 16.0}',
    ],
)
def test_a_malformed_or_forged_invariance_result_is_measured_again(cache, content):
    path = cache_path(KEY)
    path.parent.mkdir(parents=True)
    path.write_text(content)
    assert recall(KEY) is None  # never a RecursionError, never the forged value
    measured = LookupBatch({"gguf_sha256": "a"}, 2, lambda measure: InvarianceReport((), 1))
    assert measured.max_batch == 1


def test_an_invariance_result_that_contradicts_itself_or_its_key_is_measured_again(cache):
    good = {"key": KEY, **_report(4).to_json()}
    for forged in (
        {**good, "key": {**KEY, "gguf_sha256": "b"}},  # another runtime's result copied here
        {**good, "max_batch": MAX_BATCH},  # rows that say k = 5 differs
        {**good, "max_batch": 8},
        {**good, "rows": [{"k": 2}]},
        {**good, "rows": "none"},
        {k: v for k, v in good.items() if k != "key"},
    ):
        cache_path(KEY).parent.mkdir(parents=True, exist_ok=True)
        cache_path(KEY).write_text(json.dumps(forged))
        assert recall(KEY) is None, forged
    seq = {**KEY, "sequences": 2}
    rows = [{"k": 2, "start": 30, "bitwise": True, "max_diff": 0.0, "kl": 0.0, "argmax_same": True}]
    cache_path(seq).write_text(json.dumps({"key": seq, "max_batch": 3, "rows": rows}))  # past n_seq
    assert recall(seq) is None
    cache_path(KEY).write_text(json.dumps(good))
    assert recall(KEY) == 4


# -- the sha256 memo ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("content", ["[1, 2]", NESTED, '"text"', "null", '{"x": ' + NESTED + "}"])
def test_a_memo_that_is_not_a_json_object_is_taken_as_empty(tmp_path, content):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"weights")
    (tmp_path / "sha256.json").write_text(content)
    assert models.file_sha256(model, cache_dir=tmp_path) == hashlib.sha256(b"weights").hexdigest()
    memo = json.loads((tmp_path / "sha256.json").read_text())
    assert isinstance(memo, dict) and list(memo.values()) == [hashlib.sha256(b"weights").hexdigest()]


def test_a_memo_entry_that_is_not_a_digest_is_hashed_again(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"weights")
    key = models._memo_key(model.resolve())
    for value in (5, ["x"], "not a digest", None):
        (tmp_path / "sha256.json").write_text(json.dumps({key: value}))
        assert models.file_sha256(model, cache_dir=tmp_path) == hashlib.sha256(b"weights").hexdigest()


def test_a_memo_that_cannot_be_written_only_costs_a_hash(tmp_path, caplog):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"weights")
    (tmp_path / "sha256.json").mkdir()  # where the memo goes, a folder
    with caplog.at_level(logging.WARNING):
        assert models.file_sha256(model, cache_dir=tmp_path) == hashlib.sha256(b"weights").hexdigest()
    assert "memo" in caplog.text
