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
   ``/dev/shm``) stay writable at this layer; Landlock and the audit hook cover them.
3. **Landlock** (Linux >= 5.13, probed once): before the user's code runs, the child asks the kernel to
   refuse every change to the filesystem outside its scratch directory (writes, creates, removes,
   renames, links, truncation; ``/dev/null`` stays writable), irrevocably and for C code too: sqlite
   ``ATTACH``/``VACUUM INTO``, ``readline`` history files, ``/tmp`` and ``/dev/shm`` are all refused.
4. **Resource limits** set by the child on itself with soft = hard, which an unprivileged process cannot
   raise: ``RLIMIT_CPU`` (SIGXCPU, then SIGKILL a second later), ``RLIMIT_AS`` (allocations fail with
   ``MemoryError``), ``RLIMIT_FSIZE`` (writes fail with ``EFBIG``), ``RLIMIT_NOFILE``, ``RLIMIT_CORE`` = 0,
   and ``RLIMIT_NPROC`` (only with layer 2, as the count is per uid).
5. **Wall clock** kept by the parent, which kills the child's whole process group (its own session).
6. **Audit hook** (:pep:`578`) installed before the user's code runs, always: refuses sockets and name
   lookups, writes/creates/renames/removes outside the scratch directory, symlinks, process creation
   (``fork``, ``exec*``, ``system``, ``posix_spawn``, ``subprocess``), ``ctypes``, changing resource
   limits, signalling other processes, and ``gc`` introspection that could reach the hook. It also gives the
   model a clear message. Python's docs say hooks are not a security boundary on their own: it is defence in
   depth behind the kernel layers, and its rules use only values captured at install time (no global or
   builtin lookups), so user code cannot rebind what it calls.

Not covered: reading files (the whole filesystem is readable, as it is to the parent), and, without
layers 1-3, anything that gets past the hook (FIFOs and device nodes outside the scratch directory
raise no audit event; Landlock refuses them). See ``docs/security.md`` for the threat model.
Third-party packages are not importable (``-S``).

The child runs :mod:`srt_agent.tools.sandbox_child` as a script (standard library only); the process
management lives in :mod:`srt_agent.tools.sandbox_host`. This module decides what a run means.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from srt_agent.tooling.definition import Tool, tool
from srt_agent.tools import sandbox_host as host

MAX_CODE_CHARS = 100_000


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
        parts += [f"blocked by sandbox: {b}" for b in self.blocked[:5]]
        if len(self.blocked) > 5:
            parts.append(f"blocked by sandbox: {len(self.blocked) - 5} more actions")
        if self.killed:
            parts.append(f"killed: {self.killed}")
        elif self.exit_code != 0:
            parts.append(f"exit code: {self.exit_code}")
        return "\n".join(parts) if parts else "(no output)"


def sandbox_layers() -> dict[str, bool]:
    """Which isolation layers are active on this machine.

    Returns:
        Layer name -> active. ``audit_hook``, ``rlimits`` and ``wall_clock`` are always on.
    """
    return {
        "network_namespace": host.netns_prefix() is not None,
        "unprivileged_uid": host.can_drop_privileges(),
        "landlock": host.landlock_abi() > 0,
        "rlimits": True,
        "rlimit_nproc": host.can_drop_privileges(),
        "wall_clock": True,
        "audit_hook": True,
    }


def run_python(
    code: str, limits: SandboxLimits | None = None, *, audit_hook: bool = True, landlock: bool = True
) -> SandboxResult:
    """Run ``code`` in the sandbox and collect what it did.

    Args:
        code: Python source, run as ``__main__``.
        limits: Limits; the defaults when omitted.
        audit_hook: Install the audit hook. Only tests turn it off, to check the kernel layers alone.
        landlock: Restrict filesystem changes with Landlock where the kernel has it. Only tests turn
            it off, to check the other layers alone.

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
    uid = host.UIDS.acquire() if host.can_drop_privileges() else None
    status_r, status_w = host.status_pipe()
    try:
        if uid is not None:
            os.chown(scratch, uid, uid)
        rlimits = host.rlimits(
            cpu_s=lim.cpu_s,
            memory_mb=lim.memory_mb,
            file_size_mb=lim.file_size_mb,
            max_processes=lim.max_processes,
            nproc=uid is not None,
        )
        cfg = {
            "scratch": str(scratch.resolve()),
            "code_path": str(run_dir / "code.py"),
            "status_fd": status_w,
            "rlimits": rlimits,
            "audit_hook": audit_hook,
            "landlock": landlock and host.landlock_abi() > 0,
        }
        ran = host.execute(
            host.child_argv(uid, cfg),
            host.child_env(scratch),
            scratch,
            (status_r, status_w),
            timeout_s=lim.timeout_s,
            capture_bytes=lim.output_chars * 4,  # enough for output_chars characters of UTF-8
        )
    finally:
        os.close(status_r)
        if uid is not None:
            host.kill_uid(uid)
            host.UIDS.release(uid)
        shutil.rmtree(run_dir, ignore_errors=True)
    return _result(ran, lim)


def _result(ran: host.ChildRun, lim: SandboxLimits) -> SandboxResult:
    """Interpret a finished run: why it was stopped, if it was, and what the hook refused."""
    status = ran.status
    blocked = tuple(dict.fromkeys(s.split("\t", 1)[1] for s in status if s.startswith("blocked\t")))
    code, killed = ran.exit_code, None
    if ran.timed_out:
        killed = f"wall-clock timeout of {lim.timeout_s:g} s exceeded"
    elif code in (-signal.SIGXCPU, -signal.SIGKILL):  # SIGKILL not ours: RLIMIT_CPU's hard limit
        killed = f"CPU time limit of {lim.cpu_s} s exceeded"
    elif "memory" in status:
        killed = f"memory limit of {lim.memory_mb} MiB exceeded (MemoryError)"
    elif code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
        killed = f"terminated by signal {name}"
    return SandboxResult(
        stdout=ran.stdout.text(),
        stderr=ran.stderr.text(),
        stdout_bytes=ran.stdout.total,
        stderr_bytes=ran.stderr.total,
        exit_code=code,
        killed=killed,
        blocked=blocked,
        elapsed_s=ran.elapsed_s,
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
