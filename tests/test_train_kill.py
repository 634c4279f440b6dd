"""``kill -9`` a real ``srt-agent train`` process after its first checkpoint, then ``--resume`` it.

Marked slow (about 20 s: two CLI processes pay the torch/transformers import, plus the run). The
fast in-process variants (a crash mid-write, half-written directories, resume equivalence) are in
``test_train_checkpoint.py``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from train_fixtures import save_tiny_policy, tiny_settings, write_config

from srt_agent.train import latest_checkpoint
from srt_agent.train.metrics_log import read_records

STEPS = 8
CLI = [sys.executable, "-c", "from srt_agent.cli import main; main()", "train"]


@pytest.mark.slow
def test_sigkill_at_any_moment_then_resume_finishes_the_run(tmp_path: Path) -> None:
    model_dir = save_tiny_policy(tmp_path / "model")
    out = tmp_path / "run"
    config = write_config(
        tmp_path / "tiny.yaml", tiny_settings(model_dir, out, trainer={"steps": STEPS, "checkpoint_every": 1})
    )
    log = (tmp_path / "first.log").open("w")
    proc = subprocess.Popen([*CLI, str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while latest_checkpoint(out) is None:
            assert proc.poll() is None, (tmp_path / "first.log").read_text()
            assert time.monotonic() < deadline, "no checkpoint within 90 s"
            time.sleep(0.01)
        time.sleep(random.uniform(0.0, 0.3))  # land anywhere: mid-step, mid-rollout or mid-checkpoint
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
        log.close()
    assert proc.returncode == -signal.SIGKILL
    killed_at = latest_checkpoint(out)
    assert killed_at is not None and 1 <= killed_at.step < STEPS, "the run finished before the kill"

    summary_path = tmp_path / "summary.json"
    done = subprocess.run(
        [*CLI, str(config), "--resume", "--json", str(summary_path)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"resuming from step {killed_at.step}" in done.stdout
    summary = json.loads(summary_path.read_text())
    assert summary["resumed_from"] == killed_at.step and summary["steps"] == STEPS
    assert summary["success_before"] is not None and summary["success_after"] is not None
    steps = [r["step"] for r in read_records(out / "metrics.jsonl") if r.get("kind") == "step"]
    assert steps == list(range(1, STEPS + 1))  # each step once: the one in flight was redone
    final = latest_checkpoint(out)
    assert final is not None and final.step == STEPS
    assert not [p for p in (out / "checkpoints").iterdir() if p.name.startswith(".")]
