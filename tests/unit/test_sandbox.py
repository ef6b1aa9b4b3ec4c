"""A source's ``tests`` run contained (`run_tests`): real subprocesses, no model.

Each hostile test must fail with its reason, leave nothing outside its folder and nothing running. The
kernel layers (Landlock, seccomp) are also checked without the audit hook where this kernel has them."""

from __future__ import annotations

import logging
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unicodedata
import uuid

import pytest

from kvgraft_plugin.core.exceptions import SourceError
from kvgraft_plugin.curation.answer_checks import entry_problems
from kvgraft_plugin.curation.sandbox import (
    TEST_DISK,
    TEST_ENTRIES,
    _failure,
    _kill_group,
    _run_contained,
    _wait_unreaped,
    run_tests,
)
from kvgraft_plugin.library.template import Entry

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="the sandbox is POSIX")


@pytest.fixture
def marker() -> str:
    """A string unique to one test, to find (with ``pgrep -f``) any process it left running."""
    return f"kvgraft-marker-{uuid.uuid4().hex}"


def running(marker: str) -> list[str]:
    if shutil.which("pgrep") is None:
        pytest.skip("needs pgrep")
    found = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True).stdout
    return [line for line in found.splitlines() if "pgrep" not in line]


@pytest.fixture
def outside(tmp_path):
    """A path outside the tests' folder that they must not create."""
    path = tmp_path / "escaped"
    yield path
    assert not path.exists(), f"the tests wrote {path}"


def test_a_plain_test_passes_and_a_failing_assert_fails_with_its_message():
    assert run_tests("def f(x):\n    return 2 * x\nassert f(2) == 4\n") is None
    assert run_tests("assert 1 == 2, 'one is not two'") == "AssertionError: one is not two"


def test_writing_outside_the_folder_fails_with_the_path_and_writes_nothing(outside):
    assert (
        run_tests(f"open({str(outside)!r}, 'w').write('x')") == f"tests tried to write {outside} outside their folder"
    )
    # caught by the tests or not, the refused write still ends them
    caught = f"try:\n    open({str(outside)!r}, 'a')\nexcept OSError:\n    pass\n"
    assert "tests tried to write" in run_tests(caught)
    assert "outside their folder" in run_tests(f"import os\nos.open({str(outside)!r}, os.O_WRONLY | os.O_CREAT)")
    assert "refuses" in run_tests("open('../../escaped', 'w')")  # another thread may move the working folder


@pytest.mark.parametrize(
    "program",
    [
        "import os\nos.remove(VICTIM)",
        "import os\nos.rename(VICTIM, 'h')",
        "import shutil\nshutil.rmtree(os.path.dirname(VICTIM))",
        "import os\nos.chmod(VICTIM, 0o777)",
        "import os\nos.chmod(os.open(VICTIM, os.O_RDONLY), 0o777)",  # through a descriptor
        "import os\nos.truncate(VICTIM, 0)",
        "import os\nos.link(VICTIM, 'h')",
        "import os\nos.chdir(os.path.dirname(VICTIM))",
    ],
)
def test_changing_files_outside_the_folder_fails_and_changes_nothing(tmp_path, program):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    victim.chmod(0o600)
    failure = run_tests(f"import os\nVICTIM = {str(victim)!r}\n{program}")
    assert failure is not None and failure.startswith("tests tried to") and "outside their folder" in failure
    assert victim.read_text() == "keep" and victim.stat().st_mode & 0o777 == 0o600


def test_a_symlink_and_a_folder_descriptor_outside_are_refused(outside):
    assert run_tests(f"import os\nos.symlink({str(outside.parent)!r}, 'e')") == "tests tried to create a symbolic link"
    escape = f"import os\nfd = os.open({str(outside.parent)!r}, os.O_RDONLY)\nos.open('escaped', os.O_CREAT, dir_fd=fd)"
    assert run_tests(escape) == f"tests tried to open the folder {outside.parent} outside their own"


def test_work_inside_the_folder_and_reading_outside_it_are_allowed():
    program = """
import os, pathlib, shutil, tempfile, threading
pathlib.Path("a/b").mkdir(parents=True)
pathlib.Path("a/b/c.txt").write_text("x")
os.rename("a/b/c.txt", "a/c.txt")
os.chmod("a/c.txt", 0o600)
os.remove("a/c.txt")
with tempfile.TemporaryDirectory() as d:
    open(os.path.join(d, "f"), "w").write("x")
shutil.rmtree("a")
assert os.environ["HOME"] == os.getcwd() and "kvgraft-tests-" in os.getcwd()
assert open(os.__file__).read(10) and os.listdir("/")
t = threading.Thread(target=print)
t.start()
t.join()
open(os.devnull, "w").write("x")
import datetime, decimal, json, re, collections
"""
    assert run_tests(program) is None


def test_starting_a_process_fails_and_leaves_nothing_running(marker):
    popen = f"import subprocess\nsubprocess.Popen(['sh', '-c', 'sleep 60; : {marker}'], start_new_session=True)"
    assert run_tests(popen) == f"tests tried to start a process (subprocess.Popen sh -c sleep 60; : {marker})"
    fork = f"import os\nif os.fork() == 0:\n    os.execv('/bin/sh', ['sh', '-c', 'sleep 60; : {marker}'])"
    assert run_tests(fork) == "tests tried to start a process (os.fork)"
    system = f"import os\nos.system('sleep 60; : {marker}')"
    assert run_tests(system) == f"tests tried to start a process (os.system sleep 60; : {marker})"
    assert "start a process" in run_tests("import multiprocessing\nmultiprocessing.Process(target=print).start()")
    assert running(marker) == []


def test_allocating_10_gb_fails_with_memory_error():
    failure = run_tests("x = bytearray(10 * 1024**3)")
    assert failure is not None and failure.startswith("MemoryError") and "MiB" in failure


def test_a_socket_connection_fails_and_reaches_nothing():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.2)
        port = server.getsockname()[1]
        program = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)"
        failure = run_tests(program)
        assert failure is not None and failure.startswith("tests tried to use the network"), failure
        raw = f"import socket\ns = socket.socket()\ns.connect(('127.0.0.1', {port}))"
        assert run_tests(raw) == "tests tried to open a network socket"
        with pytest.raises(TimeoutError):
            server.accept()
    assert "network" in run_tests("import socket\nsocket.getaddrinfo('example.com', 80)")


def test_a_loop_forever_runs_past_the_time_limit_and_is_killed(marker):
    started = time.monotonic()
    assert run_tests(f"# {marker}\nwhile True:\n    pass", timeout=1) == "tests ran past 1 s"
    assert run_tests(f"import time\ntime.sleep(60)  # {marker}", timeout=1) == "tests ran past 1 s"
    assert time.monotonic() - started < 10
    assert running(marker) == []


@pytest.mark.parametrize(
    ("program", "reason"),
    [
        ("import ctypes", "tests tried to import ctypes"),
        ("import _imp, importlib.util\n_imp.create_dynamic(importlib.util.find_spec('_ctypes'))", "import _ctypes"),
        ("import sqlite3", "tests tried to import _sqlite3"),
        ("import gc\ngc.get_objects()", "walk the interpreter's objects"),
        ("import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))", "change their resource limits"),
        ("import os\nos.kill(os.getppid(), 0)", "tests tried to signal another process"),
        ("import os\nos.mkfifo(os.path.dirname(os.getcwd()) + '/fifo')", "tests tried to call os.mkfifo"),
        ("import sys\nsys.addaudithook(lambda *a: None)", "tests tried to add an audit hook"),
        ("import os\nopen(f'/proc/{os.getppid()}/environ').read()", "environ of another process"),
        # the same file through the root link (issue 49: the secret was echoed in the failure message)
        ("import os\nopen(f'/proc/self/root/proc/{os.getppid()}/environ').read()", "environ of another process"),
        ("import os\nopen(f'/proc/self/cwd/../../../proc/{os.getppid()}/environ').read()", "of another process"),
    ],
)
def test_escape_hatches_are_refused(program, reason):
    failure = run_tests(program)
    assert failure is not None and reason in failure, failure


def test_rebinding_builtins_or_the_standard_library_does_not_blind_the_hook(outside):
    program = f"""
import builtins, os, posixpath
builtins.isinstance = lambda *a: False
builtins.str = bytes
posixpath.normpath = lambda p: "/"
os.getcwd = lambda: "/"
open({str(outside)!r}, "w")
"""
    assert run_tests(program) == f"tests tried to write {outside} outside their folder"
    lying = f"class S(str):\n    def startswith(self, *a):\n        return True\nopen(S({str(outside)!r}), 'w')"
    assert run_tests(lying) == f"tests tried to write {outside} outside their folder"


def test_entry_problems_reports_the_contained_failure(outside):
    entry = Entry("w", "def f():\n    pass", "    return 1", tests=f"open({str(outside)!r}, 'w')")
    assert entry_problems(entry) == [f"its tests fail: tests tried to write {outside} outside their folder"]
    assert entry_problems(entry, with_tests=False) == []


def test_the_kernel_layers_hold_without_the_audit_hook(outside, marker):
    probe = _run_contained("pass", timeout=5, audit=False)
    assert probe.failure is None and "rlimits" in probe.layers and "audit" not in probe.layers
    if sys.platform.startswith("linux") and "seccomp" not in probe.layers:
        pytest.skip(f"this kernel gave only {probe.layers}")
    no_ctypes = "import sys\nassert not {'ctypes', '_ctypes'} & set(sys.modules), 'ctypes is loaded'"
    assert _run_contained(no_ctypes, timeout=5, audit=False).failure is None  # stage two never loaded it
    if "landlock" in probe.layers:
        failure = _run_contained(f"open({str(outside)!r}, 'w')", timeout=5, audit=False).failure
        assert failure is not None and "Permission denied" in failure
    if "seccomp" in probe.layers:
        for program in (
            f"import os\nos.execv('/bin/sh', ['sh', '-c', 'sleep 60; : {marker}'])",
            "import os\nos.fork()",
            f"import subprocess\nsubprocess.Popen(['sh', '-c', 'sleep 60; : {marker}'], start_new_session=True)",
            "import socket\nsocket.socket()",
            "import os\nos.kill(1, 0)",
        ):
            failure = _run_contained(program, timeout=5, audit=False).failure
            assert failure == "PermissionError: [Errno 1] Operation not permitted", (program, failure)
        threads = "import threading\nt = threading.Thread(target=print)\nt.start()\nt.join()"
        assert _run_contained(threads, timeout=5, audit=False).failure is None  # threads are not processes
    assert running(marker) == []


def test_a_lingering_grandchild_neither_delays_the_result_nor_survives(marker):
    child = subprocess.Popen(
        ["sh", "-c", f"sh -c 'sleep 60; : {marker}' & exit 0"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    started = time.monotonic()
    try:
        assert _wait_unreaped(child, 10)
        assert time.monotonic() - started < 5  # the child's exit, not the grandchild's
        assert running(marker)  # still there: the child's exit does not end it
    finally:
        _kill_group(child.pid)
        child.wait()
    time.sleep(0.2)
    assert running(marker) == []


class _Reached(Exception):
    """The fake engine was asked for its fingerprint: the build went past verification."""


class _VerifyOnlyEngine:
    """Enough of an engine for build_library's verification step, which runs before anything is built."""

    n_ctx = 4096

    def prefix_tokens(self, entry):
        return [1, 2, 3]

    def probe_tokens(self, entry):
        return [4]

    @property
    def fingerprint(self):
        raise _Reached


def test_build_runs_a_sources_tests_only_when_asked(tmp_path, outside, caplog):
    from kvgraft_plugin.curation.build import build_library

    entries = [
        Entry("hostile", "def f():\n    pass", "    return 1", tests=f"open({str(outside)!r}, 'w')"),
        Entry("plain", "What is 2 plus 2?", "2 + 2 = 4.", "4"),
    ]
    with pytest.raises(SourceError, match="its tests fail: tests tried to write"):
        build_library(tmp_path / "a", entries, engine=_VerifyOnlyEngine(), run_tests=True)
    with caplog.at_level(logging.WARNING), pytest.raises(_Reached):
        build_library(tmp_path / "b", entries, engine=_VerifyOnlyEngine())  # the default: not run
    assert "1 entries' tests were not run" in caplog.text and "hostile" in caplog.text


def test_a_secret_in_the_parents_environment_never_reaches_the_failure(monkeypatch):
    monkeypatch.setenv("QA_SECRET_TOKEN", "x-very-secret")
    program = "import os\nprint(open(f'/proc/self/root/proc/{os.getppid()}/environ').read())\nassert False"
    failure = run_tests(program)
    assert failure is not None and "x-very-secret" not in failure, failure


def test_thousands_of_nested_folders_are_cleaned_up(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    program = "import os\nfor _ in range(1200):\n    os.mkdir('d')\n    os.chdir('d')\nassert False, 'deep'"
    failure = run_tests(program)
    assert failure is not None and "deep" in failure, failure
    assert list(tmp_path.iterdir()) == []  # nothing left behind


def test_the_folder_cannot_fill_the_disk(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    program = "for i in range(64):\n    open(f'f{i}', 'wb').write(b'x' * (15 << 20))\nassert False, 'all written'"
    failure = run_tests(program)
    assert failure is not None and f"more than {TEST_DISK >> 20} MiB" in failure, failure
    assert list(tmp_path.iterdir()) == []


def _controls(text: str) -> list[str]:
    """The control and format characters in ``text`` (what a terminal could act on or hide text with)."""
    return [ch for ch in text if unicodedata.category(ch) in ("Cc", "Cf")]


@pytest.mark.parametrize(
    "program",
    [
        # a line that looks like the audit hook's, and the last line of an error, each 60 KB and with escapes
        "import sys\nsys.stderr.write('kvgraft-sandbox: \\x1b[2J\\x1b]0;t\\x07' + 'x' * 60000 + '\\n')\nsys.exit(1)",
        "raise ValueError('\\x1b[31m\\u202eevil\\u200b\\t' + 'y' * 60000)",
    ],
)
def test_what_the_tests_print_reaches_the_failure_bounded_and_without_control_characters(program):
    failure = run_tests(program)
    assert failure is not None and len(failure) <= 300 and failure.endswith("…"), (len(failure or ""), failure)
    assert _controls(failure) == [], failure
    assert "xxx" in failure or "ValueError: [31mevil yyy" in failure, failure


def test_every_piece_of_output_in_a_failure_is_bounded_and_made_printable():
    long, escaped = "z" * 60000, "\x1b[2J\x1b]0;title\x07\u202ehidden\u2066\x00"
    for lines, status in (
        ([f"kvgraft-sandbox: {long}"], 99),
        ([f"kvgraft-sandbox: {escaped}"], 99),
        ([long], 99),
        ([f"MemoryError: {long}"], 1),
        ([escaped], -int(signal.SIGXCPU)),
        ([escaped], 1),
    ):
        failure = _failure(status, lines, finished=True, timeout=10, cpu=11)
        assert failure is not None and _controls(failure) == [] and len(failure) <= 400, (lines[0][:40], failure)
        assert "z" * 301 not in failure and ("hidden" in failure or "zzz" in failure), failure
    # a line of control characters alone is no reason: the exit status is, and a refusal is never empty
    assert _failure(3, ["\x1b\x07"], finished=True, timeout=10, cpu=11) == "exit status 3"
    assert _failure(99, ["kvgraft-sandbox: \x1b"], finished=True, timeout=10, cpu=11)


@pytest.mark.parametrize("make", ["os.mkdir(f'd{i}')", "open(f'f{i}', 'w').close()"])
def test_the_folder_cannot_fill_the_disk_with_empty_folders_or_files(tmp_path, monkeypatch, make):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    program = f"import os, time\nfor i in range(20000):\n    {make}\ntime.sleep(1)\nassert False, 'all made'"
    failure = run_tests(program)
    assert failure == f"tests made more than {TEST_ENTRIES} files and folders in their folder", failure
    assert list(tmp_path.iterdir()) == []


def test_files_nested_past_the_path_length_limit_are_not_hidden_from_the_disk_cap(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    # 30 folders of 200-character names: a path past PATH_MAX, which a scan by path cannot enter
    program = (
        "import os, time\nfor _ in range(30):\n    os.mkdir('d' * 200)\n    os.chdir('d' * 200)\n"
        "for i in range(6):\n    open(f'f{i}', 'wb').write(b'x' * (15 << 20))\ntime.sleep(1)\nassert False, 'hidden'"
    )
    failure = run_tests(program)
    assert failure is not None and "cannot measure" in failure, failure
    assert list(tmp_path.iterdir()) == []
