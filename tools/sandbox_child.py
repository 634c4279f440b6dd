"""Child side of the ``python`` sandbox: the script the sandboxed interpreter runs.

The parent (:mod:`srt_agent.tools.python`) starts ``python -I -S -B -u <this file> <config JSON>``. In
isolated mode the script's directory is not on ``sys.path``, so this module is self-contained: it imports
the standard library only, never ``srt_agent``. It sets the resource limits on itself, disables the
functions that act without an audit event, installs the audit hook (:func:`make_audit_hook`) and runs the
user's code as ``__main__``, reporting an uncaught exception without this file's frames.

The config JSON has ``scratch`` (the resolved scratch directory), ``code_path`` (the user's code),
``status_fd`` (a non-blocking pipe for the ``blocked`` and ``memory`` lines the parent reads),
``rlimits`` (a list of ``[name, soft, hard]``), ``landlock`` (restrict filesystem changes to the scratch
directory with Landlock, :func:`restrict_writes`) and ``audit_hook`` (whether to install the hook).
"""

from __future__ import annotations

import json
import linecache
import os
import resource
import signal
import socket
import sys
import traceback
import types
from collections.abc import Callable
from typing import Any

# The hook's rules. Only immutable values live at module level (user code can reach these globals through
# its caller's frame): make_audit_hook copies them into closure cells when it is called.

# Event names kept as text: one line each rather than one line per name.
_NETWORK_EVENTS = (
    "socket.connect socket.bind socket.sendto socket.sendmsg socket.getaddrinfo socket.gethostbyname "
    "socket.gethostbyaddr socket.getnameinfo socket.sethostname"
)
_PROCESS_EVENTS = (
    "os.system os.exec os.posix_spawn os.spawn os.fork os.forkpty os.startfile subprocess.Popen "
    "_posixsubprocess.fork_exec"
)
_OTHER_EVENTS = (
    ("resource.setrlimit", "changing resource limits"),
    ("resource.prlimit", "changing resource limits"),
    ("gc.get_objects", "gc introspection"),
    ("gc.get_referrers", "gc introspection"),
    ("gc.get_referents", "gc introspection"),
    ("os.symlink", "creating symlinks"),
    ("os.pidfd_open", "signalling another process"),
    ("sqlite3.enable_load_extension", "native code (sqlite3 extension)"),
    ("sqlite3.load_extension", "native code (sqlite3 extension)"),
)
# Modules that hand out native code, fresh interpreters without this hook, or fresh copies of the
# functions the bootstrap disabled (posix, _posixsubprocess).
_BLOCKED_MODULES = (
    "ctypes _ctypes _posixsubprocess posix _xxsubinterpreters _xxinterpchannels _interpreters "
    "_interpchannels _testcapi _testinternalcapi _testmultiphase _testsinglephase _testbuffer _testclinic"
)
# event -> (path argument index, dir_fd argument index or -1) for events that change the filesystem
_PATH_EVENTS = (
    ("os.mkdir", ((0, 2),)),
    ("os.rmdir", ((0, 1),)),
    ("os.remove", ((0, 1),)),
    ("os.rename", ((0, 2), (1, 3))),
    ("os.link", ((0, 2), (1, 3))),
    ("os.chmod", ((0, 2),)),
    ("os.chown", ((0, 3),)),
    ("os.utime", ((0, 3),)),
    ("os.truncate", ((0, -1),)),
    ("os.setxattr", ((0, -1),)),
    ("os.removexattr", ((0, -1),)),
    ("shutil.rmtree", ((0, 1),)),
)


def make_audit_hook(scratch: str, status_fd: int) -> Callable[[str, tuple[Any, ...]], None]:
    """Build the child's audit hook.

    Every name the hook uses is captured here, as a closure variable: user code can rebind module
    attributes (``os.lstat``) and builtins, but not these cells, which nothing it can reach refers to.

    Args:
        scratch: The resolved scratch directory, the only place the code may change.
        status_fd: Non-blocking pipe to the parent; each refused action is written once as
            a ``blocked`` line (``blocked``, a tab, ``<what> (<event>)``).

    Returns:
        The hook, for :func:`sys.addaudithook`. It raises ``PermissionError`` for a refused action.
    """
    lstat, readlink, getcwd, fspath = os.lstat, os.readlink, os.getcwd, os.fspath
    write, getpid = os.write, os.getpid
    is_a, str_, bytes_, int_, OSError_, Blocked = isinstance, str, bytes, int, OSError, PermissionError
    af_unix = socket.AF_UNIX
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    inside_prefix = scratch + "/"
    devices = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})
    network, processes = frozenset(_NETWORK_EVENTS.split()), frozenset(_PROCESS_EVENTS.split())
    modules = frozenset(_BLOCKED_MODULES.split())
    other, paths = dict(_OTHER_EVENTS), dict(_PATH_EVENTS)  # fresh copies only the closure holds

    reported: set[str] = set()

    def block(what: str, event: str) -> None:
        msg = what + " (" + event + ")"
        try:
            if msg not in reported:  # each once: the (non-blocking) status pipe must never fill up
                reported.add(msg)
                write(status_fd, ("blocked\t" + msg + "\n").encode())
        finally:
            raise Blocked("blocked by sandbox: " + msg)  # also when the status pipe is closed or full

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


def _disable_unaudited() -> None:
    """Replace functions that act without an audit event of their own with stubs that raise one.

    ``subprocess`` calls ``fork_exec`` after its ``subprocess.Popen`` event, but user code could call it
    directly; a pidfd can signal any process of the same user. Re-importing the modules is blocked.
    """
    import _posixsubprocess
    import posix

    def disable(module: Any, attr: str, event: str) -> None:
        def stub(*args: Any, **kwargs: Any) -> Any:
            sys.audit(event)
            raise PermissionError("blocked by sandbox: " + event)

        if hasattr(module, attr):
            setattr(module, attr, stub)

    disable(_posixsubprocess, "fork_exec", "_posixsubprocess.fork_exec")
    for module in (os, posix):
        disable(module, "pidfd_open", "os.pidfd_open")


# Landlock (Linux >= 5.13; the syscall numbers are the same on every architecture).
_LANDLOCK_CREATE_RULESET, _LANDLOCK_ADD_RULE, _LANDLOCK_RESTRICT_SELF = 444, 445, 446
_LANDLOCK_VERSION, _RULE_PATH_BENEATH, _PR_SET_NO_NEW_PRIVS = 1, 1, 38
# Every access that changes the filesystem, by the ABI version that introduced it: write, remove
# file/dir, make char/dir/reg/sock/fifo/block/sym (1); refer, i.e. link or rename across dirs (2);
# truncate (3). Reading and executing stay allowed everywhere, as for the parent.
_CHANGE_ACCESS = ((1, 0b1_1111_1111_0010), (2, 1 << 13), (3, 1 << 14))
_WRITE_FILE, _TRUNCATE = 1 << 1, 1 << 14


def restrict_writes(scratch: str) -> str:
    """Let the kernel refuse every filesystem change outside ``scratch`` (Landlock), for good.

    Unlike the audit hook this holds for everything the process does, C code included (sqlite
    ``ATTACH``/``VACUUM INTO``, ``readline`` history, ``/tmp``, ``/dev/shm``), and cannot be undone.
    ``/dev/null`` stays writable.

    Returns:
        ``""`` when the restriction is in force, else why it is not (the kernel lacks Landlock).
    """
    import ctypes
    import struct

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        abi = libc.syscall(_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), _LANDLOCK_VERSION)
        if abi < 1:
            return "the kernel has no Landlock (" + os.strerror(ctypes.get_errno()) + ")"
        change = 0
        for version, bits in _CHANGE_ACCESS:
            if abi >= version:
                change |= bits
        attr = ctypes.create_string_buffer(struct.pack("=Q", change))
        ruleset = libc.syscall(_LANDLOCK_CREATE_RULESET, attr, ctypes.c_size_t(8), 0)
        if ruleset < 0:
            return "landlock_create_ruleset failed: " + os.strerror(ctypes.get_errno())
        file_change = _WRITE_FILE | (_TRUNCATE if abi >= 3 else 0)
        try:
            for path, allowed in ((scratch, change), ("/dev/null", file_change)):
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                try:
                    rule = ctypes.create_string_buffer(struct.pack("=Qi", allowed, fd))
                    if libc.syscall(_LANDLOCK_ADD_RULE, ruleset, _RULE_PATH_BENEATH, rule, 0) != 0:
                        return "landlock_add_rule failed: " + os.strerror(ctypes.get_errno())
                finally:
                    os.close(fd)
            if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
                return "prctl(NO_NEW_PRIVS) failed: " + os.strerror(ctypes.get_errno())
            if libc.syscall(_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
                return "landlock_restrict_self failed: " + os.strerror(ctypes.get_errno())
        finally:
            os.close(ruleset)
        return ""
    finally:  # user code must not find ctypes already imported
        for name in [m for m in sys.modules if m == "ctypes" or m.startswith(("ctypes.", "_ctypes"))]:
            del sys.modules[name]


def _report(exc: BaseException, status_fd: int, own_file: str) -> None:
    """Print the traceback like the interpreter would, without this file's frames (they only distract)."""
    if isinstance(exc, MemoryError):
        os.write(status_fd, b"memory\n")
    report = traceback.TracebackException(type(exc), exc, exc.__traceback__)
    todo = [report]
    while todo:
        te = todo.pop()
        te.stack = traceback.StackSummary.from_list([f for f in te.stack if f.filename != own_file])
        todo += [c for c in (te.__cause__, te.__context__) if c is not None]
    sys.stderr.write("".join(report.format()))


def main(argv: list[str] | None = None) -> None:
    """Entry point of the sandboxed child: limits, hook, then the user's code.

    Args:
        argv: The command line; ``sys.argv`` when omitted. ``argv[1]`` is the config JSON.
    """
    own_file = main.__code__.co_filename  # captured before user code runs; all frames here share it
    cfg = json.loads((argv or sys.argv)[1])
    status_fd = cfg["status_fd"]
    for name, soft, hard in cfg["rlimits"]:
        resource.setrlimit(getattr(resource, name), (soft, hard))
    # A write past RLIMIT_FSIZE then raises OSError(EFBIG) that the code can see, instead of killing it.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    with open(cfg["code_path"], encoding="utf-8") as f:
        src = f.read()
    linecache.cache["<code>"] = (len(src), None, src.splitlines(True), "<code>")
    if cfg.get("landlock", True):
        why_not = restrict_writes(cfg["scratch"])
        os.write(status_fd, ("landlock\t" + (why_not or "on") + "\n").encode())
    _disable_unaudited()
    if cfg["audit_hook"]:
        sys.addaudithook(make_audit_hook(cfg["scratch"], status_fd))

    user_main = types.ModuleType("__main__")
    sys.modules["__main__"] = user_main
    sys.argv = ["<code>"]
    try:
        exec(compile(src, "<code>", "exec"), user_main.__dict__)
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - reported like the interpreter would
        _report(exc, status_fd, own_file)
        sys.exit(1)


if __name__ == "__main__":
    main()
