import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.parametrize("script", ["custom_env.py", "custom_tool.py"])
def test_example_runs(script: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / script)], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    if script == "custom_env.py":
        assert "reward=1.0 turns=2" in proc.stdout
    else:
        assert "call_0 word_count: 2" in proc.stdout and "Error (timeout)" in proc.stdout
