"""Running user code (an env's reset and step, a tool) under a deadline, so that it cannot hold a batch.

Two containers, by how much the code is trusted:

* a **thread** of its own (:func:`run_in_thread`, :func:`await_in_thread`): cheap (~0.1 ms), shares
  the process's memory. At the deadline the caller gets :class:`CallTimeout` and goes on; the thread
  is abandoned and asked to stop (:func:`stop_thread`), which ends a Python loop at once but a single
  C call (a sleep, a huge integer power) only when that call returns.
* a **process** (:func:`run_in_process`): a worker process, reused between calls (about a millisecond
  a call once started) and killed at the deadline, whatever it is doing. For code that may spin
  inside native code or must not share memory.

Threads are daemons, not an executor's workers: an executor joins its workers at interpreter exit,
so one hung call would hang the exit, and a pool of them would run out of workers.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import importlib
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

from srt_agent.errors import FAULTS, SrtAgentError, describe_fault

__all__ = [
    "CallTimeout",
    "RemoteError",
    "Worker",
    "WorkerDied",
    "await_in_thread",
    "describe_exit",
    "remote_error",
    "run_in_process",
    "run_in_thread",
    "shutdown_workers",
    "stop_thread",
]


class CallTimeout(SrtAgentError, TimeoutError):
    """The call did not finish within its deadline (it was abandoned, or its process killed)."""


class RemoteError(SrtAgentError, RuntimeError):
    """The code raised in its process, or the process died; the message describes what happened.

    Attributes:
        original: What the code raised, when it could be sent back (``None``: the process died, or
            the exception does not pickle).
    """

    def __init__(self, message: str, original: BaseException | None = None) -> None:
        super().__init__(message)
        self.original = original


class WorkerDied(RemoteError):
    """The worker process ended during a call: a crash (a signal), an exit, or a kill.

    Attributes:
        exit_code: The process's return code (negative: the signal that ended it).
    """

    def __init__(self, exit_code: int | None) -> None:
        super().__init__(f"its process died ({describe_exit(exit_code)})")
        self.exit_code = exit_code


def describe_exit(code: int | None) -> str:
    """How a process ended, for a person: ``"killed by signal 11 (SIGSEGV)"`` or ``"exit code 3"``."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown signal"
        return f"killed by signal {-code} ({name})"
    return f"exit code {code}"


def stop_thread(thread: threading.Thread) -> None:
    """Ask an abandoned thread to stop: raise ``SystemExit`` in it at its next bytecode.

    A Python thread cannot be killed, but the interpreter can raise an exception in it. Code
    spinning in Python stops at once; code blocked inside one C call stops when that call returns.
    Without this, timed-out calls go on using the CPU (four spinning ones made a process several
    times slower).
    """
    ident = thread.ident
    if ident is None or not thread.is_alive():
        return
    hit = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(SystemExit))
    if hit > 1:  # cannot happen for one live thread id; undo rather than hit another thread
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), None)


def run_in_thread(fn: Callable[[], Any], timeout: float | None, *, name: str = "srt-call") -> Any:
    """Run ``fn`` in a daemon thread of its own and wait at most ``timeout`` seconds (``None``: no limit).

    Returns:
        What ``fn`` returned; what it raised is raised here.

    Raises:
        CallTimeout: ``fn`` was still running at the deadline (its thread is asked to stop).
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True, name=name)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        stop_thread(thread)
        raise CallTimeout(f"did not finish within {timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


async def await_in_thread(fn: Callable[[], Any], timeout: float | None, *, name: str = "srt-call") -> Any:
    """Async :func:`run_in_thread`: the event loop runs on while ``fn`` does.

    Cancelling the awaiting task abandons the thread as a timeout does (and asks it to stop).
    """
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if fut.done():
            return
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(value)

    def target() -> None:
        try:
            value = fn()
        except BaseException as exc:  # noqa: BLE001 - delivered to the awaiting coroutine
            error: BaseException | None = exc
            value = None
        else:
            error = None
        with contextlib.suppress(RuntimeError):  # the loop closed while fn ran: nobody waits
            loop.call_soon_threadsafe(settle, value, error)

    thread = threading.Thread(target=target, daemon=True, name=name)
    thread.start()
    try:
        return await asyncio.wait_for(fut, timeout)  # a timeout cancels fut: settle() ignores it then
    except asyncio.TimeoutError:
        stop_thread(thread)
        raise CallTimeout(f"did not finish within {timeout:g} s") from None
    except asyncio.CancelledError:
        stop_thread(thread)
        raise


# ---------------------------------------------------------------------------------------- processes
# Calls run in worker processes of our own (``python -c``), not multiprocessing's: spawn and
# forkserver re-import the parent's ``__main__`` in each child (a user's script, pytest, the CLI),
# and fork is unsafe in a process with threads (engine, envs, torch). A worker serves one call at a
# time over its stdin/stdout and is reused, so its imports are paid once; a call that overruns its
# deadline or kills its worker costs that worker only (a new one starts on demand).

_MAX_IDLE = 4
_IMPORT_TIMEOUT_S = 120.0
_MAX_CALLS = 200  # a worker is retired after this many calls, so leaks in user code stay bounded
_HEADER = struct.Struct("!Q")


def _write_frame(fd: int, payload: bytes) -> None:
    data = _HEADER.pack(len(payload)) + payload
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_exact(fd: int, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError("the worker closed its pipe")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _read_frame(fd: int) -> bytes:
    (size,) = _HEADER.unpack(_read_exact(fd, _HEADER.size))
    return _read_exact(fd, size)


def _worker_main() -> None:
    """A worker's loop: read a pickled call, run it, reply ``("ok", value)`` or ``("error", (text, exc))``.

    ``exc`` is what the call raised when it pickles (so the caller can raise the same type), else
    ``None``.

    Frames go over a private copy of stdout; fd 1 then points at stderr, so what the code prints
    cannot corrupt a reply.
    """
    replies = os.dup(1)
    os.dup2(2, 1)
    while True:
        try:
            request = _read_frame(0)
        except EOFError:  # the parent closed our stdin (shutdown) or died
            return
        try:
            kind, body = pickle.loads(request)
            if kind == "import":  # warm-up before the deadline starts: the modules the call needs
                for module in body:
                    importlib.import_module(module)
                reply: tuple[str, Any] = ("ok", None)
            else:
                reply = ("ok", body())
        except FAULTS as exc:
            reply = ("error", (describe_fault(exc), _pickled_or_none(exc)))
        try:
            payload = pickle.dumps(reply)
        except FAULTS as exc:  # the value (or the exception) cannot be pickled: say so instead
            text = f"the result could not be sent back: {describe_fault(exc)}"
            payload = pickle.dumps(("error", (text, None)))
        _write_frame(replies, payload)


def _pickled_or_none(exc: BaseException) -> bytes | None:
    """``exc`` pickled, or ``None`` if it does not pickle (then only its text travels)."""
    try:
        return pickle.dumps(exc)
    except FAULTS:
        return None


def _unpickled_or_none(data: bytes | None) -> BaseException | None:
    """The exception a worker sent, or ``None`` if this process cannot rebuild it.

    It cannot when its class is not importable here, or its constructor takes other arguments than
    its ``args``.
    """
    if data is None:
        return None
    try:
        exc = pickle.loads(data)
    except FAULTS:
        return None
    return exc if isinstance(exc, BaseException) else None


def remote_error(payload: tuple[str, bytes | None]) -> RemoteError:
    """The :class:`RemoteError` of an ``("error", payload)`` reply, carrying the original if it rebuilds."""
    text, data = payload
    return RemoteError(text, _unpickled_or_none(data))


class Worker:
    """One worker process and its pipes.

    :func:`run_in_process` uses them for one call at a time; the env processes
    (:mod:`srt_agent.rollout.env_processes`) keep one env in a worker between calls.
    """

    def __init__(self) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from srt_agent.isolation import _worker_main; _worker_main()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.calls = 0
        self.imported: set[str] = set()

    def prepare(self, modules: tuple[str, ...]) -> None:
        """Import ``modules`` in the worker, with no deadline of the call's (start-up is not the call's)."""
        missing = tuple(m for m in modules if m not in self.imported)
        if missing:
            status, payload = self.call(pickle.dumps(("import", missing)), _IMPORT_TIMEOUT_S)
            if status != "ok":
                raise RemoteError(f"the worker could not import {', '.join(missing)}: {payload[0]}")
            self.imported.update(missing)

    def call(self, request: bytes, timeout: float | None) -> tuple[str, Any]:
        """Send one pickled request; its ``(status, payload)`` reply.

        Raises:
            CallTimeout: No reply within ``timeout`` (the caller kills the worker).
            WorkerDied: The process ended (the message says how: a signal, an exit code).
        """
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.calls += 1
        try:
            _write_frame(self.proc.stdin.fileno(), request)
        except OSError:
            raise WorkerDied(self._exit_code()) from None
        out = self.proc.stdout.fileno()
        ready, _, _ = select.select([out], [], [], timeout)
        if not ready:
            raise CallTimeout(f"did not finish within {timeout:g} s; its process was killed")
        try:
            status, payload = pickle.loads(_read_frame(out))
        except (EOFError, OSError, pickle.UnpicklingError):
            raise WorkerDied(self._exit_code()) from None
        return status, payload

    def _exit_code(self) -> int | None:
        try:
            return self.proc.wait(5)
        except subprocess.TimeoutExpired:  # the pipe broke but the process lives on: end it
            self.proc.kill()
            return self.proc.wait()

    def kill(self) -> None:
        """End the process (if alive), reap it and close its pipes."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


_idle: list[Worker] = []
_idle_lock = threading.Lock()


def run_in_process(fn: Callable[[], Any], timeout: float | None, *, imports: tuple[str, ...] = ()) -> Any:
    """Run ``fn`` in a worker process and wait at most ``timeout`` seconds; kill the worker at the deadline.

    ``fn`` and its result must pickle (a module-level function, or a ``functools.partial`` of one);
    keep the result small (shorten it in ``fn``). The first call starts a worker (~0.3 s plus the
    imports ``fn`` needs); later calls reuse idle workers (about a millisecond of overhead).
    ``imports`` are imported in the worker before the deadline starts, so a cold worker's start-up
    does not count against the call.

    Raises:
        CallTimeout: The call was still running at the deadline; its worker has been killed.
        RemoteError: ``fn`` raised (the message is its ``"<Type>: <message>"``), could not be sent,
            or its worker died.
    """
    try:
        request = pickle.dumps(("call", fn))
    except FAULTS as exc:
        raise RemoteError(f"cannot run in a process: {describe_fault(exc)}") from None
    with _idle_lock:
        worker = _idle.pop() if _idle else None
    worker = worker or Worker()
    healthy = False
    try:
        worker.prepare(imports)
        status, payload = worker.call(request, timeout)
        healthy = True
    finally:
        with _idle_lock:
            keep = healthy and worker.calls < _MAX_CALLS and len(_idle) < _MAX_IDLE
            if keep:
                _idle.append(worker)
        if not keep:
            worker.kill()
    if status != "ok":
        raise remote_error(payload)
    return payload


def shutdown_workers() -> None:
    """Stop the idle worker processes (also done at exit); later calls start new ones."""
    with _idle_lock:
        workers, _idle[:] = list(_idle), []
    for worker in workers:
        worker.kill()


atexit.register(shutdown_workers)
