"""Library edges (issue 31): every index row is bound to its entry, storage errors are one clean line, and
a library's files, ids and renames cannot mislead a reader. Libraries are built here by the scripted fake
backend and a fake embedder: no model loads."""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import uuid
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from kvgraft_plugin import (
    Entry,
    GraftEngine,
    IndexMismatchError,
    IntegrityError,
    Library,
    LibraryError,
    build_library,
)
from kvgraft_plugin.cli import main
from kvgraft_plugin.core.statefile import read_file
from kvgraft_plugin.library.index import Embedder, VectorIndex, open_index
from tests.helpers import free_port
from tests.unit.test_engine_fake import ScriptedBackend

ENTRIES = [
    Entry("mul-17x23", "What is 17 times 23?", "17 x 23 = 340 + 51 = 391.", "391"),
    Entry("gcd-84-126", "What is the greatest common divisor of 84 and 126?", "84 = 2 x 42, so 42.", "42"),
]


class FakeEmbedder:
    """Each entry's problem is one axis; any other text lies between them."""

    name, dim, files_sha256 = "fake", 4, "fake"
    identity = {"name": "fake", "files_sha256": "fake", "dim": 4}

    def encode(self, texts: list[str]) -> np.ndarray:
        rows = []
        for text in texts:
            row = np.full(self.dim, 0.1, dtype=np.float32)
            for axis, entry in enumerate(ENTRIES):
                if text == entry.problem:
                    row = np.eye(self.dim, dtype=np.float32)[axis]
            rows.append(row / np.linalg.norm(row))
        return np.asarray(rows, dtype=np.float32)


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """``engine(library=None, **settings)``: an engine on the scripted backend with the fake embedder."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(Embedder, "for_library", classmethod(lambda cls, library, name=None: FakeEmbedder()))
    model = tmp_path / "fake.gguf"
    model.write_bytes(b"not a model")
    engines: list[GraftEngine] = []

    def engine(library=None, **settings) -> GraftEngine:
        made = GraftEngine(library, backend=ScriptedBackend(model, b"391"), n_threads=1, **settings)
        engines.append(made)
        return made

    yield engine
    for made in engines:
        made.close()


@pytest.fixture
def lib(fake, tmp_path) -> Path:
    path = tmp_path / "lib"
    report = build_library(path, ENTRIES, engine=fake())
    assert sorted(report.built) == sorted(e.id for e in ENTRIES)
    return path


def manifest(lib: Path) -> dict:
    return json.loads((lib / "manifest.json").read_text())


def write_manifest(lib: Path, data: dict) -> None:
    (lib / "manifest.json").write_text(json.dumps(data))


def swap_index_ids(lib: Path) -> None:
    data = manifest(lib)
    data["index"]["ids"] = list(reversed(data["index"]["ids"]))
    write_manifest(lib, data)


# -- finding 1: every index row is bound to its entry ------------------------------------------------------


def test_an_intact_index_routes_each_problem_to_its_entry(lib):
    index = open_index(Library.open(lib), FakeEmbedder())
    for entry in ENTRIES:
        assert index.search(FakeEmbedder().encode([entry.problem])[0], 1)[0].entry_id == entry.id


def test_the_build_records_a_digest_binding_the_rows_to_their_ids(lib):
    record = manifest(lib)["index"]
    assert isinstance(record.get("rows_sha256"), str) and len(record["rows_sha256"]) == 64


def test_swapped_index_ids_are_refused_when_the_index_loads(lib):
    swap_index_ids(lib)
    library = Library.open(lib)
    with pytest.raises(IndexMismatchError, match="index row is not its entry"):
        open_index(library, FakeEmbedder())
    with pytest.raises(IndexMismatchError):
        VectorIndex.load(library.path, library.index, FakeEmbedder.dim)


def test_an_engine_on_swapped_ids_routes_nothing_and_says_why(lib, fake, caplog):
    swap_index_ids(lib)
    with caplog.at_level(logging.WARNING):
        engine = fake(lib, guards=False)
    assert "cannot route until it is rebuilt" in caplog.text and "index row is not its entry" in caplog.text
    with pytest.raises(IndexMismatchError):
        engine.ask("What is 17 times 23?")  # before: gcd-84-126 at score 1.000
    assert engine.ask("What is 17 times 23?", mode="plain").route == "plain"


def test_a_row_embedded_from_another_problem_than_its_entry_is_refused(lib):
    data = manifest(lib)
    data["index"]["problems"]["mul-17x23"] = "What is 18 times 23?"
    write_manifest(lib, data)
    with pytest.raises(IndexMismatchError, match="mul-17x23"):
        open_index(Library.open(lib), FakeEmbedder())


def test_entry_records_swapped_between_their_ids_are_refused(lib):
    data = manifest(lib)
    entries = data["entries"]
    entries["mul-17x23"], entries["gcd-84-126"] = entries["gcd-84-126"], entries["mul-17x23"]
    write_manifest(lib, data)
    with pytest.raises(LibraryError, match="gcd-84-126"):
        Library.open(lib)


def test_a_library_indexed_before_the_digest_still_routes_with_a_warning(lib, fake, caplog):
    data = manifest(lib)
    data["index"].pop("rows_sha256", None)
    write_manifest(lib, data)
    with caplog.at_level(logging.WARNING):
        index = open_index(Library.open(lib), FakeEmbedder())
    assert "no digest" in caplog.text and "kvgraft build" in caplog.text
    assert index.search(FakeEmbedder().encode([ENTRIES[0].problem])[0], 1)[0].entry_id == ENTRIES[0].id
    build_library(lib, ENTRIES, engine=fake())  # what the warning says to run records the digest
    assert "rows_sha256" in manifest(lib)["index"]


def test_a_build_rebuilds_a_swapped_index(lib, fake):
    swap_index_ids(lib)
    build_library(lib, ENTRIES, engine=fake())
    index = open_index(Library.open(lib), FakeEmbedder())
    assert index.search(FakeEmbedder().encode([ENTRIES[0].problem])[0], 1)[0].entry_id == ENTRIES[0].id


# -- finding 2: storage errors are one clean line ---------------------------------------------------------


@pytest.fixture
def dead_bucket(monkeypatch):
    """``s3://`` pointed at a localhost port nothing listens on, with one attempt per request."""
    s3fs = pytest.importorskip("s3fs")
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}", "AWS_ACCESS_KEY_ID": "test",
           "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1", "AWS_MAX_ATTEMPTS": "1"}  # fmt: skip
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    s3fs.S3FileSystem.clear_instance_cache()  # a cached filesystem would keep another endpoint
    yield "s3://kvgraft-unreachable/lib"
    s3fs.S3FileSystem.clear_instance_cache()  # nor may later tests get this one


def test_an_unreachable_bucket_is_a_library_error(dead_bucket, tmp_path):
    with pytest.raises(LibraryError, match="kvgraft-unreachable") as caught:
        Library.open(dead_bucket, cache_dir=tmp_path)
    assert "\n" not in str(caught.value) and caught.value.__cause__ is not None


def test_an_unreachable_bucket_is_one_clean_line_on_the_command_line(dead_bucket, tmp_path, monkeypatch):
    import kvgraft_plugin.engine.engine as engine_module

    def no_model(*args, **kwargs):
        raise AssertionError("the model must not load")

    monkeypatch.setattr(engine_module, "_load_backend", no_model)
    for args in (["info"], ["ask", "What is 17 times 23?"]):
        result = CliRunner().invoke(main, [*args, "--library", dead_bucket, "--cache-dir", str(tmp_path)])
        assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error:") and "kvgraft-unreachable" in lines[0], lines


class BrokenFileSystem:
    """Any call fails as a network error that is no OSError does (botocore's EndpointConnectionError)."""

    class Unreachable(Exception):
        pass

    def __getattr__(self, name):
        def call(*args, **kwargs):
            raise self.Unreachable("Could not connect to the endpoint URL:\n  http://127.0.0.1:1/")

        return call


def test_a_network_error_fetching_a_state_is_an_os_error_the_engine_falls_back_on(lib, tmp_path):
    from kvgraft_plugin.library.store import UrlStore

    remote = UrlStore("memory://kvgraft-broken/lib", cache_dir=tmp_path)
    remote.fs = BrokenFileSystem()
    for call in (lambda: remote.ensure("states/x.kvg"), lambda: remote.exists("x"), lambda: remote.pull()):
        with pytest.raises(LibraryError, match="memory://kvgraft-broken/lib") as caught:
            call()
        assert isinstance(caught.value, OSError) and "\n" not in str(caught.value)


@pytest.fixture
def memory_library(lib):
    """``lib`` copied to fsspec's in-memory filesystem; yields its URL."""
    import fsspec

    fs = fsspec.filesystem("memory")
    root = f"/kvgraft-{uuid.uuid4().hex[:8]}/lib"
    for path in lib.rglob("*"):
        if path.is_file() and path.name != ".lock":
            fs.pipe_file(f"{root}/{path.relative_to(lib)}", path.read_bytes())
    yield f"memory://{root}"
    fs.rm(root.rsplit("/", 1)[0], recursive=True)


def test_a_missing_index_object_says_what_is_missing_and_what_to_do(memory_library, lib, tmp_path, caplog):
    import fsspec

    name = manifest(lib)["index"]["file"]
    fsspec.filesystem("memory").rm_file(f"{memory_library.removeprefix('memory://')}/{name}")
    with caplog.at_level(logging.WARNING):
        library = Library.open(memory_library, cache_dir=tmp_path)  # plain decoding still works
    with pytest.raises(LibraryError) as caught:
        open_index(library, FakeEmbedder())
    message = str(caught.value)
    assert name in message and memory_library in message and "missing" in message and "kvgraft build" in message


# -- finding 6: symlinks and special files, display-spoofing ids, renamed ids -----------------------------


def first_record(lib: Path):
    library = Library.open(lib)
    return library, library.get(ENTRIES[0].id)


def test_a_states_folder_that_is_a_symlink_is_refused_unread(lib, tmp_path):
    library, record = first_record(lib)
    states = lib / Path(record.state_file).parent
    outside = tmp_path / "outside-states"
    shutil.copytree(states, outside)  # valid copies: followed, they would be served
    shutil.rmtree(states)
    states.symlink_to(outside, target_is_directory=True)
    with pytest.raises(IntegrityError, match="is a symlink"):
        library.read_state(record, library.fingerprint)


def test_verify_repair_of_a_url_library_uploads_the_rebuilt_index(memory_library, lib, fake, tmp_path):
    import fsspec

    from kvgraft_plugin.curation.verify import verify_library

    fs, remote = fsspec.filesystem("memory"), memory_library.removeprefix("memory://")
    name = manifest(lib)["index"]["file"]
    fs.pipe_file(f"{remote}/{name}", b"not an index")  # damaged where the library lives
    rows = verify_library(fake(memory_library, cache_dir=tmp_path / "fetched"), repair=True)
    assert rows[-1].id == "(index)" and rows[-1].repaired, rows[-1]
    again = verify_library(fake(memory_library, cache_dir=tmp_path / "fresh"))  # a fresh download
    assert again[-1].ok, again[-1]


def test_a_state_file_symlinked_outside_the_library_is_refused_unread(lib, tmp_path):
    library, record = first_record(lib)
    state = lib / record.state_file
    outside = tmp_path / "outside.kvg"
    shutil.copyfile(state, outside)  # a valid copy: followed, it would be served
    state.unlink()
    state.symlink_to(outside)
    with pytest.raises(IntegrityError, match="symlink"):
        library.read_state(record, library.fingerprint)
    with pytest.raises(IntegrityError, match="symlink"):
        read_file(state)
    assert not library.has_state(record)  # so a build writes a file of its own over the link


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
def test_a_state_file_that_is_not_a_regular_file_is_refused_before_it_is_opened(lib):
    _, record = first_record(lib)
    state = lib / record.state_file
    state.unlink()
    os.mkfifo(state)
    outcome: list[BaseException | bytearray] = []
    reader = threading.Thread(target=lambda: outcome.append(_capture(read_file, state)), daemon=True)
    reader.start()
    reader.join(timeout=5)
    if reader.is_alive():  # blocked opening the FIFO: release it
        os.close(os.open(state, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(timeout=5)
        pytest.fail("read_file opened a FIFO and blocked")
    assert isinstance(outcome[0], IntegrityError) and "regular file" in str(outcome[0])


def _capture(func, *args):
    try:
        return func(*args)
    except BaseException as exc:  # noqa: BLE001 - handed to the test thread
        return exc


def test_a_symlink_in_a_remote_mirror_is_replaced_by_the_fetched_file(memory_library, lib, tmp_path):
    library = Library.open(memory_library, cache_dir=tmp_path)
    record = library.get(ENTRIES[0].id)
    local = library.path / record.state_file
    local.parent.mkdir(parents=True, exist_ok=True)
    outside = tmp_path / "outside.kvg"
    outside.write_bytes(b"outside")
    local.symlink_to(outside)
    library.store.ensure(record.state_file)
    assert not local.is_symlink() and local.read_bytes() == (lib / record.state_file).read_bytes()
    assert outside.read_bytes() == b"outside"


def test_an_id_renamed_in_the_manifest_without_a_rebuild_is_named_at_open(lib, caplog):
    data = manifest(lib)
    record = data["entries"].pop("mul-17x23")
    record["entry"]["id"] = "mul-renamed"
    data["entries"]["mul-renamed"] = record
    write_manifest(lib, data)
    with caplog.at_level(logging.WARNING):
        Library.open(lib)
    assert "mul-renamed" in caplog.text and "mul-17x23" in caplog.text and "rebuild" in caplog.text
