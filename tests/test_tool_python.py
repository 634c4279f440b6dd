"""The python sandbox: every limit is checked with a real escape attempt."""

from __future__ import annotations

import dis
import os
import socket
import stat
import subprocess
import time
import types
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from srt_agent.tooling.parser import parse_tool_calls
from srt_agent.tooling.toolset import ToolSet
from srt_agent.tools.python import (
    MAX_CODE_CHARS,
    SandboxLimits,
    make_python_tool,
    python,
    run_python,
    sandbox_layers,
)
from srt_agent.tools.sandbox_child import make_audit_hook

FAST = SandboxLimits(timeout_s=5, cpu_s=5)
LAYERS = sandbox_layers()
ESCAPE = f"/tmp/srt-escape-{uuid.uuid4().hex}"  # a world-writable place the sandbox must not write to
needs_netns = pytest.mark.skipif(not LAYERS["network_namespace"], reason="no network namespace here")
needs_uid = pytest.mark.skipif(not LAYERS["unprivileged_uid"], reason="parent is not root / no setpriv")


def run(code: str, limits: SandboxLimits = FAST, **kw: bool) -> str:
    return run_python(code, limits, **kw).render(limits.output_chars)


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A TCP server on loopback that the sandbox must never reach."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.setblocking(False)
    yield srv
    srv.close()


def assert_no_connection(srv: socket.socket) -> None:
    # A connection that got through would be waiting in the backlog by now.
    with pytest.raises(BlockingIOError):
        srv.accept()


# -- ordinary behaviour ---------------------------------------------------------------------------------


def test_prints_stdout_and_labels_stderr() -> None:
    out = run("import sys\nprint('hello', 6 * 7)\nprint('oops', file=sys.stderr)")
    assert out == "hello 42\n[stderr]\noops"


def test_no_output_and_exit_code() -> None:
    assert run("x = 1") == "(no output)"
    assert run("import sys; sys.exit(3)") == "exit code: 3"


def test_syntax_error_is_reported_without_sandbox_frames() -> None:
    out = run("print(")
    assert "SyntaxError" in out and 'File "<code>", line 1' in out
    assert out.endswith("exit code: 1")
    assert "<sandbox>" not in out and "_child_main" not in out
    assert "sandbox_child" not in out


def test_traceback_shows_user_source_lines() -> None:
    out = run("def f():\n    return 1 / 0\nf()")
    assert "ZeroDivisionError: division by zero" in out
    assert "return 1 / 0" in out and 'File "<code>", line 2, in f' in out


def test_stdin_is_empty_and_environment_is_minimal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SRT_TEST_SECRET", "hunter2")
    out = run("import os, sys\nprint(repr(sys.stdin.read()))\nprint(sorted(os.environ))")
    first, env_line = out.splitlines()
    assert first == "''"
    assert "SRT_TEST_SECRET" not in env_line and "hunter2" not in out
    assert "'HOME'" in env_line


def test_standard_library_and_asyncio_work() -> None:
    code = (
        "import asyncio, json, fractions, sqlite3\n"
        "async def f():\n    await asyncio.sleep(0)\n    return 2\n"
        "db = sqlite3.connect(':memory:')\n"
        "print(asyncio.run(f()), json.dumps([fractions.Fraction(1, 3).denominator]),"
        " db.execute('select 5').fetchone()[0])"
    )
    assert run(code) == "2 [3] 5"


def test_scratch_dir_is_cwd_home_and_deleted_afterwards() -> None:
    out = run(
        "import os, tempfile\n"
        "open('notes.txt', 'w').write('kept for this run')\n"
        "with tempfile.NamedTemporaryFile(dir=None) as f: pass\n"
        "print(os.getcwd()); print(os.environ['HOME']); print(open('notes.txt').read())"
    )
    cwd, home, text = out.splitlines()
    assert cwd == home and text == "kept for this run"
    assert not Path(cwd).exists()


def test_output_truncated_to_limit() -> None:
    lim = SandboxLimits(output_chars=500)
    out = run("print('x' * 100_000)\nimport sys\nprint('tail-marker', file=sys.stderr)", lim)
    assert len(out) < 700
    assert "[stdout truncated: 100001 bytes in all]" in out
    assert out.rstrip().endswith("tail-marker")


def test_code_size_limit() -> None:
    with pytest.raises(ValueError, match="limit"):
        run_python("#" * (MAX_CODE_CHARS + 1))


# -- limits ---------------------------------------------------------------------------------------------


def test_wall_clock_kills_infinite_loop_and_keeps_earlier_output() -> None:
    t0 = time.monotonic()
    res = run_python("print('started')\nwhile True: pass", SandboxLimits(timeout_s=1, cpu_s=30))
    assert time.monotonic() - t0 < 4
    text = res.render(1000)
    assert text.startswith("started") and "killed: wall-clock timeout of 1 s exceeded" in text


def test_wall_clock_kills_sleeper_and_its_process_group() -> None:
    res = run_python("import time\ntime.sleep(60)", SandboxLimits(timeout_s=0.5))
    assert res.killed == "wall-clock timeout of 0.5 s exceeded" and res.elapsed_s < 3


def test_cpu_limit_kills_spin_before_wall_clock() -> None:
    t0 = time.monotonic()
    out = run("while True: pass", SandboxLimits(timeout_s=10, cpu_s=1))
    assert "killed: CPU time limit of 1 s exceeded" in out
    assert time.monotonic() - t0 < 5


def test_memory_bomb_fails_inside_the_sandbox() -> None:
    out = run("data = bytearray(2 * 1024**3)\nprint('allocated')")
    assert "allocated" not in out and "MemoryError" in out
    assert "killed: memory limit of 256 MiB exceeded (MemoryError)" in out


def test_gradual_memory_growth_hits_the_limit() -> None:
    out = run("chunks = []\nwhile True:\n    chunks.append(bytearray(16 * 1024 * 1024))")
    assert "memory limit of 256 MiB exceeded" in out


def test_file_size_limit() -> None:
    out = run("open('big.bin', 'wb').write(b'x' * (3 * 1024 * 1024))", SandboxLimits(file_size_mb=1))
    assert "File too large" in out


# -- escapes the audit hook blocks ----------------------------------------------------------------------


def test_write_outside_scratch_is_blocked(tmp_path: Path) -> None:
    target = tmp_path / "escape.txt"
    tmp_path.chmod(0o777)  # world-writable, so only the hook stands in the way
    out = run(f"open({str(target)!r}, 'w').write('escaped')")
    assert "blocked by sandbox: writing outside the scratch directory" in out
    assert not target.exists()


@pytest.mark.parametrize(
    "code",
    [
        "open('../escape.txt', 'w')",
        "import os; os.rename('x', '../escape.txt')",
        "import os; os.symlink('/tmp', 'link')",
        "import os; fd = os.open('/tmp', os.O_RDONLY)",
        f"import shutil; shutil.copyfile('/etc/hostname', '{ESCAPE}.txt')",
        f"import sqlite3; sqlite3.connect('{ESCAPE}.db')",
    ],
)
def test_other_filesystem_escapes_are_blocked(code: str) -> None:
    if "rename" in code:
        code = "open('x', 'w').close()\n" + code
    assert "blocked by sandbox:" in run(code)
    assert not Path(f"{ESCAPE}.txt").exists() and not Path(f"{ESCAPE}.db").exists()


def test_file_operations_inside_scratch_work() -> None:
    code = (
        "import os, shutil\n"
        "os.makedirs('a/b'); open('a/b/f.txt', 'w').write('1')\n"
        "os.rename('a/b/f.txt', 'a/g.txt'); shutil.copytree('a', 'c'); shutil.rmtree('a')\n"
        "print(sorted(os.listdir('.')), open('c/g.txt').read())"
    )
    assert run(code) == "['c'] 1"


def test_network_connect_is_blocked(listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    out = run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)")
    assert "blocked by sandbox: network access" in out
    assert_no_connection(listener)


def test_name_resolution_is_blocked() -> None:
    out = run("import socket\nsocket.getaddrinfo('localhost', 80)")
    assert "blocked by sandbox: network access (socket.getaddrinfo)" in out


# A bounded fork bomb, so that a broken hook could not take the test machine down.
FORK_BOMB = "import os\nfor _ in range(3):\n    if os.fork() == 0:\n        os._exit(0)\nprint('hi')"


@pytest.mark.parametrize(
    ("code", "event"),
    [
        ("import os\nos.system('echo hi')", "os.system"),
        ("import subprocess\nsubprocess.run(['echo', 'hi'])", "subprocess.Popen"),
        ("import os\nos.execv('/bin/echo', ['echo', 'hi'])", "os.exec"),
        (FORK_BOMB, "os.fork"),
        ("import _posixsubprocess\n_posixsubprocess.fork_exec()", "_posixsubprocess.fork_exec"),
        ("import ctypes", "import"),
        ("import os\nos.pidfd_open(1)", "os.pidfd_open"),
    ],
)
def test_process_and_native_escapes_are_blocked(code: str, event: str) -> None:
    out = run(code)
    assert f"({event})" in out and "blocked by sandbox:" in out
    assert "\nhi" not in out and not out.startswith("hi")


def test_signalling_other_processes_is_blocked() -> None:
    victim = subprocess.Popen(["sleep", "30"])
    try:
        out = run(f"import os, signal\nos.kill({victim.pid}, signal.SIGKILL)")
        assert "blocked by sandbox: signalling another process (os.kill)" in out
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


def test_many_blocked_actions_neither_hang_nor_flood_the_output() -> None:
    code = (
        "for i in range(3000):\n"
        "    try:\n        open(f'/etc/x{i}', 'w')\n    except PermissionError:\n        pass\n"
        "print('done')"
    )
    res = run_python(code, FAST)
    text = res.render(FAST.output_chars)
    assert text.startswith("done") and res.killed is None and res.elapsed_s < 4
    assert len(text.splitlines()) == 7 and text.endswith("more actions")


def test_hook_uses_no_global_or_builtin_lookups() -> None:
    # User code can rebind module attributes and builtins; the hook must only use captured cells.
    outer = make_audit_hook.__code__
    todo = [c for c in outer.co_consts if isinstance(c, types.CodeType)]
    assert len(todo) >= 5  # hook, block, resolve, inside, check_write, check_open
    while todo:
        code = todo.pop()
        todo += [c for c in code.co_consts if isinstance(c, types.CodeType)]
        loads = {i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
        assert not loads, f"{code.co_name} looks up {loads} at call time"


def test_rebinding_os_functions_does_not_fool_the_hook(tmp_path: Path) -> None:
    target = tmp_path / "escape.txt"
    tmp_path.chmod(0o777)
    code = f"import os, posixpath\nos.lstat = None\nposixpath.realpath = str\nopen({str(target)!r}, 'w')"
    assert "blocked by sandbox" in run(code)
    assert not target.exists()


# -- kernel layers on their own (audit hook off) -------------------------------------------------------


@needs_netns
def test_network_namespace_alone_blocks_connect(listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    out = run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)", audit_hook=False)
    assert "Network is unreachable" in out or "Connection refused" in out
    assert_no_connection(listener)


@needs_uid
def test_unprivileged_uid_alone_blocks_writes_to_root_owned_dirs(tmp_path: Path) -> None:
    assert stat.S_IMODE(tmp_path.stat().st_mode) & 0o002 == 0
    target = tmp_path / "escape.txt"
    out = run(f"print(__import__('os').getuid())\nopen({str(target)!r}, 'w')", audit_hook=False)
    assert int(out.splitlines()[0]) != os.getuid()
    assert "PermissionError" in out and not target.exists()


@needs_uid
def test_process_limit_alone_stops_fork() -> None:
    code = "import os\npid = os.fork()\nprint('forked')\nif pid == 0:\n    os._exit(0)"
    out = run(code, SandboxLimits(max_processes=1), audit_hook=False)
    assert "forked" not in out and "BlockingIOError" in out


@needs_uid
def test_process_limit_caps_threads() -> None:
    code = (
        "import threading, time\n"
        "ts = [threading.Thread(target=time.sleep, args=(0.5,)) for _ in range(40)]\n"
        "for t in ts: t.start()"
    )
    assert "can't start new thread" in run(code, SandboxLimits(max_processes=8))


def test_hook_and_rlimits_alone_still_contain_the_code(
    monkeypatch: pytest.MonkeyPatch, listener: socket.socket, tmp_path: Path
) -> None:
    # What a machine without unshare/setpriv (or a non-root parent) gets.
    import srt_agent.tools.sandbox_host as host

    monkeypatch.setattr(host, "netns_prefix", lambda: None)
    monkeypatch.setattr(host, "can_drop_privileges", lambda: False)
    target = tmp_path / "escape.txt"
    port = listener.getsockname()[1]
    code = (
        f"import os\nprint(os.getuid())\nopen('inside.txt', 'w').write('ok')\n"
        f"try:\n    open({str(target)!r}, 'w')\nexcept PermissionError as e:\n    print('denied')\n"
        f"import socket\nsocket.create_connection(('127.0.0.1', {port}))"
    )
    out = run(code)
    assert out.splitlines()[:2] == [str(os.getuid()), "denied"]
    assert "blocked by sandbox: network access" in out and not target.exists()
    assert_no_connection(listener)
    assert "MemoryError" in run("bytearray(2 * 1024**3)")


def test_concurrent_runs_are_independent() -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda i: run(f"import os\nprint({i}, os.getcwd())"), range(8)))
    assert [r.split()[0] for r in results] == [str(i) for i in range(8)]
    assert len({r.split()[1] for r in results}) == 8  # a scratch directory each


def test_layers_report() -> None:
    assert LAYERS["audit_hook"] and LAYERS["rlimits"] and LAYERS["wall_clock"]
    assert LAYERS["rlimit_nproc"] == LAYERS["unprivileged_uid"]


# -- through the tool set -------------------------------------------------------------------------------


def test_tool_timeout_leaves_room_for_the_sandbox_clock() -> None:
    lim = SandboxLimits(timeout_s=2)
    assert make_python_tool(lim).timeout > lim.timeout_s
    assert python.timeout > SandboxLimits().timeout_s
    assert "2 s wall clock" in make_python_tool(lim).description


def test_toolset_runs_calls_and_reports_errors_as_messages() -> None:
    tools = ToolSet([make_python_tool(SandboxLimits(timeout_s=1))])
    huge = "#" * (MAX_CODE_CHARS + 1)
    text = (
        '<tool_call>{"name": "python", "arguments": {"code": "print(2 ** 10)"}}</tool_call>'
        '<tool_call>{"name": "python", "arguments": {"code": "while True: pass"}}</tool_call>'
        '<tool_call>{"name": "python", "arguments": {"source": "1"}}</tool_call>'
        '<tool_call>{"name": "python", "arguments": {"code": "' + huge + '"}}</tool_call>'
    )
    ok, slow, bad_args, too_long = tools.execute(parse_tool_calls(text))
    assert ok.ok and ok.content == "1024"
    assert slow.ok and "killed: wall-clock timeout of 1 s exceeded" in slow.content
    assert bad_args.error == "invalid_arguments" and bad_args.content.startswith("Error (invalid_arguments)")
    assert too_long.error == "error" and too_long.content.startswith("Error (error): ValueError")


async def _aexecute(tools: ToolSet, text: str) -> list[str]:
    return [r.content for r in await tools.aexecute(parse_tool_calls(text))]


def test_toolset_async_path() -> None:
    import asyncio

    text = '<tool_call>{"name": "python", "arguments": {"code": "import os; os.fork()"}}</tool_call>'
    (content,) = asyncio.run(_aexecute(ToolSet([python]), text))
    assert "blocked by sandbox: process creation (os.fork)" in content


# -- Landlock: filesystem changes outside scratch refused by the kernel ---------------------------------

needs_landlock = pytest.mark.skipif(not LAYERS["landlock"], reason="no Landlock in this kernel")

# Writes that raise no audit event (C code) or that the hook would not see: each must leave nothing.
ESCAPES = {
    "sqlite-attach": "import sqlite3\nc = sqlite3.connect(':memory:')\n"
    "c.execute(\"ATTACH DATABASE '{target}' AS x\")\nc.execute('CREATE TABLE x.t (a)')\nc.commit()",
    "sqlite-vacuum": "import sqlite3\nc = sqlite3.connect(':memory:')\nc.execute('CREATE TABLE t (a)')\n"
    "c.execute(\"VACUUM INTO '{target}'\")",
    "readline": "import readline\nreadline.add_history('x')\nreadline.write_history_file('{target}')",
    "open": "open('{target}', 'w').write('x')",
}


@needs_landlock
@pytest.mark.parametrize("audit_hook", [True, False], ids=["hook", "kernel-only"])
@pytest.mark.parametrize("case", list(ESCAPES))
@pytest.mark.parametrize("where", ["/tmp", "/dev/shm"])
def test_writes_outside_scratch_are_refused_by_the_kernel(case: str, where: str, audit_hook: bool) -> None:
    if not Path(where).is_dir():
        pytest.skip(f"no {where} here")
    target = Path(where) / f"srt-escape-{uuid.uuid4().hex}.db"
    try:
        out = run(ESCAPES[case].format(target=target), audit_hook=audit_hook)
        assert not target.exists(), out
        assert "Error" in out or "blocked by sandbox" in out, out
    finally:
        target.unlink(missing_ok=True)


@needs_landlock
def test_scratch_stays_writable_and_is_removed_afterwards() -> None:
    code = (
        "import os, sqlite3\nopen('a.txt', 'w').write('x')\nos.mkdir('d')\nos.rename('a.txt', 'd/b.txt')\n"
        "c = sqlite3.connect('db.sqlite')\nc.execute('CREATE TABLE t (a)')\nc.commit()\n"
        "print(sorted(os.listdir('.')), os.getcwd())\nopen('/dev/null', 'w').write('fine')"
    )
    out = run(code, audit_hook=False)
    assert "['d', 'db.sqlite']" in out, out
    scratch = out.split("]", 1)[1].split()[0]
    assert not Path(scratch).exists()  # the run's folder is gone
