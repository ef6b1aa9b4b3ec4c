import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgraft_plugin import Entry, EntryNotFoundError, Library, LibraryError, RamStateCache, SourceError, read_source
from kvgraft_plugin.core.statefile import decode_state, encode_state
from kvgraft_plugin.library.library import load_key


def write(tmp_path, lines):
    path = tmp_path / "src.jsonl"
    path.write_bytes(b"\n".join(line if isinstance(line, bytes) else line.encode() for line in lines))
    return path


def test_read_source(tmp_path):
    path = write(tmp_path, [json.dumps({"id": "a", "problem": "p", "solution": "s", "answer": "1", "tags": ["x"]}), ""])
    assert read_source(path) == [Entry("a", "p", "s", "1", ("x",))]


@pytest.mark.parametrize(
    ("lines", "match"),
    [
        (['{"id": "a", "problem": "p", "solution": "s"}', "{not json"], ":2:"),
        (
            ['{"id": "a", "problem": "p", "solution": "s"}', '{"id": "a", "problem": "q", "solution": "t"}'],
            "duplicate id 'a'",
        ),
        (['{"id": "a", "problem": "  ", "solution": "s"}'], "problem"),
        (['{"id": " ", "problem": "p", "solution": "s"}'], "id"),
        (['{"id": "a", "problem": "p", "solution": "s", "extra": 1}'], "unknown"),
        ([b'{"id": "a", "problem": "\xff", "solution": "s"}'], "UTF-8"),
        (["[1, 2]"], "object"),
        ([""], "no entries"),
    ],
)
def test_read_source_errors_name_the_line(tmp_path, lines, match):
    with pytest.raises(SourceError, match=match):
        read_source(write(tmp_path, lines))


@given(st.lists(st.binary(max_size=80), max_size=5))
@settings(max_examples=200, deadline=None)
def test_source_parser_fuzz(tmp_path_factory, lines):
    path = tmp_path_factory.mktemp("fuzz") / "s.jsonl"
    path.write_bytes(b"\n".join(lines))
    try:
        entries = read_source(path)
    except SourceError:
        return
    assert all(isinstance(e, Entry) for e in entries)


def test_missing_library_is_a_clear_error(tmp_path):
    with pytest.raises(LibraryError, match="not a kvgraft library"):
        Library.open(tmp_path)


def test_corrupt_manifest(tmp_path):
    (tmp_path / "manifest.json").write_text("{broken")
    with pytest.raises(LibraryError, match="corrupt"):
        Library.open(tmp_path)


def test_signature_roundtrip_and_tamper(tmp_path):
    lib = Library.create(tmp_path)
    lib.routing = {"threshold": 0.5, "margin": 0.0, "source": "user"}
    lib.save()
    key = b"k" * 32
    lib.sign(key)
    assert Library.open(tmp_path, key=key).trusted
    assert not Library.open(tmp_path, key=b"x" * 32).trusted
    manifest = tmp_path / "manifest.json"
    manifest.write_text(manifest.read_text().replace("0.5", "0.1"))
    reopened = Library.open(tmp_path, key=key)
    assert not reopened.trusted and "signature" in reopened.untrusted_reason
    (tmp_path / "manifest.sig").write_bytes(b"\xff\xfe not hex")
    assert not Library.open(tmp_path, key=key).trusted
    (tmp_path / "manifest.sig").unlink()
    assert Library.open(tmp_path, key=key).untrusted_reason == "the library is not signed"


def test_key_must_be_long_enough(tmp_path):
    short = tmp_path / "k"
    short.write_bytes(b"x" * 31)
    with pytest.raises(ValueError, match="at least 32"):
        load_key(short)


def test_get_unknown_entry(tmp_path):
    with pytest.raises(EntryNotFoundError, match="nope"):
        Library.create(tmp_path).get("nope")


def test_lock_refuses_a_second_build(tmp_path):
    lib = Library.create(tmp_path)
    with lib.lock():
        with pytest.raises(LibraryError, match="lock"):
            with Library.create(tmp_path).lock():
                pass
    with lib.lock():
        pass


def _state(n):
    return decode_state(encode_state("e", [1], {}, bytes(n)))


def test_lru_respects_its_byte_budget():
    cache = RamStateCache(capacity_bytes=3 * _state(100).nbytes)
    for key in "abcd":
        cache.put(key, _state(100))
    assert cache.get("a") is None and cache.get("d") is not None
    assert cache.cache_size <= cache.capacity_bytes
    cache.get("b")
    cache.put("e", _state(100))
    assert cache.get("b") is not None and cache.get("c") is None
    cache.put("huge", _state(10_000))
    assert cache.get("huge") is None
    cache.discard("b")
    assert cache.get("b") is None and cache.cache_size == 2 * _state(100).nbytes


@pytest.mark.parametrize("entry_id", ["Suite/0", "a b: c", "tâche 1: somme", "x" * 256, "../../etc/passwd", "日本"])
def test_any_visible_id_up_to_256_characters_is_accepted(entry_id):
    from kvgraft_plugin.library.library import parse_entry, state_file_name

    entry = parse_entry({"id": entry_id, "problem": "p", "solution": "s"})
    assert entry.id == entry_id
    assert re.fullmatch(r"states/[0-9a-f]{32}\.kvg", state_file_name(entry_id))  # never a path from the id


@pytest.mark.parametrize("entry_id", ["", "   ", "x" * 257, 7, None, "\ud800", "a\nb", "a\x1b[2J"])
def test_empty_long_or_non_text_ids_are_refused(entry_id):
    from kvgraft_plugin.library.library import parse_entry

    with pytest.raises(ValueError, match="'id'"):
        parse_entry({"id": entry_id, "problem": "p", "solution": "s"})


@pytest.mark.parametrize(
    "entry_id",
    ["\u202eevil", "a\u200bb", "a\u200eb", "a\u200fb", "a\u202ab", "a\u2066b", "a\u2069b", "\ufeffid", "a\u00adb"],
)
def test_ids_with_display_spoofing_format_characters_are_refused(entry_id):
    from kvgraft_plugin.library.library import parse_entry

    with pytest.raises(ValueError, match="'id' must not contain control characters or format characters"):
        parse_entry({"id": entry_id, "problem": "p", "solution": "s"})
