"""``python``: run model-written Python in a sandboxed subprocess.

Each call runs ``python -I -S -B -u`` (isolated mode: no ``PYTHON*`` variables, no site-packages, so the
standard library only; no ``.pyc`` writes; unbuffered output, so nothing printed before a kill is lost) in a
fresh scratch directory that is its working directory, ``HOME`` and ``TMPDIR``, and is deleted afterwards.
Stdin is ``/dev/null``; the environment is minimal (no inherited secrets).

Layers, outermost first (:func:`sandbox_layers` says which are active on this machine):

1. **Network namespace** (``unshare --net``, or ``unshare --user --map-root-user --net`` for non-root users
   where user namespaces are allowed; probed once): the child has no interface but a down loopback, so no
   connection can leave it, whatever the code does.
2. **Unprivileged per-run uid** (when the parent is root and ``setpriv`` exists): the child runs as a fresh
   uid that owns only the scratch directory, keeping just ``CAP_DAC_READ_SEARCH`` so it can read the
   interpreter wherever it is installed. The kernel then refuses writes to anything it does not own and
   counts only this run's processes against ``RLIMIT_NPROC``. World-writable directories (``/tmp``,
   ``/dev/shm``) stay writable at this layer; the audit hook covers them.
3. **Resource limits** set by the child on itself with soft = hard, which an unprivileged process cannot
   raise: ``RLIMIT_CPU`` (SIGXCPU, then SIGKILL a second later), ``RLIMIT_AS`` (allocations fail with
   ``MemoryError``), ``RLIMIT_FSIZE`` (writes fail with ``EFBIG``), ``RLIMIT_NOFILE``, ``RLIMIT_CORE`` = 0,
   and ``RLIMIT_NPROC`` (only with layer 2, as the count is per uid).
4. **Wall clock** kept by the parent, which kills the child's whole process group (its own session).
5. **Audit hook** (:pep:`578`) installed before the user's code runs, always: refuses sockets and name
   lookups, writes/creates/renames/removes outside the scratch directory, symlinks, process creation
   (``fork``, ``exec*``, ``system``, ``posix_spawn``, ``subprocess``), ``ctypes``, changing resource
   limits, signalling other processes, and ``gc`` introspection that could reach the hook. It also gives the
   model a clear message. Python's docs say hooks are not a security boundary on their own: it is defence in
   depth behind the kernel layers, and its rules use only values captured at install time (no global or
   builtin lookups), so user code cannot rebind what it calls.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import os
import pwd
import random
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from srt_agent.tool import Tool, tool

MAX_CODE_CHARS = 100_000
# Per-run uids are drawn from a range that distributions leave to no one in particular (below 65536 so
# that containers with a 16-bit uid map accept them).
_UID_RANGE = range(40_000, 60_000)
_PROBE_TIMEOUT_S = 10.0


class SandboxLimits(BaseModel):
    """Limits for one sandboxed run.

    Attributes:
        timeout_s: Wall-clock seconds before the process group is killed.
        cpu_s: CPU seconds (``RLIMIT_CPU``).
        memory_mb: Address-space limit in MiB (``RLIMIT_AS``); allocations beyond it raise ``MemoryError``.
        output_chars: Characters of stdout + stderr shown to the model.
        file_size_mb: Largest file the code may write, in MiB (``RLIMIT_FSIZE``).
        max_processes: Processes + threads of the run's uid (``RLIMIT_NPROC``, with the uid layer only).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    timeout_s: float = Field(default=5.0, gt=0, le=600)
    cpu_s: int = Field(default=5, ge=1, le=600)
    memory_mb: int = Field(default=256, ge=64, le=65536)
    output_chars: int = Field(default=4000, ge=100)
    file_size_mb: int = Field(default=16, ge=1)
    max_processes: int = Field(default=16, ge=1, le=4096)


class SandboxResult(BaseModel):
    """What a sandboxed run produced (output already capped to the limits).

    Attributes:
        stdout: Beginning of standard output.
        stderr: End of standard error.
        stdout_bytes: Total bytes written to stdout (more than shown when truncated).
        stderr_bytes: Total bytes written to stderr.
        exit_code: Exit status; negative for a signal (``-9`` for SIGKILL).
        killed: Why the sandbox stopped the code, if it did (timeout, CPU, memory).
        blocked: Actions the audit hook refused, in order, without repeats.
        elapsed_s: Wall-clock seconds the run took.
    """

    model_config = ConfigDict(frozen=True)

    stdout: str
    stderr: str
    stdout_bytes: int
    stderr_bytes: int
    exit_code: int
    killed: str | None = None
    blocked: tuple[str, ...] = ()
    elapsed_s: float = 0.0

    def render(self, output_chars: int) -> str:
        """Format the result for the model: output (stderr labelled), then status lines.

        Args:
            output_chars: Budget for stdout + stderr together; stderr keeps its end (where tracebacks
                are), stdout its beginning.

        Returns:
            The text the tool returns.
        """
        out, err = self.stdout, self.stderr
        if len(out) + len(err) > output_chars:
            err_share = min(len(err), max(output_chars // 2, output_chars - len(out)))
            out, err = out[: output_chars - err_share], err[len(err) - err_share :]
        parts = []
        if self.stdout:
            parts.append(out.rstrip("\n"))
            if len(out) < len(self.stdout) or self.stdout_bytes > len(self.stdout.encode()):
                parts.append(f"[stdout truncated: {self.stdout_bytes} bytes in all]")
        if self.stderr:
            parts.append("[stderr]")
            if len(err) < len(self.stderr) or self.stderr_bytes > len(self.stderr.encode()):
                parts.append(f"[stderr truncated to its end: {self.stderr_bytes} bytes in all]")
            parts.append(err.rstrip("\n"))
        parts += [f"blocked by sandbox: {b}" for b in self.blocked]
        if self.killed:
            parts.append(f"killed: {self.killed}")
        elif self.exit_code != 0:
            parts.append(f"exit code: {self.exit_code}")
        return "\n".join(parts) if parts else "(no output)"


# --------------------------------------------------------------------------------------------------
# Child side. These two functions are shipped to the child as source (inspect.getsource) and run with
# `python -I -S`, so they import what they need themselves and reference nothing else in this module.
# --------------------------------------------------------------------------------------------------


def _make_audit_hook(scratch: str, status_fd: int) -> Callable[[str, tuple[Any, ...]], None]:
    """Build the child's audit hook (runs in the sandboxed child).

    Every name the hook uses is captured here, as a closure variable: user code can rebind module
    attributes (``os.lstat``) and builtins, but not these cells, which nothing it can reach refers to.
    """
    import os
    import socket

    lstat, readlink, getcwd, fspath = os.lstat, os.readlink, os.getcwd, os.fspath
    write, getpid = os.write, os.getpid
    is_a, str_, bytes_, int_, OSError_, Blocked = isinstance, str, bytes, int, OSError, PermissionError
    af_unix = socket.AF_UNIX
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    inside_prefix = scratch + "/"
    devices = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})
    # Event names kept as text: one line each rather than one line per name.
    network_events = (
        "socket.connect socket.bind socket.sendto socket.sendmsg socket.getaddrinfo socket.gethostbyname "
        "socket.gethostbyaddr socket.getnameinfo socket.sethostname"
    )
    process_events = (
        "os.system os.exec os.posix_spawn os.spawn os.fork os.forkpty os.startfile subprocess.Popen "
        "_posixsubprocess.fork_exec"
    )
    network, processes = frozenset(network_events.split()), frozenset(process_events.split())
    other = {
        "resource.setrlimit": "changing resource limits",
        "resource.prlimit": "changing resource limits",
        "gc.get_objects": "gc introspection",
        "gc.get_referrers": "gc introspection",
        "gc.get_referents": "gc introspection",
        "os.symlink": "creating symlinks",
        "sqlite3.enable_load_extension": "native code (sqlite3 extension)",
        "sqlite3.load_extension": "native code (sqlite3 extension)",
    }
    # Modules that hand out native code, fresh interpreters without this hook, or a fresh copy of the
    # fork_exec the bootstrap disabled.
    module_names = (
        "ctypes _ctypes _posixsubprocess _xxsubinterpreters _xxinterpchannels _interpreters _interpchannels "
        "_testcapi _testinternalcapi _testmultiphase _testsinglephase _testbuffer _testclinic"
    )
    modules = frozenset(module_names.split())
    # event -> (path argument index, dir_fd argument index or -1) for events that change the filesystem
    paths = {
        "os.mkdir": ((0, 2),),
        "os.rmdir": ((0, 1),),
        "os.remove": ((0, 1),),
        "os.rename": ((0, 2), (1, 3)),
        "os.link": ((0, 2), (1, 3)),
        "os.chmod": ((0, 2),),
        "os.chown": ((0, 3),),
        "os.utime": ((0, 3),),
        "os.truncate": ((0, -1),),
        "os.setxattr": ((0, -1),),
        "os.removexattr": ((0, -1),),
        "shutil.rmtree": ((0, 1),),
    }

    def block(what: str, event: str) -> None:
        msg = what + " (" + event + ")"
        try:
            write(status_fd, ("blocked\t" + msg + "\n").encode())
        finally:
            raise Blocked("blocked by sandbox: " + msg)  # also when the status pipe was closed

    def resolve(path: Any, dir_fd: Any) -> str:
        # realpath by hand with the captured functions (posixpath.realpath looks up os.lstat at call time)
        p = fspath(path)
        if is_a(p, bytes_):
            p = p.decode("utf-8", "surrogateescape")
        if not p.startswith("/"):
            # A negative dir_fd (the events carry -1 or AT_FDCWD when none was given) means the cwd.
            at_fd = is_a(dir_fd, int_) and dir_fd >= 0
            base = readlink("/proc/self/fd/" + str_(dir_fd)) if at_fd else getcwd()
            p = base + "/" + p
        todo, hops = p.split("/"), 0
        out: list[str] = []
        todo.reverse()
        while todo:
            part = todo.pop()
            if part in ("", "."):
                continue
            if part == "..":
                if out:
                    out.pop()
                continue
            current = "/" + "/".join([*out, part])
            try:
                mode = lstat(current).st_mode
            except OSError_:
                out.append(part)  # does not exist (yet): keep the name as written
                continue
            if mode & 0o170000 != 0o120000:
                out.append(part)
                continue
            hops += 1
            if hops > 40:
                return "/"  # a symlink loop: treat as outside
            target = readlink(current)
            if target.startswith("/"):
                out.clear()
            more = target.split("/")
            more.reverse()
            todo.extend(more)
        return "/" + "/".join(out)

    def inside(real: str) -> bool:
        return real == scratch or real.startswith(inside_prefix)

    def check_write(path: Any, dir_fd: Any, event: str) -> None:
        if path is None or is_a(path, int_) or (is_a(path, str_) and path in devices):
            return  # an already-open descriptor, or a harmless device
        if not inside(resolve(path, dir_fd)):
            block("writing outside the scratch directory: " + str_(path), event)

    def check_open(args: tuple[Any, ...]) -> None:
        path, mode, flags = args[0], args[1], args[2]
        if path is None or is_a(path, int_):
            return
        if mode is None:  # os.open: it may be given a dir_fd that the event does not carry
            raw = fspath(path)
            raw = raw.decode("utf-8", "surrogateescape") if is_a(raw, bytes_) else raw
            if not raw.startswith("/") and ".." in raw.split("/"):
                block("relative '..' path in os.open: " + raw, "open")
            real = resolve(path, None)
            try:
                is_dir = lstat(real).st_mode & 0o170000 == 0o040000
            except OSError_:
                is_dir = False
            if is_dir and not inside(real):
                block("directory descriptor outside the scratch directory: " + raw, "open")
            writes = flags & write_flags
        else:
            writes = "w" in mode or "a" in mode or "x" in mode or "+" in mode
        if writes:
            check_write(path, None, "open")

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "open":
            check_open(args)
        elif event in paths:
            for path_i, fd_i in paths[event]:
                check_write(args[path_i], args[fd_i] if fd_i >= 0 else None, event)
        elif event in network or (event == "socket.__new__" and args[1] != af_unix):
            block("network access", event)
        elif event in processes:
            block("process creation", event)
        elif event.startswith("ctypes."):
            block("native code (ctypes)", event)
        elif event == "import" and args[0] in modules:
            block("importing " + str_(args[0]), event)
        elif event in ("os.kill", "os.killpg") and args[0] != getpid():
            block("signalling another process", event)
        elif event == "sqlite3.connect" and args[0] not in (":memory:", "", b":memory:", b""):
            if is_a(args[0], str_) and args[0].startswith("file:"):
                block("sqlite URI filenames", event)
            check_write(args[0], None, event)
        elif event in other:
            block(other[event], event)

    return hook


def _child_main() -> None:
    """Entry point of the sandboxed child: limits, hook, then the user's code (runs in the child)."""
    import json
    import linecache
    import os
    import resource
    import signal
    import sys
    import traceback
    import types

    cfg = json.loads(sys.argv[2])
    status_fd = cfg["status_fd"]
    for name, soft, hard in cfg["rlimits"]:
        resource.setrlimit(getattr(resource, name), (soft, hard))
    # A write past RLIMIT_FSIZE then raises OSError(EFBIG) that the code can see, instead of killing it.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    with open(cfg["code_path"], encoding="utf-8") as f:
        src = f.read()
    linecache.cache["<code>"] = (len(src), None, src.splitlines(True), "<code>")

    # subprocess calls _posixsubprocess.fork_exec after its own audit event; user code could call it
    # directly, and it raises no event of its own. Replace it (re-importing the module is blocked).
    import _posixsubprocess

    def fork_exec(*args: Any, **kwargs: Any) -> Any:
        sys.audit("_posixsubprocess.fork_exec")
        raise PermissionError("blocked by sandbox: process creation")

    _posixsubprocess.fork_exec = fork_exec
    if cfg["audit_hook"]:
        sys.addaudithook(_make_audit_hook(cfg["scratch"], status_fd))

    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    sys.argv = ["<code>"]
    try:
        exec(compile(src, "<code>", "exec"), main.__dict__)
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - reported like the interpreter would
        if isinstance(exc, MemoryError):
            os.write(status_fd, b"memory\n")
        # The traceback without the sandbox's own frames (this function, the hook), which only distract.
        report = traceback.TracebackException(type(exc), exc, exc.__traceback__)
        todo = [report]
        while todo:
            te = todo.pop()
            te.stack = traceback.StackSummary.from_list([f for f in te.stack if f.filename != "<sandbox>"])
            todo += [c for c in (te.__cause__, te.__context__) if c is not None]
        sys.stderr.write("".join(report.format()))
        sys.exit(1)


def _child_source() -> str:
    return "\n".join(
        [
            "from __future__ import annotations",
            "from typing import Any, Callable",
            inspect.getsource(_make_audit_hook),
            inspect.getsource(_child_main),
            "_child_main()",
        ]
    )


# The child compiles its source under this name so its frames can be told from the user's.
_CHILD_LAUNCHER = "import sys; exec(compile(sys.argv[1], '<sandbox>', 'exec'))"


# --------------------------------------------------------------------------------------------------
# Parent side: probe the kernel layers once, spawn, watch the clock, collect capped output, clean up.
# --------------------------------------------------------------------------------------------------


def _probe(argv: list[str]) -> bool:
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=_PROBE_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


@functools.cache
def _netns_prefix() -> tuple[str, ...] | None:
    """The ``unshare`` command line that works here (probed once), or None."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    for prefix in ((unshare, "--net", "--"), (unshare, "--user", "--map-root-user", "--net", "--")):
        if _probe([*prefix, sys.executable, "-I", "-S", "-c", "pass"]):
            return prefix
    return None


def _setpriv_prefix(uid: int) -> list[str]:
    caps = "-all,+dac_read_search"
    return [
        shutil.which("setpriv") or "setpriv",
        f"--reuid={uid}",
        f"--regid={uid}",
        "--clear-groups",
        "--no-new-privs",
        f"--inh-caps={caps}",
        f"--ambient-caps={caps}",
        f"--bounding-set={caps}",
        "--",
    ]


@functools.cache
def _can_drop_privileges() -> bool:
    """True when the parent is root and a per-run uid can start the interpreter (probed once)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return False
    uid = _UID_RANGE.start
    check = f"import os, json, decimal; assert os.getuid() == {uid}"
    return _probe([*_setpriv_prefix(uid), sys.executable, "-I", "-S", "-B", "-c", check])


def sandbox_layers() -> dict[str, bool]:
    """Which isolation layers are active on this machine.

    Returns:
        Layer name -> active. ``audit_hook``, ``rlimits`` and ``wall_clock`` are always on.
    """
    return {
        "network_namespace": _netns_prefix() is not None,
        "unprivileged_uid": _can_drop_privileges(),
        "rlimits": True,
        "rlimit_nproc": _can_drop_privileges(),
        "wall_clock": True,
        "audit_hook": True,
    }


class _UidPool:
    """Hands out distinct uids to concurrent runs of this process (others are unlikely to collide)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._used: set[int] = set()
        self._rng = random.Random()

    def acquire(self) -> int:
        with self._lock:
            while True:
                uid = self._rng.choice(_UID_RANGE)
                if uid not in self._used and not _uid_exists(uid):
                    self._used.add(uid)
                    return uid

    def release(self, uid: int) -> None:
        with self._lock:
            self._used.discard(uid)


def _uid_exists(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


_UIDS = _UidPool()


class _Capture:
    """Keeps the head (stdout) or the tail (stderr) of a stream, up to ``cap`` bytes, and counts it all."""

    def __init__(self, cap: int, keep_tail: bool) -> None:
        self.cap, self.keep_tail, self.total, self.data = cap, keep_tail, 0, bytearray()

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        if self.keep_tail:
            self.data += chunk
            del self.data[: max(0, len(self.data) - self.cap)]
        elif len(self.data) < self.cap:
            self.data += chunk[: self.cap - len(self.data)]

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _kill_uid(uid: int) -> None:
    """Kill any process still running as the run's uid (one that left the process group)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        line = next((ln for ln in status.splitlines() if ln.startswith("Uid:")), "")
        if str(uid) in line.split()[1:2]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry), signal.SIGKILL)


def _exited(pid: int) -> bool:
    # WNOWAIT leaves the zombie in place, so its pid (and process group id) cannot be reused before
    # the group is killed.
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _collect(proc: subprocess.Popen[bytes], deadline: float, out: _Capture, err: _Capture) -> bool:
    """Read both pipes until EOF and the child's exit, or the deadline. Returns True on timeout."""
    assert proc.stdout is not None and proc.stderr is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ, out)
        sel.register(proc.stderr, selectors.EVENT_READ, err)
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True
            for key, _ in sel.select(remaining):
                chunk = os.read(key.fd, 65536)
                if chunk:
                    key.data.add(chunk)
                else:
                    sel.unregister(key.fileobj)
    while not _exited(proc.pid):  # it closed its output but may still be running
        if time.monotonic() >= deadline:
            return True
        time.sleep(0.005)
    return False


def _rlimits(limits: SandboxLimits, nproc: bool) -> list[tuple[str, int, int]]:
    mib = 1024 * 1024
    caps = [
        ("RLIMIT_CPU", limits.cpu_s, limits.cpu_s + 1),
        ("RLIMIT_AS", limits.memory_mb * mib, limits.memory_mb * mib),
        ("RLIMIT_FSIZE", limits.file_size_mb * mib, limits.file_size_mb * mib),
        ("RLIMIT_NOFILE", 256, 256),
        ("RLIMIT_CORE", 0, 0),
    ]
    if nproc:
        caps.append(("RLIMIT_NPROC", limits.max_processes, limits.max_processes))
    return caps


def run_python(code: str, limits: SandboxLimits | None = None, *, audit_hook: bool = True) -> SandboxResult:
    """Run ``code`` in the sandbox and collect what it did.

    Args:
        code: Python source, run as ``__main__``.
        limits: Limits; the defaults when omitted.
        audit_hook: Install the audit hook. Only tests turn it off, to check the kernel layers alone.

    Returns:
        The capped output, exit status, and why the run was stopped or what was blocked.

    Raises:
        ValueError: The code is longer than ``MAX_CODE_CHARS``.
    """
    lim = limits or SandboxLimits()
    if len(code) > MAX_CODE_CHARS:
        raise ValueError(f"code is {len(code)} characters; the limit is {MAX_CODE_CHARS}")
    run_dir = Path(tempfile.mkdtemp(prefix="srt-python-"))
    scratch = run_dir / "scratch"
    scratch.mkdir()
    (run_dir / "code.py").write_text(code, encoding="utf-8")
    uid = _UIDS.acquire() if _can_drop_privileges() else None
    status_r, status_w = os.pipe()
    try:
        if uid is not None:
            os.chown(scratch, uid, uid)
        cfg = {
            "scratch": str(scratch.resolve()),
            "code_path": str(run_dir / "code.py"),
            "status_fd": status_w,
            "rlimits": _rlimits(lim, nproc=uid is not None),
            "audit_hook": audit_hook,
        }
        argv = [*(_netns_prefix() or ()), *(_setpriv_prefix(uid) if uid is not None else ())]
        argv += [
            sys.executable,
            "-I",
            "-S",
            "-B",
            "-u",
            "-c",
            _CHILD_LAUNCHER,
            _child_source(),
            json.dumps(cfg),
        ]
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(scratch),
            "TMPDIR": str(scratch),
            "USER": "sandbox",
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "MALLOC_ARENA_MAX": "2",  # glibc reserves 64 MiB of address space per arena otherwise
        }
        return _execute(argv, env, scratch, status_r, status_w, lim, uid)
    finally:
        os.close(status_r)
        if uid is not None:
            _kill_uid(uid)
            _UIDS.release(uid)
        shutil.rmtree(run_dir, ignore_errors=True)


def _execute(
    argv: list[str],
    env: dict[str, str],
    cwd: Path,
    status_r: int,
    status_w: int,
    lim: SandboxLimits,
    uid: int | None,
) -> SandboxResult:
    t0 = time.monotonic()
    cap = lim.output_chars * 4  # bytes: enough for output_chars characters of UTF-8
    out, err = _Capture(cap, keep_tail=False), _Capture(cap, keep_tail=True)
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=env,
            pass_fds=(status_w,),
            start_new_session=True,  # its own process group, killed as a whole
        )
    finally:
        os.close(status_w)
    with proc:
        try:
            timed_out = _collect(proc, t0 + lim.timeout_s, out, err)
        finally:
            _kill_group(proc.pid)  # the leader is alive or a zombie here, so the group id is still ours
        if timed_out:  # drain what the killed group left in the pipes
            _collect(proc, time.monotonic() + 1.0, out, err)
        code = proc.wait()
    status = os.read(status_r, 1 << 16).decode(errors="replace").splitlines()
    blocked = tuple(dict.fromkeys(s.split("\t", 1)[1] for s in status if s.startswith("blocked\t")))
    killed = None
    if timed_out:
        killed = f"wall-clock timeout of {lim.timeout_s:g} s exceeded"
    elif code in (-signal.SIGXCPU, -signal.SIGKILL):
        killed = f"CPU time limit of {lim.cpu_s} s exceeded"
    elif "memory" in status:
        killed = f"memory limit of {lim.memory_mb} MiB exceeded (MemoryError)"
    elif code < 0:
        killed = f"terminated by signal {signal.Signals(-code).name}"
    return SandboxResult(
        stdout=out.text(),
        stderr=err.text(),
        stdout_bytes=out.total,
        stderr_bytes=err.total,
        exit_code=code,
        killed=killed,
        blocked=blocked[:10],
        elapsed_s=time.monotonic() - t0,
    )


def make_python_tool(limits: SandboxLimits | None = None, *, name: str = "python") -> Tool:
    """Build a sandboxed Python tool with the given limits.

    Args:
        limits: Sandbox limits; the defaults when omitted.
        name: The tool's name.

    Returns:
        A tool whose own timeout is a few seconds longer than the sandbox's wall clock, so the sandbox
        reports the timeout itself (with the output so far) rather than the tool set abandoning the call.
    """
    lim = limits or SandboxLimits()

    def python(code: str) -> str:
        """Run Python code.

        Args:
            code: A complete Python 3 program; print what you want to see.
        """
        return run_python(code, lim).render(lim.output_chars)

    description = (
        f"Run a Python 3 program (standard library only) and return its stdout and stderr. "
        f"Limits: {lim.timeout_s:g} s wall clock, {lim.cpu_s} s CPU, {lim.memory_mb} MiB memory; "
        "no network, no subprocesses; files may be written only in the working directory, "
        "which is empty at the start and discarded after the call."
    )
    return tool(name=name, description=description, timeout=lim.timeout_s + 5.0)(python)


python = make_python_tool()
