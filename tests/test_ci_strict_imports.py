"""``--require-imports`` (tests/conftest.py): what keeps a CI tier from passing by skipping."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent

PROBE = """
import pytest

pytest.importorskip("no_such_module_srt.sub", reason="the probe's package")
json = pytest.importorskip("json")


def test_probe():
    assert json.dumps(1) == "1"
"""


def _pytest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    probe = tmp_path / "test_probe.py"
    probe.write_text(PROBE)
    env = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "conftest",
        "-p",
        "no:cacheprovider",
        "-q",
        *args,
        str(probe),
    ]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.timeout(300)
def test_a_missing_import_skips_by_default_and_fails_where_required(tmp_path: Path) -> None:
    # A module-level skip leaves no test to run: pytest's exit 5, "1 skipped".
    plain = _pytest(tmp_path)
    assert plain.returncode == 5 and "1 skipped" in plain.stdout, plain.stdout
    strict = _pytest(tmp_path, "--require-imports")
    assert strict.returncode != 0 and "no_such_module_srt.sub must import in this tier" in strict.stdout
    assert "the probe's package" in strict.stdout
    named = _pytest(tmp_path, "--require-imports-of=ray,no_such_module_srt")  # a top-level name covers it
    assert named.returncode != 0 and "must import in this tier" in named.stdout
    other = _pytest(tmp_path, "--require-imports-of=ray")  # not named: still an honest skip
    assert other.returncode == 5 and "1 skipped" in other.stdout, other.stdout
