"""Running a library source's tests, contained: a source's tests are code from whoever wrote the source.

`run_tests` runs a program in a fresh interpreter in a temporary folder, with resource limits, kernel
confinement where the platform has it (Landlock, seccomp) and a Python audit hook that names what the tests
tried; see its docstring for each layer and what it does not contain.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import select
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import unicodedata
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

__all__ = [
    "TEST_DISK",
    "TEST_ENTRIES",
    "TEST_FILE_SIZE",
    "TEST_MEMORY",
    "TEST_OPEN_FILES",
    "TEST_TIMEOUT",
    "run_tests",
]

#: Seconds a test program may run (wall clock); it gets one second more of CPU time than that, rounded up.
TEST_TIMEOUT = 10.0
#: Bytes of address space a test program may map: allocating more raises ``MemoryError``.
TEST_MEMORY = 1 << 30
#: Bytes one file written by a test program may reach.
TEST_FILE_SIZE = 16 << 20
#: Files a test program may hold open at once.
TEST_OPEN_FILES = 256
#: Bytes all the files and folders in a test program's folder may reach together (checked every `_DISK_POLL` s).
TEST_DISK = 64 << 20
#: Files and folders a test program's folder may hold together (checked with `TEST_DISK`). An empty file holds
#: no block anywhere, nor does a folder on tmpfs, so bytes alone would let a test make millions; each still costs
#: an inode and a dentry, a stat in every check and a removal at cleanup. Measured on ext4 with 2 busy cores:
#: a program makes ~33,000 folders a second; 16,384 are scanned in 34 ms and removed in 3.8 s. 4,096 keeps a
#: check well inside `_DISK_POLL` and the cleanup near a second, and is far more than an honest test makes.
TEST_ENTRIES = 1 << 12
_DISK_POLL = 0.05
#: Characters of the tests' output a failure message may quote (`_quoted`).
_QUOTED = 300


def run_tests(program: str, *, timeout: float = TEST_TIMEOUT) -> str | None:
    """Run ``program`` contained: ``None`` when it exits cleanly, else why not (the tests' refused action,
    the last line of its error, or the limit it hit).

    A source's tests are code from whoever wrote the source, so the interpreter (``python -I -S -B``: no
    environment variables, no site-packages) runs in a temporary folder that is its working directory,
    ``HOME`` and ``TMPDIR``, with a bare environment, no standard input, and in a session of its own whose
    whole process group is killed when it ends or runs past ``timeout`` seconds. Before the tests' first line:

    - resource limits: CPU seconds, `TEST_MEMORY` of address space, `TEST_FILE_SIZE` per file,
      `TEST_OPEN_FILES`, no core file, and on kernels without seccomp no new process (``RLIMIT_NPROC``;
      root is exempt);
    - on Linux, where the kernel has them: Landlock (writes only in the folder and ``/dev/null``, no TCP, no
      signal out of the sandbox) and a seccomp filter (no exec, fork, socket, ptrace, io_uring, mount,
      module loading, clock setting, signals to other processes);
    - a Python audit hook that ends the tests at once, with the reason, when they write, remove, rename,
      link or lock a file outside the folder, start a process, touch the network, load C code (ctypes,
      sqlite3, ...), signal another process, change their limits or walk the interpreter's objects.
      Reading files stays allowed, but for another process's ``/proc/PID`` (its environment, its memory).

    The kernel layers are set by a first interpreter through ctypes, which then execs a fresh one for the
    tests, so that ctypes is never loaded where the tests run. The audit hook is what names the reason; it
    is not a boundary against code that corrupts the interpreter's memory, which the kernel layers still
    confine where they are in force.
    """
    return _run_contained(program, timeout=timeout).failure


@dataclass(frozen=True)
class _Contained:
    """How a contained run ended: its failure (``None``: passed) and the layers that were in force."""

    failure: str | None
    layers: tuple[str, ...]


#: The line the audit hook writes to standard error before it ends the tests.
_REFUSED = "kvgraft-sandbox: "
#: The line the child writes first: which layers are in force.
_LAYERS = "kvgraft-sandbox-layers: "
#: The exit status of tests the audit hook ended.
_REFUSED_STATUS = 99
#: The only variables of the user's environment a test program sees: what an interpreter may need to start.
_PASSED_ENV = ("LD_LIBRARY_PATH", "DYLD_LIBRARY_PATH", "TZ")


def _run_contained(program: str, *, timeout: float, audit: bool = True) -> _Contained:
    """`run_tests`, with the layers reported; ``audit=False`` leaves the audit hook out (to test the rest)."""
    base = Path(tempfile.mkdtemp(prefix="kvgraft-tests-")).resolve()
    try:
        work = base / "work"
        work.mkdir()
        script, sandbox = base / "tests.py", base / "sandbox.py"  # outside the folder: the tests cannot edit them
        script.write_text(program, encoding="utf-8")
        sandbox.write_text(_CHILD, encoding="utf-8")
        cpu = math.ceil(timeout) + 1
        limits = [cpu, TEST_MEMORY, TEST_FILE_SIZE, TEST_OPEN_FILES]
        argv = [sys.executable, "-I", "-S", "-B", str(sandbox), "confine", str(work), str(script), *map(str, limits)]
        env = {"HOME": str(work), "TMPDIR": str(work), "PATH": os.defpath, "LANG": "C.UTF-8"}
        env |= {k: os.environ[k] for k in _PASSED_ENV if k in os.environ}  # never the user's tokens or keys
        with open(base / "stderr", "w+b") as err:
            child = subprocess.Popen(
                [*argv, "1" if audit else "0"],
                cwd=work,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
            )
            watch = _DiskWatch(work, child.pid)
            try:
                finished = _wait_unreaped(child, timeout)
            finally:
                watch.stop()
                _kill_group(child.pid)  # before reaping: the zombie keeps the group's id from being reused
                status = child.wait()
            err.seek(0)
            head = err.readline(4096).decode("utf-8", "replace")
            err.seek(max(0, err.seek(0, os.SEEK_END) - 65536))
            text = err.read().decode("utf-8", "replace")
    finally:
        _remove_tree(base)
    layers = tuple(head[len(_LAYERS) :].split()) if head.startswith(_LAYERS) else ()
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith(_LAYERS)]
    if watch.over is not None:
        return _Contained(watch.over, layers)
    return _Contained(_failure(status, lines, finished=finished, timeout=timeout, cpu=cpu), layers)


class _DiskWatch:
    """Kills the process group ``pid`` once the tree under ``folder`` is past a cap (`_tree_over`:
    `RLIMIT_FSIZE` bounds one file only), checking every `_DISK_POLL` s on a thread of its own; ``over`` is
    then the reason."""

    def __init__(self, folder: Path, pid: int) -> None:
        self.folder, self.pid = folder, pid
        self.over: str | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvgraft-sandbox-disk", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(_DISK_POLL):
            over = _tree_over(self.folder)
            if over is not None:
                self.over = over
                _kill_group(self.pid)
                return

    def stop(self) -> None:
        """Stop watching (and wait for the last check)."""
        self._done.set()
        self._thread.join()


def _tree_over(folder: Path) -> str | None:
    """Why the tree under ``folder`` is past a cap, else ``None``: the blocks of its files and folders reach
    `TEST_DISK`, it holds more than `TEST_ENTRIES` entries, or a folder in it cannot be scanned (nested past
    the path length limit, or made unreadable), so that what it holds could not be counted. Links are not
    followed; no recursion; the scan stops at the first cap reached."""
    total, entries, stack = 0, 0, [str(folder)]
    while stack:
        try:
            with os.scandir(stack.pop()) as scan:
                for entry in scan:
                    entries += 1
                    if entries > TEST_ENTRIES:
                        return f"tests made more than {TEST_ENTRIES} files and folders in their folder"
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
                        total += entry.stat(follow_symlinks=False).st_blocks * 512
                    except OSError:
                        continue  # removed since it was listed
                    if total >= TEST_DISK:
                        return f"tests wrote more than {TEST_DISK >> 20} MiB in their folder"
        except OSError as exc:
            if exc.errno in (errno.ENAMETOOLONG, errno.EACCES, errno.EPERM):
                return "tests made a folder the sandbox cannot measure (nested too deep, or unreadable)"
            continue  # removed or replaced since it was listed
    return None


def _remove_tree(folder: Path) -> None:
    """Delete ``folder`` and everything in it, links not followed. A test may nest folders thousands deep, past
    any path length or recursion limit, so each folder is first moved up to ``folder`` itself (a rename through
    folder descriptors) and emptied there: no deep path, no recursion, two descriptors open at most. What
    cannot be removed is logged, never raised."""
    try:
        root = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        logger.warning("sandbox cleanup: %s", exc)
        return
    try:
        pending, moved = os.listdir(root), 0
        while pending:
            name = pending.pop()
            try:
                if not stat.S_ISDIR(os.stat(name, dir_fd=root, follow_symlinks=False).st_mode):
                    os.unlink(name, dir_fd=root)
                    continue
                os.chmod(name, 0o700, dir_fd=root)  # a folder the tests made unreadable
                fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=root)
                try:
                    with os.scandir(fd) as scan:
                        entries = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in scan]
                    for inner, is_folder in entries:
                        if not is_folder:
                            os.unlink(inner, dir_fd=fd)
                            continue
                        moved += 1
                        while os.path.lexists(f"/proc/self/fd/{root}/.kvgraft-moved-{moved}"):
                            moved += 1
                        os.rename(inner, f".kvgraft-moved-{moved}", src_dir_fd=fd, dst_dir_fd=root)
                        pending.append(f".kvgraft-moved-{moved}")
                finally:
                    os.close(fd)
                os.rmdir(name, dir_fd=root)
            except OSError as exc:
                logger.warning("sandbox cleanup: %s", exc)
    finally:
        os.close(root)
    try:
        os.rmdir(folder)
    except OSError as exc:
        logger.warning("sandbox cleanup: %s", exc)


def _quoted(text: str) -> str:
    """The tests' ``text`` as a message may quote it: whitespace made spaces, every other control or format
    character (escape sequences, bidi overrides, zero-width ones) dropped, at most `_QUOTED` characters."""
    shown = "".join(
        " " if ch.isspace() else ch for ch in text if ch.isspace() or unicodedata.category(ch) not in ("Cc", "Cf")
    ).strip()
    return shown if len(shown) <= _QUOTED else shown[: _QUOTED - 1] + "…"


def _failure(status: int, lines: list[str], *, finished: bool, timeout: float, cpu: int) -> str | None:
    """Why the tests failed (``None``: they passed), from their exit ``status`` and standard error ``lines``:
    every piece of those lines in it is `_quoted`, since the tests write them."""
    refused = [line[len(_REFUSED) :] for line in lines if line.startswith(_REFUSED)]
    if refused:  # the tests can write such a line too: quoted like the rest
        return _quoted(refused[0]) or "tests did something the sandbox refuses"
    if not finished:
        return f"tests ran past {timeout:g} s"
    if status == 0:
        return None
    last = next((quoted for quoted in map(_quoted, reversed(lines)) if quoted), "")
    if status == _REFUSED_STATUS:
        return last or "tests did something the sandbox refuses"
    if status < 0:
        reasons: dict[int, str] = {
            signal.SIGXCPU: f"tests used more than {cpu} s of CPU",
            signal.SIGXFSZ: f"tests wrote a file past {TEST_FILE_SIZE >> 20} MiB",
        }
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = f"signal {-status}"
        return reasons.get(-status, f"tests were killed by {name}") + (f" ({last})" if last else "")
    if last.startswith("MemoryError"):
        return f"{last} (tests may map {TEST_MEMORY >> 20} MiB)"
    return last or f"exit status {status}"


def _wait_unreaped(child: subprocess.Popen[bytes], timeout: float) -> bool:
    """Whether ``child`` exits within ``timeout`` s, left unreaped (a zombie) where the platform allows."""
    pid = child.pid
    if hasattr(os, "pidfd_open"):
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            pass
        else:
            try:
                poll = select.poll()
                poll.register(fd, select.POLLIN)
                return bool(poll.poll(max(0, math.ceil(timeout * 1000))))
            finally:
                os.close(fd)
    if not hasattr(os, "waitid"):
        try:
            child.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True
    deadline, delay = time.monotonic() + timeout, 0.001
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None:
                return True
        except ChildProcessError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(delay)
        delay = min(2 * delay, 0.02)


def _kill_group(pid: int) -> None:
    """SIGKILL every process left in the session's group: the tests' and whatever they started."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


#: The child program (``sandbox.py confine FOLDER TESTS CPU_S ADDRESS_SPACE FILE_SIZE OPEN_FILES AUDIT``): stage
#: one limits and confines the process, stage two (``run``, exec'd fresh) installs the audit hook and runs the
#: tests. The audit hook takes every name it uses as a default argument, so the tests cannot rebind it.
_CHILD = r'''
import sys


def _kvgraft_confine(root, script, cpu, memory, fsize, nofile, audit):
    """Stage one: resource limits, then on Linux Landlock and seccomp (set through ctypes), then exec stage
    two, a fresh interpreter that never loaded ctypes. Elsewhere stage two runs in this process."""
    import os
    import resource

    cpu, memory, fsize, nofile = int(cpu), int(memory), int(fsize), int(nofile)
    limits = [(resource.RLIMIT_CPU, cpu, cpu + 1), (resource.RLIMIT_AS, memory, memory)]
    limits += [(resource.RLIMIT_FSIZE, fsize, fsize), (resource.RLIMIT_NOFILE, nofile, nofile)]
    limits += [(resource.RLIMIT_CORE, 0, 0)]
    for kind, soft, hard in limits:
        try:
            resource.setrlimit(kind, (soft, hard))
        except (ValueError, OSError):
            pass
    layers, execve = [], None
    if sys.platform.startswith("linux"):
        try:
            layers, execve = _kvgraft_kernel(root)
        except Exception:  # no ctypes, an old kernel: the rlimits and the audit hook still stand
            pass
    if "seccomp" not in layers and hasattr(resource, "RLIMIT_NPROC"):
        try:
            resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))  # no new process or thread (root is exempt)
        except (ValueError, OSError):
            pass
    layers = ["rlimits", *layers]
    if "ctypes" not in sys.modules:
        return _kvgraft_run(root, script, audit, layers)
    argv = [sys.executable, "-I", "-S", "-B", __file__, "run", root, script, audit, *layers]
    if execve is not None:
        execve(argv)  # the one exec the seccomp filter lets through; it returns only when it failed
        os.write(2, b"kvgraft-sandbox: the sandbox could not start the tests\n")
        os._exit(99)
    os.execv(sys.executable, argv)


def _kvgraft_run(root, script, audit, layers):
    """Stage two: the audit hook, then the tests' code and the globals to run it in."""
    import builtins
    import os
    import types

    with open(script, encoding="utf-8") as f:
        code = compile(f.read(), "<tests>", "exec")
    layers = list(layers)
    if audit == "1":
        _kvgraft_audit(root)
        layers.append("audit")
    os.write(2, ("kvgraft-sandbox-layers: " + " ".join(layers) + "\n").encode())
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    sys.argv = ["<tests>"]
    return code, main.__dict__


def _kvgraft_kernel(root):
    """Landlock (writes only under ``root``, no TCP, no signal out) and seccomp (no exec, fork or socket):
    the layers set, and a function that makes the one exec the filter allows (None without the filter)."""
    import ctypes
    import os
    import struct

    libc = ctypes.CDLL(None, use_errno=True)
    syscall, prctl, n = libc.syscall, libc.prctl, ctypes.c_long
    syscall.restype = prctl.restype = ctypes.c_long
    if prctl(n(38), n(1), n(0), n(0), n(0)) != 0:  # PR_SET_NO_NEW_PRIVS, which both need
        return [], None
    layers = []
    abi = syscall(n(444), None, n(0), n(1))  # landlock_create_ruleset(NULL, 0, VERSION)
    if abi >= 1:
        fs = 0x1FF2 | (0x2000 if abi >= 2 else 0) | (0x4000 if abi >= 3 else 0) | (0x8000 if abi >= 5 else 0)
        net, scoped = (0x3 if abi >= 4 else 0), (0x3 if abi >= 6 else 0)
        size = 8 if abi < 4 else 16 if abi < 6 else 24
        attr = ctypes.create_string_buffer(struct.pack("=QQQ", fs, net, scoped), 24)
        ruleset = syscall(n(444), attr, n(size), n(0))
        if ruleset >= 0:
            ok = True
            for path, allowed in ((root, fs), ("/dev/null", fs & 0x4002)):  # WRITE_FILE, TRUNCATE
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                rule = ctypes.create_string_buffer(struct.pack("=Qi", allowed, fd), 12)
                ok = ok and syscall(n(445), n(ruleset), n(1), rule, n(0)) == 0  # LANDLOCK_RULE_PATH_BENEATH
                os.close(fd)
            if ok and syscall(n(446), n(ruleset), n(0)) == 0:
                layers.append("landlock")
            os.close(ruleset)
    machine = os.uname().machine
    if machine not in ("x86_64", "aarch64") or sys.byteorder != "little" or ctypes.sizeof(ctypes.c_void_p) != 8:
        return layers, None
    x86 = machine == "x86_64"
    # execveat fork vfork socket ptrace process_vm_readv/writev io_uring_* pidfd_open pidfd_send_signal
    # pidfd_getfd mknod mknodat mount umount2 pivot_root chroot unshare setns init/finit/delete_module kexec_*
    # reboot bpf perf_event_open userfaultfd open_by_handle_at keyctl add_key request_key swapon swapoff
    # new mount API, mount_setattr, tkill, clock_settime settimeofday clock_adjtime adjtimex sethostname
    # setdomainname acct process_madvise vhangup syslog quotactl (iopl ioperm on x86)
    if x86:
        deny = [322, 57, 58, 41, 101, 310, 311, 425, 426, 427, 434, 424, 438, 133, 259, 165, 166, 155, 161]
        deny += [272, 308, 175, 313, 176, 246, 320, 169, 321, 298, 323, 304, 250, 248, 249, 167, 168, 428, 429]
        deny += [430, 431, 432, 433, 442, 200, 227, 164, 305, 159, 170, 171, 163, 440, 153, 103, 179, 172, 173]
        execve, clone, own_pid, own_which = 59, 56, [62, 234, 203, 142, 144], 141
    else:
        deny = [281, 198, 117, 270, 271, 425, 426, 427, 434, 424, 438, 33, 40, 39, 41, 51, 97, 268, 105]
        deny += [273, 106, 104, 294, 142, 280, 241, 282, 265, 219, 217, 218, 224, 225, 428, 429, 430, 431, 432]
        deny += [433, 442, 130, 112, 170, 266, 171, 161, 162, 89, 440, 58, 116, 60]
        execve, clone, own_pid, own_which = 221, 220, [129, 131, 122, 118, 119], 140
    pid = os.getpid()
    program = ctypes.create_string_buffer(os.fsencode(sys.executable))  # the filename of the allowed exec
    address = ctypes.addressof(program)
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    prog = [(ld, 0, 0, 4), (jeq, 0, "deny", 0xC000003E if x86 else 0xC00000B7), (ld, 0, 0, 0)]
    if x86:
        prog.append((jge, "deny", 0, 0x40000000))  # the x32 ABI
    prog += [(jeq, "deny", 0, nr) for nr in deny]
    prog += [(jeq, "nosys", 0, 435), (jeq, "clone", 0, clone), (jeq, "which", 0, own_which)]
    prog.append((jeq, "execve", 0, execve))
    prog += [(jeq, "self", 0, nr) for nr in own_pid]
    prog.append((ret, 0, 0, 0x7FFF0000))  # SECCOMP_RET_ALLOW the rest
    labels = {"clone": len(prog)}
    prog += [(ld, 0, 0, 16), (jset, "allow", "deny", 0x10000)]  # a thread (CLONE_THREAD), never a process
    labels["which"] = len(prog)
    prog += [(ld, 0, 0, 16), (jeq, 0, "deny", 0), (ld, 0, 0, 24), (jeq, "allow", 0, 0), (jeq, "allow", "deny", pid)]
    labels["execve"] = len(prog)  # only with this process's own buffer as the filename: stage two's exec
    prog += [(ld, 0, 0, 16), (jeq, 0, "deny", address & 0xFFFFFFFF), (ld, 0, 0, 20)]
    prog.append((jeq, "allow", "deny", address >> 32))
    labels["self"] = len(prog)
    prog += [(ld, 0, 0, 16), (jeq, "allow", 0, 0), (jeq, "allow", "deny", pid)]  # this process, or its group
    labels["allow"] = len(prog)  # classic BPF jumps only forward: the blocks above land here
    prog.append((ret, 0, 0, 0x7FFF0000))
    labels["deny"] = len(prog)
    prog.append((ret, 0, 0, 0x00050001))  # SECCOMP_RET_ERRNO | EPERM
    labels["nosys"] = len(prog)
    prog.append((ret, 0, 0, 0x00050026))  # ENOSYS: the C library falls back to clone
    code = b"".join(
        struct.pack("=HBBI", op, *(labels[j] - i - 1 if isinstance(j, str) else j for j in (jt, jf)), k & 0xFFFFFFFF)
        for i, (op, jt, jf, k) in enumerate(prog)
    )
    buf = ctypes.create_string_buffer(code, len(code))

    class _Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = _Prog(len(prog), ctypes.addressof(buf))
    if prctl(n(22), n(2), ctypes.byref(fprog), n(0), n(0)) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        return layers, None
    layers.append("seccomp")

    def exec_stage_two(argv, _program=program):
        args = (ctypes.c_char_p * (len(argv) + 1))(*map(os.fsencode, argv), None)
        env = [os.fsencode(k) + b"=" + os.fsencode(v) for k, v in os.environ.items()]
        libc.execve(_program, args, (ctypes.c_char_p * (len(env) + 1))(*env, None))

    return layers, exec_stage_two


def _kvgraft_audit(root):
    """Install the audit hook: it refuses, and ends the tests at once, whatever leaves ``root``."""
    import _posixsubprocess
    import os
    import posix
    import signal
    import time
    import types

    prefix = root + "/"

    def refuse(message, _write=os.write, _exit=os._exit, _bytes=bytes):
        try:
            _write(2, _bytes("\nkvgraft-sandbox: " + message.replace("\n", " ") + "\n", "utf-8", "replace"))
        finally:
            _exit(99)

    def stub(name, _refuse=refuse):
        def refused(*args, _refuse=_refuse, _name=name, **kwargs):
            _refuse("tests tried to call " + _name)

        return refused

    for module, names in (
        ((os, posix), ("mkfifo", "mknod", "pidfd_open", "chroot", "setpriority", "sched_setaffinity")),
        ((os, posix), ("sched_setparam", "sched_setscheduler", "unshare", "setns")),
        ((signal, sys.modules["_signal"]), ("pidfd_send_signal",)),
        ((time,), ("clock_settime", "clock_settime_ns")),
        ((_posixsubprocess,), ("fork_exec",)),
    ):
        for m in module:
            for attr in names:
                if hasattr(m, attr):
                    setattr(m, attr, stub(module[0].__name__ + "." + attr))

    def resolve(
        path,
        dir_fd,
        _isinstance=isinstance,
        _int=int,
        _str=str,
        _bytes=bytes,
        _join="".join,
        _bjoin=b"".join,
        _decode=bytes.decode,
        _enc=sys.getfilesystemencoding(),
        _getcwd=os.getcwd,
        _readlink=os.readlink,
        _OSError=OSError,
        _root=root,
    ):
        """The absolute, normalised path an event's path names (an fd: the file it is open on); None when it
        cannot be told: not a path, or relative with ``..`` (another thread may move the working directory)."""
        if _isinstance(path, _int):
            try:
                path = _readlink("/proc/self/fd/%d" % _int.__int__(path))
            except _OSError:
                return None
            return path if path.startswith("/") else _root  # a pipe or socket: no place in the file system
        if _isinstance(path, _bytes):
            path = _decode(_bjoin((path,)), _enc, "surrogateescape")
        elif _isinstance(path, _str):
            path = _join((path,))
        else:
            return None
        parts = path.split("/")
        if not path.startswith("/"):
            if ".." in parts:
                return None
            if _isinstance(dir_fd, _int) and _int.__int__(dir_fd) >= 0:
                try:
                    base = _readlink("/proc/self/fd/%d" % _int.__int__(dir_fd))
                except _OSError:
                    return None
            else:
                base = _getcwd()
            parts = base.split("/") + parts
        kept = []
        for part in parts:
            if part == "..":
                if kept:
                    kept.pop()
            elif part and part != ".":
                kept.append(part)
        return "/" + "/".join(kept)

    def inside(path, _root=root, _prefix=prefix, _str=str, _isinstance=isinstance):
        return _isinstance(path, _str) and (path == _root or path.startswith(_prefix) or path == "/dev/null")

    def shown(arg, _type=type, _str=str, _bytes=bytes, _int=int, _list=list, _tuple=tuple, _join=" ".join):
        """A short text for an event argument that never runs the tests' code: exact types only."""
        if _type(arg) is _bytes:
            arg = _bytes.decode(arg, "utf-8", "replace")
        if _type(arg) is _list or _type(arg) is _tuple:
            arg = _join([a if _type(a) is _str else "%d" % a if _type(a) is _int else "?" for a in arg])
        return arg[:120] if _type(arg) is _str else "?"

    def outside(verb, target, arg, _shown=shown):
        if target is None:
            return "tests tried to %s %s: the sandbox refuses a path object or a relative path with '..'" % (
                verb,
                _shown(arg),
            )
        return "tests tried to %s %s outside their folder" % (verb, target)

    paths = types.MappingProxyType(
        {
            "os.chmod": ("change the mode of", ((0, 2),)),
            "os.chown": ("change the owner of", ((0, 3),)),
            "os.utime": ("change the times of", ((0, 3),)),
            "os.truncate": ("truncate", ((0, None),)),
            "os.setxattr": ("change the attributes of", ((0, None),)),
            "os.removexattr": ("change the attributes of", ((0, None),)),
            "os.mkdir": ("create the folder", ((0, 2),)),
            "os.rmdir": ("remove the folder", ((0, 1),)),
            "os.remove": ("remove", ((0, 1),)),
            "os.rename": ("rename", ((0, 2), (1, 3))),
            "os.link": ("link", ((0, 2), (1, 3))),
            "os.chdir": ("enter", ((0, None),)),
            "os.lockf": ("lock", ((0, None),)),
            "fcntl.fcntl": ("lock", ((0, None),)),
            "fcntl.flock": ("lock", ((0, None),)),
            "fcntl.lockf": ("lock", ((0, None),)),
            "shutil.rmtree": ("remove", ((0, 1),)),
            "shutil.copyfile": ("copy to", ((1, None),)),
            "shutil.copymode": ("copy to", ((1, None),)),
            "shutil.copystat": ("copy to", ((1, None),)),
            "shutil.copytree": ("copy to", ((1, None),)),
            "shutil.move": ("move", ((0, None), (1, None))),
            "shutil.chown": ("change the owner of", ((0, None),)),
            "shutil.make_archive": ("write", ((0, None),)),
            "shutil.unpack_archive": ("unpack into", ((1, None),)),
        }
    )
    spawn = frozenset(
        ["os.system", "os.exec", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "subprocess.Popen"]
        + ["pty.spawn", "os.startfile"]
    )
    network = frozenset(
        ["socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo"]
        + ["socket.gethostbyname", "socket.gethostbyaddr", "socket.getnameinfo", "socket.sethostname"]
        + ["syslog.openlog", "syslog.syslog"]
    )
    other = types.MappingProxyType(
        {
            "gc.get_objects": "walk the interpreter's objects",
            "gc.get_referrers": "walk the interpreter's objects",
            "gc.get_referents": "walk the interpreter's objects",
            "cpython.PyInterpreterState_New": "start a subinterpreter",
            "resource.setrlimit": "change their resource limits",
            "resource.prlimit": "change their resource limits",
            "fcntl.ioctl": "call ioctl",
            "os.killpg": "signal a process group",
            "os.symlink": "create a symbolic link",
            "sys.addaudithook": "add an audit hook",
        }
    )
    loaded = frozenset(["posix", "os", "_signal", "signal", "time", "_posixsubprocess"])
    unsafe = frozenset(
        ["_cffi_backend", "_sqlite3", "_dbm", "_gdbm", "readline", "_multiprocessing", "_posixshmem", "_tkinter"]
    )
    watched = frozenset(["open", "import", "socket.__new__", "os.kill", *spawn, *network, *other, *paths])
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
    folder_flags = os.O_DIRECTORY | getattr(os, "O_PATH", 0)

    def hook(
        event,
        args,
        _watched=watched,
        _paths=paths,
        _spawn=spawn,
        _network=network,
        _other=other,
        _loaded=loaded,
        _unsafe=unsafe,
        _resolve=resolve,
        _inside=inside,
        _shown=shown,
        _outside=outside,
        _refuse=refuse,
        _realpath=os.path.realpath,
        _bytes=bytes,
        _isinstance=isinstance,
        _int=int,
        _str=str,
        _len=len,
        _stat=os.stat,
        _pid=os.getpid(),
        _own=str(os.getpid()),
        _write_flags=write_flags,
        _folder_flags=folder_flags,
        _BaseException=BaseException,
    ):
        if event not in _watched and not event.startswith("ctypes."):
            return
        try:
            if event == "open":
                path, mode, flags = args[0], args[1], args[2]
                if _isinstance(path, _int):
                    return  # open(fd) wraps a descriptor the process already has
                flags = _int.__int__(flags) if _isinstance(flags, _int) else 0
                target = _resolve(path, None)
                # the path as the kernel follows it too: "/proc/self/root/proc/PID" is another process's
                real = _realpath(path) if _isinstance(path, (_str, _bytes)) else None
                for seen in (target, real.decode("utf-8", "replace") if _isinstance(real, _bytes) else real):
                    if seen is not None and seen.startswith("/proc/"):
                        place = seen.split("/")[2]
                        if place.isdigit() and place != _own:  # its environment, memory: not the tests' to read
                            _refuse("tests tried to read %s of another process" % seen)
                if flags & _write_flags:  # computed by open() from its mode, or given to os.open
                    if not _inside(target):
                        _refuse(_outside("write", target, path))
                elif mode is None and not _inside(target):  # os.open: a folder's fd would reach past the folder
                    if target is None:
                        _refuse(_outside("open", target, path))
                    folder = flags & _folder_flags
                    if not folder:
                        try:
                            folder = (_stat(target).st_mode & 0o170000) == 0o040000
                        except _BaseException:
                            folder = False
                    if folder:
                        _refuse("tests tried to open the folder %s outside their own" % target)
                return
            if event in _paths:
                verb, places = _paths[event]
                for index, dir_index in places:
                    if index >= _len(args) or args[index] is None:
                        continue
                    target = _resolve(args[index], None if dir_index is None else args[dir_index])
                    if not _inside(target):
                        _refuse(_outside(verb, target, args[index]))
                return
            if event in _spawn:
                detail = (" " + _shown(args[1] if event == "subprocess.Popen" else args[0])) if args else ""
                _refuse("tests tried to start a process (%s%s)" % (event, detail))
            if event in _network:
                where = args[0] if event.startswith("socket.get") else args[1] if event.startswith("socket.") else ""
                _refuse("tests tried to use the network (%s %s)" % (event, _shown(where)))
            if event == "socket.__new__":
                if not (_isinstance(args[1], _int) and _int.__int__(args[1]) == 1):  # AF_UNIX: socketpair
                    _refuse("tests tried to open a network socket")
                return
            if event == "os.kill":
                if not (_isinstance(args[0], _int) and _int.__int__(args[0]) in (0, _pid)):
                    _refuse("tests tried to signal another process")
                return
            if event == "import":
                name = _shown(args[0])
                if name in _unsafe or name in _loaded or name.startswith(("ctypes", "_ctypes", "_test", "_xx")):
                    _refuse("tests tried to import %s" % name)
                return
            if event in _other:
                _refuse("tests tried to %s" % _other[event])
            _refuse("tests tried to use ctypes (%s)" % event)
        except _BaseException:
            _refuse("the sandbox could not check the event %s" % event)

    sys.addaudithook(hook)


if sys.argv[1] == "confine":
    _kvgraft_code, _kvgraft_globals = _kvgraft_confine(*sys.argv[2:])
else:
    _kvgraft_code, _kvgraft_globals = _kvgraft_run(*sys.argv[2:5], sys.argv[5:])
del _kvgraft_confine, _kvgraft_kernel, _kvgraft_run, _kvgraft_audit
exec(_kvgraft_code, _kvgraft_globals)
'''
