"""Storage (issue 29): one `Store` interface over a folder and an fsspec URL, one byte-budget LRU for the RAM
state cache and the mirror, a build that writes its manifest a handful of times rather than once an entry,
and one reader of queries files. Libraries are built by the scripted fake backend: no model loads."""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from kvgraft_plugin import (
    BaseStateCache,
    Entry,
    GraftEngine,
    Library,
    RamStateCache,
    SourceError,
    build_library,
)
from kvgraft_plugin.core.paths import cache_root
from kvgraft_plugin.core.statefile import decode_state, encode_state
from kvgraft_plugin.curation import build
from kvgraft_plugin.library.index import Embedder
from kvgraft_plugin.library.library import read_queries
from kvgraft_plugin.library.lru import ByteLRU, FileLRU, RamLRU
from kvgraft_plugin.library.store import FolderStore, Store, UrlStore, default_cache_dir, open_store
from tests.unit.test_engine_fake import ScriptedBackend

ENTRIES = [Entry(f"sum-{i}", f"What is {i} plus {i + 1}?", f"It is {2 * i + 1}.", f"{2 * i + 1}") for i in range(12)]


class AxisEmbedder:
    """Entry ``i``'s problem is axis ``i``; any other text lies between them all."""

    name, dim, files_sha256 = "axes", len(ENTRIES), "axes"
    identity = {"name": "axes", "files_sha256": "axes", "dim": len(ENTRIES)}

    def encode(self, texts: list[str]) -> np.ndarray:
        problems = [e.problem for e in ENTRIES]
        rows = [np.eye(self.dim)[problems.index(t)] if t in problems else np.ones(self.dim) for t in texts]
        return np.asarray([r / np.linalg.norm(r) for r in rows], dtype=np.float32)


@pytest.fixture
def engine(tmp_path, monkeypatch):
    """An engine without a library on the scripted backend, with the axis embedder."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(Embedder, "for_library", classmethod(lambda cls, library, name=None: AxisEmbedder()))
    model = tmp_path / "fake.gguf"
    model.write_bytes(b"not a model")
    made = GraftEngine(None, backend=ScriptedBackend(model, b"3"), n_threads=1)
    yield made
    made.close()


@pytest.fixture
def memory_url():
    """A fresh library URL on fsspec's in-memory filesystem."""
    import fsspec

    root = f"/kvgraft-{uuid.uuid4().hex[:8]}"
    yield f"memory://{root}/lib"
    fs = fsspec.filesystem("memory")
    if fs.exists(root):
        fs.rm(root, recursive=True)


def published(monkeypatch, store_class: type[Store]) -> list[tuple[str, set[str]]]:
    """Record every file ``store_class`` publishes; for a manifest, also the state files it names."""
    seen: list[tuple[str, set[str]]] = []
    publish = store_class.publish

    def spy(self, rel):
        publish(self, rel)
        named = set()
        if rel == "manifest.json":
            named = {r["state_file"] for r in json.loads((self.folder / rel).read_bytes())["entries"].values()}
        seen.append((rel, named))

    monkeypatch.setattr(store_class, "publish", spy)
    return seen


# -- one interface, two stores ---------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["folder", "url"])
def test_a_build_writes_the_manifest_a_few_times_not_once_an_entry(engine, tmp_path, memory_url, monkeypatch, where):
    location, store_class = (str(tmp_path / "lib"), FolderStore) if where == "folder" else (memory_url, UrlStore)
    seen = published(monkeypatch, store_class)
    report = build_library(location, ENTRIES, engine=engine, cache_dir=tmp_path / "mirror")
    assert len(report.built) == len(ENTRIES)
    manifests = [named for rel, named in seen if rel == "manifest.json"]
    assert 1 <= len(manifests) <= 2, f"{len(manifests)} manifest writes for {len(ENTRIES)} entries"  # was 13
    library = Library.open(location, cache_dir=tmp_path / "reader")
    assert sorted(library.entries) == sorted(e.id for e in ENTRIES)
    assert all(library.has_state(r) for r in library.entries.values())


@pytest.mark.parametrize("checkpoint", [0.0, 30.0])
def test_every_manifest_a_build_publishes_names_only_states_published_before_it(
    engine, memory_url, tmp_path, monkeypatch, checkpoint
):
    monkeypatch.setattr(build, "CHECKPOINT_SECONDS", checkpoint)
    seen = published(monkeypatch, UrlStore)
    build_library(memory_url, ENTRIES, engine=engine, cache_dir=tmp_path / "mirror")
    states: set[str] = set()
    for rel, named in seen:
        assert named <= states, f"a manifest named {sorted(named - states)} before they were uploaded"
        states |= {rel} if rel.startswith("states/") else set()
    assert len([rel for rel, _ in seen if rel == "manifest.json"]) >= (len(ENTRIES) if checkpoint == 0 else 1)


def test_an_interrupted_build_lists_exactly_its_finished_entries_and_a_rerun_resumes(
    engine, memory_url, tmp_path, monkeypatch
):
    built: list[str] = []

    def dies_on_the_fifth(engine_, entry, sha):
        if len(built) == 4:
            raise KeyboardInterrupt
        built.append(entry.id)
        return encode(engine_, entry, sha)

    encode = build.encode_entry
    monkeypatch.setattr(build, "encode_entry", dies_on_the_fifth)
    with pytest.raises(KeyboardInterrupt):
        build_library(memory_url, ENTRIES, engine=engine, cache_dir=tmp_path / "mirror")
    reader = Library.open(memory_url, cache_dir=tmp_path / "reader")
    assert sorted(reader.entries) == sorted(built)
    assert all(reader.store.exists(r.state_file) for r in reader.entries.values())
    monkeypatch.setattr(build, "encode_entry", encode)
    report = build_library(memory_url, ENTRIES, engine=engine, cache_dir=tmp_path / "other-mirror")
    assert sorted(report.skipped) == sorted(built) and len(report.built) == len(ENTRIES) - 4


def test_a_pruned_state_is_deleted_only_after_a_manifest_that_no_longer_names_it(
    engine, memory_url, tmp_path, monkeypatch
):
    build_library(memory_url, ENTRIES, engine=engine, cache_dir=tmp_path / "mirror")
    events: list[tuple[str, str]] = []
    delete, publish = UrlStore.delete, UrlStore.publish
    monkeypatch.setattr(UrlStore, "delete", lambda self, rel: (events.append(("delete", rel)), delete(self, rel))[1])
    monkeypatch.setattr(UrlStore, "publish", lambda self, rel: (events.append(("publish", rel)), publish(self, rel))[1])
    report = build_library(memory_url, ENTRIES[:-2], engine=engine, cache_dir=tmp_path / "mirror", prune=True)
    assert sorted(report.removed) == sorted(e.id for e in ENTRIES[-2:])
    first_delete = next(i for i, (what, rel) in enumerate(events) if what == "delete" and rel.startswith("states/"))
    assert ("publish", "manifest.json") in events[:first_delete]


@pytest.mark.parametrize("where", ["folder", "url"])
def test_a_library_reads_the_same_from_either_store(engine, tmp_path, memory_url, where):
    location = str(tmp_path / "lib") if where == "folder" else memory_url
    build_library(location, ENTRIES[:3], engine=engine, cache_dir=tmp_path / "mirror")
    library = Library.open(location, cache_dir=tmp_path / "reader")
    assert isinstance(library.store, FolderStore if where == "folder" else UrlStore)
    assert library.location == (location if where == "url" else str(Path(location)))
    record = library.get(ENTRIES[0].id)
    state = library.read_state(record, library.fingerprint)
    assert state.entry_id == record.id and library.has_state(record)
    library.remove(record.state_file)
    assert not library.has_state(record)
    with pytest.raises(FileNotFoundError):
        library.read_state(record, library.fingerprint)


def test_open_store_picks_the_store_by_the_location(tmp_path):
    assert isinstance(open_store(tmp_path), FolderStore) and open_store(tmp_path).location == str(tmp_path)
    url = open_store("memory://kvgraft-x/lib/", cache_dir=tmp_path)
    assert isinstance(url, UrlStore) and url.location == "memory://kvgraft-x/lib"
    assert url.folder.parent == tmp_path


def test_the_mirror_keeps_its_states_within_budget(engine, tmp_path, memory_url):
    build_library(memory_url, ENTRIES[:3], engine=engine, cache_dir=tmp_path / "mirror")
    library = Library.open(memory_url, cache_dir=tmp_path / "reader", cache_bytes=1)
    for entry in ENTRIES[:3]:
        library.read_state(library.get(entry.id), library.fingerprint)
        kept = sorted(p.name for p in (library.path / "states").glob("*.kvg"))
        assert kept == [Path(library.get(entry.id).state_file).name]  # the one just read, over budget alone


# -- one byte-budget LRU -----------------------------------------------------------------------------------


def test_the_state_cache_is_the_byte_lru_interface():
    assert issubclass(RamStateCache, BaseStateCache) and issubclass(BaseStateCache, ByteLRU)
    assert issubclass(RamStateCache, RamLRU) and issubclass(FileLRU, ByteLRU)
    state = decode_state(encode_state("e", [1], {}, bytes(10)))
    cache = RamStateCache(capacity_bytes=state.nbytes)
    cache.put("a", state)
    assert cache.get("a") is state and cache.cache_size == state.nbytes


def test_a_ram_lru_evicts_the_least_recently_used_first():
    cache: RamLRU[bytes] = RamLRU(10, size=len)
    for key in "abc":
        cache.put(key, b"xxxx")
    assert cache.get("a") is None and cache.cache_size == 8
    cache.get("b")
    cache.put("d", b"xxxx")
    assert cache.get("b") is not None and cache.get("c") is None
    cache.put("b", b"x" * 11)  # over the whole budget: not kept, and the old value is gone
    assert cache.get("b") is None and cache.cache_size == 4


def test_a_file_lru_evicts_the_least_recently_used_files_and_keeps_the_new_one(tmp_path):
    lru = FileLRU(tmp_path, capacity_bytes=10)
    (tmp_path / "states").mkdir()
    now = time.time()
    for age, name in enumerate(["c", "b", "a"]):
        path = tmp_path / "states" / f"{name}.kvg"
        path.write_bytes(b"xxxx")
        os.utime(path, (now - 100 * (age + 1), now - 100 * (age + 1)))  # a oldest, c newest
    assert lru.cache_size == 12
    assert lru.get("states/a.kvg") is not None  # touched: now the most recently used
    new = tmp_path / "states" / "d.kvg"
    new.write_bytes(b"x" * 20)  # over budget alone
    lru.put("states/d.kvg", new)
    assert sorted(p.name for p in (tmp_path / "states").iterdir()) == ["d.kvg"]
    assert lru.get("states/b.kvg") is None
    lru.discard("states/d.kvg")
    assert lru.cache_size == 0


def test_a_file_lru_never_follows_a_link(tmp_path):
    (tmp_path / "states").mkdir()
    outside = tmp_path / "outside"
    outside.write_bytes(b"outside")
    (tmp_path / "states" / "x.kvg").symlink_to(outside)
    assert FileLRU(tmp_path, 10).get("states/x.kvg") is None


# -- one cache root --------------------------------------------------------------------------------------


def test_the_cache_root_follows_xdg_then_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "kvgraft" and default_cache_dir() == cache_root() / "libraries"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "kvgraft"


# -- one reader of queries files -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"id": "a", "question": "q"}', '{"id": "a", "question": "r"}'], ":2: duplicate id 'a' (first on line 1)"),
        (['{"id": "a", "question": "q"}', "[1]"], ':2: expected {"id": str, "question": str, ...}'),
        (['{"id": "", "question": "q"}'], ":1: 'id' must be a non-empty string"),
        (['{"id": "a"}'], ":1: 'question' must be a string"),
        # a query id is printed in tables and logs: no escape sequence, newline or bidirectional override
        (['{"id": "a\\u001b[31m", "question": "q"}'], ":1: 'id' must not contain control characters"),
        (['{"id": "a\\nb", "question": "q"}'], ":1: 'id' must not contain control characters"),
        (['{"id": "a\\u202eb", "question": "q"}'], ":1: 'id' must not contain control characters"),
        (['{"id": "a", "question": "q", "expect_entry": 3}'], ":1: 'expect_entry' must be a string or null"),
        (['{"id": "a", "question": "q", "id": "b"}'], ":1: duplicate key 'id'"),
        (['{"id": "a", "question": "q"'], ":1: "),
        (["", "  "], ": no queries"),
    ],
)
def test_a_bad_queries_file_is_one_error_naming_the_file_and_line(tmp_path, lines, message):
    path = tmp_path / "q.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(SourceError) as caught:
        read_queries(path)
    assert str(caught.value).startswith(f"{path}{message}"), caught.value


def test_queries_keep_their_fields_and_an_empty_question(tmp_path):
    path = tmp_path / "q.jsonl"
    rows = [{"id": "a", "question": "q", "answer": None, "kind": "repeat", "split": "x"}, {"id": "b", "question": ""}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    assert read_queries(path) == rows
    path.write_bytes(b'{"id": "a", "question": "\xff"}\n')
    with pytest.raises(SourceError, match=r"q\.jsonl:1: not valid UTF-8"):
        read_queries(path)
    with pytest.raises(SourceError, match="cannot read queries"):
        read_queries(tmp_path / "none.jsonl")


def test_the_command_line_refuses_duplicate_query_ids_in_one_clean_line(tmp_path):
    import click

    from kvgraft_plugin.cli import _read_queries

    path = tmp_path / "q.jsonl"
    path.write_text('{"id": "a", "question": "q"}\n{"id": "a", "question": "r"}\n')  # bench keyed rows by id
    with pytest.raises(click.ClickException, match="duplicate id 'a'"):
        _read_queries(str(path))
