"""Host side of the ``python`` sandbox: kernel layers, per-run uids, spawning, clock and output capture.

:mod:`srt_agent.tools.python` decides what a run means; this module only manages processes: it probes
once which kernel layers work here (``unshare --net``, ``setpriv`` to a fresh uid), builds the child's
command line (:data:`CHILD_SCRIPT` under those layers), runs it in its own session, keeps the head of
stdout and the tail of stderr until the wall clock runs out, and kills whatever the run left behind.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import pwd
import random
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The script the sandboxed interpreter runs (stdlib only: `python -I` does not put its folder on sys.path).
CHILD_SCRIPT = Path(__file__).resolve().with_name("sandbox_child.py")
# Per-run uids are drawn from a range that distributions leave to no one in particular (below 65536 so
# that containers with a 16-bit uid map accept them).
UID_RANGE = range(40_000, 60_000)
PROBE_TIMEOUT_S = 10.0


# -- kernel layers, probed once --------------------------------------------------------------------------


def _probe(argv: list[str]) -> bool:
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


@functools.cache
def netns_prefix() -> tuple[str, ...] | None:
    """The ``unshare`` command line that works here (probed once).

    Returns:
        ``unshare --net --`` when the parent may create network namespaces, else the same with a user
        namespace (``--user --map-root-user``), or None when neither starts the interpreter.
    """
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    for prefix in ((unshare, "--net", "--"), (unshare, "--user", "--map-root-user", "--net", "--")):
        if _probe([*prefix, sys.executable, "-I", "-S", "-c", "pass"]):
            return prefix
    return None


def setpriv_prefix(uid: int) -> list[str]:
    """The ``setpriv`` command line that runs the rest as ``uid``, keeping only ``CAP_DAC_READ_SEARCH``.

    Args:
        uid: The run's uid (also its gid); no supplementary groups, no new privileges.

    Returns:
        The argv prefix, ending in ``--``.
    """
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
@functools.cache
def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0: none), probed once."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        # landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION); 444 on every architecture
        return max(0, int(libc.syscall(444, None, ctypes.c_size_t(0), 1)))
    except (OSError, AttributeError):
        return 0


def can_drop_privileges() -> bool:
    """Whether the parent is root and a per-run uid can start the interpreter (probed once).

    Returns:
        True when runs get an unprivileged uid of their own (and so ``RLIMIT_NPROC``).
    """
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return False
    uid = UID_RANGE.start
    check = f"import os, json, decimal; assert os.getuid() == {uid}"
    prefix = [*(netns_prefix() or ()), *setpriv_prefix(uid)]  # the same chain as a real run
    return _probe([*prefix, sys.executable, "-I", "-S", "-B", "-c", check])


# -- per-run uids ----------------------------------------------------------------------------------------


class UidPool:
    """Hands out distinct uids to concurrent runs of this process (others are unlikely to collide)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._used: set[int] = set()
        self._rng = random.Random()

    def acquire(self) -> int:
        """Reserve a uid from :data:`UID_RANGE` that no run here uses and no account owns.

        Returns:
            The uid; give it back with :meth:`release`.
        """
        with self._lock:
            while True:
                uid = self._rng.choice(UID_RANGE)
                if uid not in self._used and not _uid_exists(uid):
                    self._used.add(uid)
                    return uid

    def release(self, uid: int) -> None:
        """Return a uid from :meth:`acquire` to the pool.

        Args:
            uid: The uid, whose processes are already gone.
        """
        with self._lock:
            self._used.discard(uid)


def _uid_exists(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


UIDS = UidPool()


def kill_uid(uid: int) -> None:
    """Kill any process still running as the run's uid (one that left the process group).

    Args:
        uid: The run's uid.
    """
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


# -- the child's command line and limits -----------------------------------------------------------------


def rlimits(
    *, cpu_s: int, memory_mb: int, file_size_mb: int, max_processes: int, nproc: bool
) -> list[tuple[str, int, int]]:
    """The resource limits the child sets on itself, soft = hard except ``RLIMIT_CPU``.

    Args:
        cpu_s: CPU seconds; the hard limit (SIGKILL) is one second later than the soft one (SIGXCPU).
        memory_mb: Address space in MiB.
        file_size_mb: Largest file in MiB.
        max_processes: Processes + threads of the run's uid.
        nproc: Include ``RLIMIT_NPROC`` (only meaningful with a per-run uid, as the count is per uid).

    Returns:
        ``(resource name, soft, hard)`` triples.
    """
    mib = 1024 * 1024
    caps = [
        ("RLIMIT_CPU", cpu_s, cpu_s + 1),
        ("RLIMIT_AS", memory_mb * mib, memory_mb * mib),
        ("RLIMIT_FSIZE", file_size_mb * mib, file_size_mb * mib),
        ("RLIMIT_NOFILE", 256, 256),
        ("RLIMIT_CORE", 0, 0),
    ]
    if nproc:
        caps.append(("RLIMIT_NPROC", max_processes, max_processes))
    return caps


def child_argv(uid: int | None, config: dict[str, Any]) -> list[str]:
    """The full command line of a run: the kernel layers, then the interpreter on :data:`CHILD_SCRIPT`.

    Args:
        uid: The run's uid, or None to keep the parent's.
        config: What the child reads from its first argument (see :mod:`.sandbox_child`).

    Returns:
        The argv for :func:`execute`.
    """
    argv = [*(netns_prefix() or ()), *(setpriv_prefix(uid) if uid is not None else ())]
    return [*argv, sys.executable, "-I", "-S", "-B", "-u", str(CHILD_SCRIPT), json.dumps(config)]


def child_env(scratch: Path) -> dict[str, str]:
    """The child's whole environment: nothing inherited, the scratch directory as ``HOME`` and ``TMPDIR``.

    Args:
        scratch: The run's scratch directory.

    Returns:
        The environment for :func:`execute`.
    """
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(scratch),
        "TMPDIR": str(scratch),
        "USER": "sandbox",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "MALLOC_ARENA_MAX": "2",  # glibc reserves 64 MiB of address space per arena otherwise
    }


# -- running it ------------------------------------------------------------------------------------------


class Capture:
    """Keeps the head (stdout) or the tail (stderr) of a stream, up to ``cap`` bytes, and counts it all."""

    def __init__(self, cap: int, keep_tail: bool) -> None:
        self.cap, self.keep_tail, self.total, self.data = cap, keep_tail, 0, bytearray()

    def add(self, chunk: bytes) -> None:
        """Count a chunk and keep what fits.

        Args:
            chunk: Bytes just read from the stream.
        """
        self.total += len(chunk)
        if self.keep_tail:
            self.data += chunk
            del self.data[: max(0, len(self.data) - self.cap)]
        elif len(self.data) < self.cap:
            self.data += chunk[: self.cap - len(self.data)]

    def text(self) -> str:
        """The kept bytes as text (invalid UTF-8, such as a cut character, replaced).

        Returns:
            The decoded text.
        """
        return self.data.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class ChildRun:
    """What :func:`execute` saw, before it is interpreted.

    Attributes:
        stdout: Head of standard output.
        stderr: Tail of standard error.
        exit_code: Exit status; negative for a signal.
        timed_out: The wall clock ran out (and the process group was killed).
        status: Lines the child wrote to the status pipe (``memory`` and ``blocked`` lines).
        elapsed_s: Wall-clock seconds from spawn to collection.
    """

    stdout: Capture
    stderr: Capture
    exit_code: int
    timed_out: bool
    status: list[str]
    elapsed_s: float


def status_pipe() -> tuple[int, int]:
    """A pipe for the child's status lines, non-blocking at both ends.

    Returns:
        ``(read end, write end)``. A child that floods it loses messages instead of hanging, and the
        parent never waits on it.
    """
    status_r, status_w = os.pipe()
    os.set_blocking(status_w, False)
    os.set_blocking(status_r, False)
    return status_r, status_w


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _exited(pid: int) -> bool:
    # WNOWAIT leaves the zombie in place, so its pid (and process group id) cannot be reused before
    # the group is killed.
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _collect(proc: subprocess.Popen[bytes], deadline: float, out: Capture, err: Capture) -> bool:
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


def execute(
    argv: list[str],
    env: dict[str, str],
    cwd: Path,
    status_fds: tuple[int, int],
    *,
    timeout_s: float,
    capture_bytes: int,
) -> ChildRun:
    """Run the child in its own session, collect its output until it exits or the clock runs out.

    Args:
        argv: From :func:`child_argv`.
        env: From :func:`child_env`.
        cwd: The scratch directory.
        status_fds: From :func:`status_pipe`. The write end is passed to the child and closed here; the
            read end stays open (the caller closes it).
        timeout_s: Wall-clock seconds before the whole process group is killed.
        capture_bytes: Bytes kept of each of stdout (its head) and stderr (its tail).

    Returns:
        The captured output, exit status and status lines.
    """
    status_r, status_w = status_fds
    t0 = time.monotonic()
    out, err = Capture(capture_bytes, keep_tail=False), Capture(capture_bytes, keep_tail=True)
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
            timed_out = _collect(proc, t0 + timeout_s, out, err)
        finally:
            _kill_group(proc.pid)  # the leader is alive or a zombie here, so the group id is still ours
        if timed_out:  # drain what the killed group left in the pipes
            _collect(proc, time.monotonic() + 1.0, out, err)
        code = proc.wait()
    try:
        status = os.read(status_r, 1 << 16).decode(errors="replace").splitlines()
    except BlockingIOError:
        status = []
    return ChildRun(out, err, code, timed_out, status, elapsed_s=time.monotonic() - t0)
